"""Means and variances over axes that may be empty, NaN as in torch.

torch's mean of no element is ``0 / 0``, NaN; onnxruntime's ``ReduceMean`` of no element
is 0 (and torch_lib's variance, a ``ReduceMean`` of squares, ``-0``).
``F.adaptive_avg_pool1d(y[..., 2:], 1)`` at ``y.shape[-1] == 2`` gave zeros in
onnxruntime where eager gives NaN, silently (fuzz_onnx seed 8971); torch_lib translates
``aten.mean`` to ``ReduceMean`` alone.

:func:`register_mean_translations` translates, for a real tensor, ``aten.mean`` to the
sum divided by the number of elements (``0 / 0`` is NaN in ONNX too), and ``aten.var``,
``aten.std``, ``aten.var_mean`` and ``aten.std_mean`` to torch's formula on those sums
(``sum((x - mean)^2) / max(0, n - correction)``), where a reduced axis is not known to
hold an element (a dynamic size, which may be 0). Where every reduced axis has a static
size of at least 1 (a hidden size), they stay torch_lib's, node for node: the fusions
of normalizations look for its ``ReduceMean``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def _variance(self, dim, correction, keepdim: bool):
    """torch's ``sum((x - mean)^2) / max(0, n - correction)`` and the mean: NaN over no
    element (``0 / 0``), where torch_lib's ``ReduceMean`` of the squares gives ``-0``."""
    axes = _op.Constant(value_ints=_reduced_axes(len(self.shape), dim))
    count = _op.CastLike(
        _op.ReduceProd(_op.Gather(_op.Shape(self), axes, axis=0), keepdims=0), self
    )
    mean = _op.Div(_op.ReduceSum(self, axes, keepdims=1), count)
    centered = _op.Sub(self, mean)
    squares = _op.ReduceSum(_op.Mul(centered, centered), axes, keepdims=keepdim)
    correction = 1.0 if correction is None else float(correction)
    denominator = _op.Max(_op.Sub(count, _op.CastLike(correction, self)), _op.CastLike(0.0, self))
    return _op.Div(squares, denominator), mean if keepdim else _op.Squeeze(mean, axes)


def _spread(torch_lib: Callable, finish: Callable) -> Callable:
    """The translation of a variance-like operator: torch_lib's where no reduced axis
    may be empty, ``finish(variance, mean)`` of :func:`_variance` elsewhere."""

    def translate(self, dim=None, correction=None, keepdim: bool = False):
        if not _may_be_empty(self, dim):
            return torch_lib(self, dim, correction, keepdim)
        return finish(*_variance(self, dim, correction, keepdim))

    return translate


def register_mean_translations(registry: Any) -> None:
    """Adds the translations of ``aten.mean``, ``aten.var``, ``aten.std``,
    ``aten.var_mean`` and ``aten.std_mean`` of real tensors to ``registry`` (see the
    module's documentation); torch_lib's stay for complex ones."""
    aten = torch.ops.aten
    registry.register_op(aten.mean.dim, _mean_to_onnx)
    registry.register_op(aten.mean.default, _mean_all_to_onnx)
    spreads = {
        aten.var.correction: (core.aten_var_correction, lambda var, mean: var),
        aten.std.correction: (core.aten_std_correction, lambda var, mean: _op.Sqrt(var)),
        aten.var_mean.correction: (core.aten_var_mean_correction, lambda var, mean: (var, mean)),
        aten.std_mean.correction: (
            core.aten_std_mean_correction,
            lambda var, mean: (_op.Sqrt(var), mean),
        ),
    }
    for target, (torch_lib, finish) in spreads.items():
        registry.register_op(target, _spread(torch_lib, finish))


__all__ = ["register_mean_translations"]
