"""Nodes both sides of an ``If`` compute alike, computed once before it.

:mod:`.branch_merging` keeps a stretch where two versions differ as one ``If``, with the
nodes both sides share inside it, and the fusions for onnxruntime
(:mod:`.gqa_fusion`) then write the same preparation on both sides of the ``If`` of a
layer: a decode step computed, in every layer, the additive mask from the boolean one,
whether a row of it is all masked, and the operator's sequence lengths, on whichever
side ran. Each of these reads only values of the enclosing graph, the same on both
sides: computed before the ``If``, they are the same nodes in every layer, which the
elimination of common subexpressions then computes once for all the layers.

:func:`hoist_out_of_branches` moves a node out of an ``If`` when both branches hold a
node of the same operator, attributes and inputs, every input a value of the enclosing
graph (or of a node moved out before it): one copy goes before the ``If``, the other
side reads it. The innermost ``If`` nodes first, so that what leaves a nested ``If``
can leave the enclosing one too. A node holding a subgraph, or producing an output of
its branch, stays. The rewrite holds by construction: whichever side runs, it computed
that node from the same values; it now reads the same node computed outside, which
runs once either way.
"""

from __future__ import annotations

import onnx_ir as ir

from yobx.torch.onnx.branch_merging import merged_shape, node_key
from yobx.torch.onnx.ort_fusions import graphs_within

_BRANCHES = ("then_branch", "else_branch")


def hoist_out_of_branches(model: ir.Model) -> int:
    """Moves the nodes both branches of an ``If`` compute alike out of it (see the
    module's documentation); returns how many nodes now run outside an ``If`` (one per
    pair)."""
    moved = 0
    # the innermost first (each graph comes before its subgraphs): what leaves a nested
    # If may leave the enclosing one's too
    for graph in reversed(list(graphs_within(model.graph))):
        for node in list(graph):
            if node.op_type == "If" and node.domain in ("", "ai.onnx"):
                moved += _hoist_from(graph, node)
    return moved


def _holds_a_graph(node: ir.Node) -> bool:
    return any(
        attribute.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for attribute in node.attributes.values()
    )


def _movable_key(node: ir.Node, local: set[int], outputs: set[int]) -> tuple | None:
    """The key of ``node`` when it can leave its branch: no subgraph, no output of the
    branch, every input from outside it; None otherwise."""
    if _holds_a_graph(node):
        return None
    if any(id(value) in outputs for value in node.outputs):
        return None
    if any(value is not None and id(value) in local for value in node.inputs):
        return None
    inputs = tuple(None if value is None else id(value) for value in node.inputs)
    return (node_key(node), inputs)


def _hoist_from(graph: ir.Graph, if_node: ir.Node) -> int:
    then_branch = if_node.attributes["then_branch"].value
    else_branch = if_node.attributes["else_branch"].value
    branches = (then_branch, else_branch)
    local = [{id(v) for node in branch for v in node.outputs} for branch in branches]
    outputs = [{id(v) for v in branch.outputs} for branch in branches]
    moved = 0
    while True:
        candidates: dict[tuple, ir.Node] = {}
        for node in then_branch:
            key = _movable_key(node, local[0], outputs[0])
            if key is not None:
                candidates.setdefault(key, node)
        pairs = []
        for node in else_branch:
            key = _movable_key(node, local[1], outputs[1])
            if key is not None and key in candidates:
                pairs.append((candidates.pop(key), node))
        if not pairs:
            return moved
        for kept, twin in pairs:
            then_branch.remove(kept)
            graph.insert_before(if_node, kept)
            for value, other in zip(kept.outputs, twin.outputs):
                # the sides may know different sizes (a version at `length = 0` has
                # `x[..., :1]` of 0 columns, the other one of 1): onnxruntime allocates
                # a scan's states after the declared shape, so the one value read by
                # both declares only what both sides agree on
                value.shape = merged_shape(value.shape, other.shape)
                other.replace_all_uses_with(value)
                local[0].discard(id(value))
            else_branch.remove(twin, safe=True)
            moved += 1


__all__ = ["hoist_out_of_branches"]
