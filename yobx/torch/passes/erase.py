"""Erasure of a node together with the predecessors only it was using."""

from __future__ import annotations

from torch.fx import Graph, Node


def _removable(node: Node) -> bool:
    """Tells if a node without users can go: no side effect and not part of the signature."""
    if node.op in ("placeholder", "output") or node.users:
        return False
    return not node.is_impure()


def graph_erase_node(graph: Graph, node: Node) -> int:
    """Erases a node and every predecessor that was used only by it (transitively).

    Placeholders, nodes with side effects (``Node.is_impure``) and nodes still used by
    other nodes are kept.

    :param graph: graph owning ``node``
    :param node: node to erase, it must have no users
    :return: number of erased nodes
    """
    if node.graph is not graph:
        raise ValueError(f"node {node.name!r} does not belong to this graph")
    if node.users:
        users = ", ".join(u.name for u in node.users)
        raise ValueError(f"node {node.name!r} is still used by {users}")
    if node.op in ("placeholder", "output"):
        raise ValueError(f"node {node.name!r} is a {node.op} and cannot be erased")
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
