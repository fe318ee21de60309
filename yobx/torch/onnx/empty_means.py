"""Means over axes that may be empty, NaN as in torch.

torch's mean of no element is ``0 / 0``, NaN; onnxruntime's ``ReduceMean`` of no element
is 0. ``F.adaptive_avg_pool1d(y[..., 2:], 1)`` at ``y.shape[-1] == 2`` gave zeros in
onnxruntime where eager gives NaN, silently (fuzz_onnx seed 8971); torch_lib translates
``aten.mean`` to ``ReduceMean`` alone.

:func:`register_mean_translations` translates ``aten.mean.dim`` and
``aten.mean.default`` of a real tensor to the sum divided by the number of elements
(``0 / 0`` is NaN in ONNX too) where a reduced axis is not known to hold an element (a
dynamic size, which may be 0), and to ``ReduceMean`` where every reduced axis has a
static size of at least 1 (a hidden size: normalization fusions look for
``ReduceMean``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnxscript
import torch
from onnxscript.function_libs.torch_lib.ops import core

_op = onnxscript.opset18


def _reduced_axes(rank: int, dim: int | Sequence[int] | None) -> list[int]:
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):
        return list(range(rank))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % rank for d in dims})


def _may_be_empty(self, dim) -> bool:
    """A reduced axis of ``self`` has no static size of at least 1."""
    shape = self.shape
    if shape is None or len(shape) == 0:
        return False
    axes = _reduced_axes(len(shape), dim)
    return not all(isinstance(shape[a], int) and shape[a] >= 1 for a in axes)


def _mean_to_onnx(self, dim=None, keepdim: bool = False, dtype: int = -1):
    if not _may_be_empty(self, dim):
        # torch_lib's, node for node (the fusions of normalizations read its axes)
        return core.aten_mean_dim(self, dim, keepdim, dtype)
    axes = _reduced_axes(len(self.shape), dim)
    if dtype != -1 and dtype is not None:
        # torch computes in the dtype asked for
        self = _op.Cast(self, to=dtype)
    reduced = _op.Constant(value_ints=axes)
    total = _op.ReduceSum(self, reduced, keepdims=keepdim)
    count = _op.ReduceProd(_op.Gather(_op.Shape(self), reduced, axis=0), keepdims=0)
    return _op.Div(total, _op.CastLike(count, total))


def _mean_all_to_onnx(self, dtype: int = -1):
    if not _may_be_empty(self, None):
        return core.aten_mean(self, dtype)
    return _mean_to_onnx(self, None, False, dtype)


def register_mean_translations(registry: Any) -> None:
    """Adds the translations of ``aten.mean.dim`` and ``aten.mean.default`` of real
    tensors to ``registry`` (see the module's documentation); torch_lib's stay for
    complex ones."""
    registry.register_op(torch.ops.aten.mean.dim, _mean_to_onnx)
    registry.register_op(torch.ops.aten.mean.default, _mean_all_to_onnx)


__all__ = ["register_mean_translations"]
