"""onnxscript's ``MaterializeReshapeShape``, kept from writing a shape ONNX forbids.

The rule replaces a ``Reshape``'s computed shape by a constant read from the output's
known shape, its one symbolic dimension as ``-1``, with ``allowzero=1`` (a 0 is a size,
not "copy the input's"). ONNX forbids ``-1`` beside a ``0`` under ``allowzero=1``, and
onnxruntime refuses to load such a model, even when the ``Reshape`` is in a branch
never taken. A version of a model captured at an empty size (a mask of length 0 beside
a dynamic batch) has such reshapes: ``mask.view(batch, -1)`` became
``Reshape(mask, [-1, 0], allowzero=1)``. Where the output has a 0 beside a symbolic
dimension, this rule leaves the computed shape as it is, and
:func:`repair_zero_reshapes` mends what onnxscript's own optimizer (which its fusions for
onnxruntime run) writes with the unguarded rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter._basics import MatchResult
from onnxscript.rewriter.rules.common._materialize_reshape_shape import (
    MaterializeReshapeShape,
    materialize_reshape_shape_rule,
)


class MaterializeReshapeShapeWithoutZeros(MaterializeReshapeShape):
    """``MaterializeReshapeShape`` except where the output holds a 0 beside a symbolic
    dimension (the constant would be ``[-1, 0]``, invalid with ``allowzero=1``)."""

    def check(self, context: Any, data: ir.Value, shape: ir.Value) -> MatchResult:
        output = context.output_values[0]
        dims = list(output.shape) if output.shape is not None else []
        if 0 in dims and any(not isinstance(d, int) for d in dims):
            return MatchResult().fail("a 0 beside a symbolic dimension: -1 is not allowed")
        return super().check(context, data, shape)


def replaced_reshape_rule(rule: Any) -> Any:
    """``rule``, or the guarded rule when ``rule`` is onnxscript's
    ``materialize_reshape_shape_rule``."""
    if rule is materialize_reshape_shape_rule:
        return MaterializeReshapeShapeWithoutZeros.rule()
    return rule


def repair_zero_reshapes(model: ir.Model) -> int:
    """Gives back a computed size to each ``Reshape`` whose constant shape holds ``-1``
    beside ``0`` under ``allowzero=1``: what the unguarded rule writes when onnxscript's
    own optimizer runs it (its fusions for onnxruntime do). The ``-1`` stands for a
    symbolic dimension of the output; its size is read from the data (or a graph input)
    holding that dimension. Returns how many were repaired; one whose dimension no such
    value holds is left as it is. Runs while the values' shapes are known."""
    repaired = 0
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx"):
            continue
        allowzero = node.attributes.get("allowzero")
        constant = node.inputs[1].const_value if len(node.inputs) > 1 else None
        if allowzero is None or allowzero.as_int() != 1 or constant is None:
            continue
        dims = [int(d) for d in constant.numpy().reshape(-1)]
        shape = node.outputs[0].shape
        if -1 not in dims or 0 not in dims or shape is None or len(shape) != len(dims):
            continue
        position = dims.index(-1)
        source = _holding(shape[position], [node.inputs[0], *model.graph.inputs])
        if source is None:
            continue
        _computed_shape(node, dims, position, *source)
        repaired += 1
    return repaired


def _holding(dim: Any, candidates: list) -> tuple[ir.Value, int] | None:
    """A value among ``candidates`` whose shape holds the symbolic ``dim``, and the
    axis where it does."""
    if isinstance(dim, int) or dim is None or str(dim) in ("", "None"):
        return None
    for value in candidates:
        if value is None or value.shape is None:
            continue
        for axis, other in enumerate(value.shape):
            if not isinstance(other, int) and str(other) == str(dim):
                return value, axis
    return None


def _computed_shape(node: ir.Node, dims: list[int], position: int, source, axis: int) -> None:
    """Replaces the constant shape of ``node`` by ``dims`` with ``source``'s size at
    ``axis`` at ``position``."""
    size = ir.node("Shape", [source], attributes={"start": axis, "end": axis + 1})
    parts, added = [], [size]
    for piece in (dims[:position], None, dims[position + 1 :]):
        if piece is None:
            parts.append(size.outputs[0])
        elif piece:
            tensor = ir.tensor(np.array(piece, dtype=np.int64))
            constant = ir.node("Constant", [], attributes={"value": tensor})
            added.append(constant)
            parts.append(constant.outputs[0])
    concat = ir.node("Concat", parts, attributes={"axis": 0})
    added.append(concat)
    # names of their own: the serializer names unnamed values alike in every subgraph
    stem = f"{node.name or node.outputs[0].name}_zero_reshape"
    for index, new in enumerate(added):
        new.name = f"{stem}_node{index}"
        new.outputs[0].name = f"{stem}_{index}"
    node.graph.insert_before(node, added)
    node.replace_input_with(1, concat.outputs[0])
