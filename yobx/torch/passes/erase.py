"""Erasure of a node together with the predecessors only it was using."""

from __future__ import annotations

from torch.fx import Graph, Node

from .aliasing import has_side_effect


def _removable(node: Node) -> bool:
    """Tells if a node without users can go: no side effect and not part of the signature."""
    return not node.users and not has_side_effect(node)


def graph_erase_node(graph: Graph, node: Node) -> int:
    """Erases a node and every predecessor that was used only by it (transitively).

    Placeholders, nodes still used by other nodes and nodes with a side effect are kept:
    in-place methods and functions (``x.add_(1)`` recorded as ``call_method`` included),
    ``setitem``, ``copy_``, ``out=``, module calls which may mutate, runtime checks and
    anything :meth:`torch.fx.Node.is_impure` reports
    (see :func:`yobx.torch.passes.aliasing.has_side_effect`).

    :param graph: graph owning ``node``
    :param node: node to erase, it must have no users and no side effect
    :return: number of erased nodes
    :raises ValueError: ``node`` belongs to another graph, still has users, is a
        placeholder or the output, or has a side effect

    Example::

        >>> import operator, torch
        >>> from yobx.torch.passes import graph_erase_node
        >>> graph = torch.fx.Graph()
        >>> x = graph.placeholder("x")
        >>> dead = graph.call_function(operator.mul, (graph.call_function(operator.add, (x, 1)), 2))
        >>> _ = graph.output(x)
        >>> graph_erase_node(graph, dead)
        2
    """
    if node.graph is not graph:
        raise ValueError(f"node {node.name!r} does not belong to this graph")
    if node.users:
        users = ", ".join(u.name for u in node.users)
        raise ValueError(f"node {node.name!r} is still used by {users}")
    if node.op in ("placeholder", "output"):
        raise ValueError(f"node {node.name!r} is a {node.op} and cannot be erased")
    if has_side_effect(node):
        raise ValueError(
            f"node {node.name!r} ({node.op} {node.target}) has a side effect and cannot be "
            "erased; use graph.erase_node to remove it anyway"
        )
    return erase_with_inputs(graph, node)


def erase_with_inputs(graph: Graph, node: Node) -> int:
    """Erases ``node`` (its caller proved it useless) and its predecessors used only by it
    and free of side effects."""
    erased = 0
    stack = [node]
    seen: set[Node] = set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        inputs = list(current.all_input_nodes)
        graph.erase_node(current)
        erased += 1
        stack.extend(i for i in inputs if i not in seen and _removable(i))
    return erased
