"""Nodes only one side of an ``If`` reads, moved into that side.

onnxruntime computes every value a branch of an ``If`` reads from the enclosing graph
before it runs the ``If``, whichever branch the condition then takes. A value only one
branch needs is then computed for nothing on the other side. A decode step exported
with its versions has many: after :mod:`.gqa_fusion`, the queries, keys and values
split into heads and transposed are read only by the side of each layer's ``If`` that
runs the model's own attention (a prompt); one token runs ``GroupQueryAttention`` on the
projections themselves, and still paid for the split (six nodes per layer).

:func:`sink_into_branches` moves a node into the branch of an ``If`` when everything
that reads its outputs is in that branch (at any depth) and none is an output of the
graph, the last nodes first, so that a chain of nodes goes in together; then it does
the same in the branches, for the ``If`` nodes nested there. Only ``If`` branches: a
``Loop`` or ``Scan`` body runs once per iteration. A node reading a weight (a constant
of rank 2 or more) stays where it is: onnxruntime prepacks a weight and quantizers find
its product only in the main graph. The rewrite holds by construction:
the branch computes the same values from the same inputs, and the other branch never
read them.
"""

from __future__ import annotations

import onnx_ir as ir

_BRANCHES = ("then_branch", "else_branch")


def sink_into_branches(model: ir.Model) -> int:
    """Moves the nodes of ``model``'s graphs that only one branch of an ``If`` reads
    into that branch (see the module's documentation); returns how many moved."""
    return _sink_in(model.graph)


def _owners(graph: ir.Graph) -> dict[int, tuple[ir.Node, str | None]]:
    """For each node of ``graph`` and of its subgraphs (at any depth), by id: the node of
    ``graph`` it is or is inside, and the attribute of the subgraph (None for a node of
    ``graph`` itself)."""
    owners: dict[int, tuple[ir.Node, str | None]] = {}
    for node in graph:
        owners[id(node)] = (node, None)
        for name, attribute in node.attributes.items():
            if attribute.type == ir.AttributeType.GRAPH:
                subgraphs = [attribute.value]
            elif attribute.type == ir.AttributeType.GRAPHS:
                subgraphs = list(attribute.value)
            else:
                continue
            for subgraph in subgraphs:
                for inner in ir.traversal.RecursiveGraphIterator(subgraph):
                    owners[id(inner)] = (node, name)
    return owners


def _reads_a_weight(node: ir.Node) -> bool:
    return any(
        value is not None
        and (value.const_value is not None or value.is_initializer())
        and value.shape is not None
        and len(value.shape) >= 2
        for value in node.inputs
    )


def _destination(
    node: ir.Node, owners: dict[int, tuple[ir.Node, str | None]]
) -> tuple[ir.Node, str] | None:
    """The ``If`` of the graph and its branch where everything reading ``node`` is."""
    if _reads_a_weight(node):
        return None
    places = set()
    for value in node.outputs:
        if value.is_graph_output():
            return None
        for use in value.uses():
            owner = owners.get(id(use.node))
            if owner is None:
                return None
            places.add((id(owner[0]), owner[1]))
            if len(places) > 1:
                return None
            place = owner
    if not places or place[1] not in _BRANCHES:
        return None
    target, branch = place
    if target.op_type != "If" or target.domain not in ("", "ai.onnx"):
        return None
    return target, branch


def _sink_in(graph: ir.Graph) -> int:
    owners = _owners(graph)
    moved = 0
    touched: dict[int, ir.Graph] = {}
    #: the node names of each branch a node moved into
    names: dict[int, set[str]] = {}
    for node in reversed(list(graph)):
        destination = _destination(node, owners)
        if destination is None:
            continue
        target, branch_name = destination
        branch = target.attributes[branch_name].value
        taken = names.setdefault(id(branch), {n.name for n in branch if n.name})
        if node.name in taken:
            # names are unique within a graph only: onnxruntime refuses two nodes of
            # one graph sharing one (fuzz_branch_merging seed 8518: two named `node`)
            node.name = _unique(node.name, taken)
        if node.name:
            taken.add(node.name)
        graph.remove(node)
        # first: its inputs come from enclosing graphs, its users are later
        if len(branch):
            branch.insert_before(branch[0], node)
        else:
            branch.append(node)
        owners[id(node)] = (target, branch_name)
        touched[id(branch)] = branch
        moved += 1
    for branch in touched.values():
        branch.sort()
    for node in graph:
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                moved += _sink_in(attribute.value)
            elif attribute.type == ir.AttributeType.GRAPHS:
                moved += sum(_sink_in(subgraph) for subgraph in attribute.value)
    return moved


def _unique(name: str, taken: set[str]) -> str:
    """``name`` followed by the first number that makes it a name not in ``taken``."""
    number = 1
    while f"{name}_{number}" in taken:
        number += 1
    return f"{name}_{number}"


__all__ = ["sink_into_branches"]
