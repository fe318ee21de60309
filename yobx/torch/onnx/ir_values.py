"""What a rewrite reads of an ``onnx_ir`` value: the node computing it, its constant
contents, its dimensions. The fusions of :mod:`.gqa_fusion` and :mod:`.gqa_rotary`
recognise their patterns node by node with these."""

from __future__ import annotations

import onnx_ir as ir


def producer(value: ir.Value | None, op_type: str, graph: ir.Graph | None = None) -> ir.Node | None:
    """The node of the default domain computing ``value`` when it is an ``op_type``
    (and, with ``graph``, a node of that graph), else None."""
    node = None if value is None else value.producer()
    if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
        return None
    return node if graph is None or node.graph is graph else None


def constant_scalar(value: ir.Value | None) -> float | None:
    """The number a one-element constant holds, else None."""
    if value is None or value.const_value is None or value.const_value.size != 1:
        return None
    return float(value.const_value.numpy().reshape(()))


def constant_ints(value: ir.Value | None) -> list[int] | None:
    """The integers a constant holds (flattened), else None."""
    if value is None or value.const_value is None:
        return None
    return [int(x) for x in value.const_value.numpy().reshape(-1)]


def dims_of(value: ir.Value) -> list | None:
    """The dimensions of ``value``: ints, names of symbolic ones (None when unknown),
    None for an unknown rank."""
    if value.shape is None:
        return None
    return [d.value if isinstance(d, ir.SymbolicDim) else d for d in value.shape]


__all__ = ["constant_ints", "constant_scalar", "dims_of", "producer"]
