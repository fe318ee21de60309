"""Outputs of an ``If`` that are never needed on the same side become one output.

:mod:`.branch_merging` gives an ``If`` an output for each value a stretch exports; a
value only one side computes is filled with an empty constant (a *filler*) on the
other side, which nothing reads on that side. Versions compute the same thing in
different places: the past length of a decode step, say, is an output of the stretch
computing the mask in the version for one token (a filler on the other side) and
another output in the version for a prompt (a filler on the first side). Later
stretches read one or the other depending on the side, so their two branches read
different values and do not merge, although they compute the same thing.

:func:`merge_filler_slots` makes such outputs one: outputs ``i`` and ``j`` of an
``If`` are merged when, on each side, one of them is a filler or both are the same
value; the merged output is, on each side, the value that is not a filler. Every
reader of ``i`` or ``j`` reads the merged output: on a side where ``i`` was a filler,
nothing read ``i`` there, and elsewhere the merged output is ``i``'s value. Merging the
branches again then finds the later stretches' nodes reading the same value on both
sides (:func:`yobx.torch.onnx.optimize.merge_branches` alternates the two).

A filler is a constant :mod:`.branch_merging` marked (``node.meta``, in memory: the
mark does not survive a save), a copy of one, or an output of an inner ``If`` filled
on both sides.
"""

from __future__ import annotations

import onnx_ir as ir

from .branch_merging import FILLER_KEY, _Names, _source, merged_shape

__all__ = ["merge_filler_slots"]


def merge_filler_slots(model: ir.Model) -> int:
    """Merges the outputs of every ``If`` of ``model`` that are never needed on the same
    side (see the module docstring), the innermost ``If`` first; returns how many
    outputs were removed."""
    ifs = [
        node
        for node in ir.traversal.RecursiveGraphIterator(model.graph)
        if node.op_type == "If" and node.domain in ("", "ai.onnx")
    ]
    # an inner If comes after its enclosing one in the iteration: reversed, inner first
    names = _Names(model.graph)
    return sum(_merge_slots(node, node.graph is model.graph, names) for node in reversed(ifs))


def _is_filler(value: ir.Value | None) -> bool:
    source = _source(value) if value is not None else None
    producer = source.producer() if source is not None else None
    if producer is None:
        return False
    if producer.meta.get(FILLER_KEY):
        return True
    if producer.op_type != "If" or producer.domain not in ("", "ai.onnx"):
        return False
    index = source.index()
    return all(
        _is_filler(producer.attributes[a].value.outputs[index])
        for a in ("then_branch", "else_branch")
    )


class _Group:
    """Outputs merged into one: their positions, and on each side the value that is
    not a filler (None while every one is a filler there), as the branch returns it
    and as compared (through copies)."""

    def __init__(self, position: int, sides: list[tuple[ir.Value, bool]]):
        self.positions = [position]
        self.values: list[ir.Value | None] = [None if f else v for v, f in sides]
        self.fallback = [value for value, _ in sides]

    def accepts(self, sides: list[tuple[ir.Value, bool]]) -> bool:
        return all(
            filler or mine is None or _source(mine) is _source(value)
            for mine, (value, filler) in zip(self.values, sides)
        )

    def add(self, position: int, sides: list[tuple[ir.Value, bool]]) -> None:
        self.positions.append(position)
        for side, (value, filler) in enumerate(sides):
            if not filler and self.values[side] is None:
                self.values[side] = value

    def value(self, side: int) -> ir.Value:
        found = self.values[side]
        return found if found is not None else self.fallback[side]


def _groups(node: ir.Node, branches: list[ir.Graph], main: bool) -> list[_Group]:
    """The outputs of ``node`` in groups that can be one output (the model's outputs,
    named by the user, stay apart)."""
    groups: list[_Group] = []
    for position, output in enumerate(node.outputs):
        sides = [(b.outputs[position], _is_filler(b.outputs[position])) for b in branches]
        target = None
        if output.dtype is not None and not (main and output.is_graph_output()):
            target = next(
                (
                    g
                    for g in groups
                    if node.outputs[g.positions[0]].dtype == output.dtype
                    and not (main and node.outputs[g.positions[0]].is_graph_output())
                    and g.accepts(sides)
                ),
                None,
            )
        if target is None:
            groups.append(_Group(position, sides))
        else:
            target.add(position, sides)
    return groups


def _returned_once(graph: ir.Graph, values: list[ir.Value], names: _Names) -> None:
    """Sets the outputs of ``graph`` to ``values``, a value returned twice or computed
    outside the graph copied by an ``Identity`` (a graph returns a value once, one of
    its own)."""
    outputs: list[ir.Value] = []
    for value in values:
        producer = value.producer()
        outside = producer is None or producer.graph is not graph
        if outside or any(value is other for other in outputs):
            copy = ir.node("Identity", [value], name=names.fresh(f"{value.name}_copy"))
            copy.outputs[0].name = names.fresh(f"{value.name}_copy")
            copy.outputs[0].type, copy.outputs[0].shape = value.type, value.shape
            graph.append(copy)
            value = copy.outputs[0]
        outputs.append(value)
    graph.outputs.clear()
    graph.outputs.extend(outputs)


def _merge_slots(node: ir.Node, main: bool, names: _Names) -> int:
    branches = [node.attributes[a].value for a in ("then_branch", "else_branch")]
    groups = _groups(node, branches, main)
    if len(groups) == len(node.outputs):
        return 0
    for side, branch in enumerate(branches):
        _returned_once(branch, [group.value(side) for group in groups], names)
    merged = ir.Node(
        node.domain,
        "If",
        list(node.inputs),
        attributes=list(node.attributes.values()),
        num_outputs=len(groups),
        name=node.name,
    )
    for group, new in zip(groups, merged.outputs):
        first = node.outputs[group.positions[0]]
        shape = first.shape
        for position in group.positions[1:]:
            shape = merged_shape(shape, node.outputs[position].shape)
        new.type, new.shape = first.type, shape
        name = first.name
        for position in group.positions:
            node.outputs[position].replace_all_uses_with(new, replace_graph_outputs=True)
        first.name = None
        new.name = name
    graph = node.graph
    graph.insert_before(node, [merged])
    graph.remove(node, safe=True)
    if not main:
        # the enclosing branch may now return the merged output in several places
        _returned_once(graph, list(graph.outputs), names)
    return len(node.outputs) - len(groups)
