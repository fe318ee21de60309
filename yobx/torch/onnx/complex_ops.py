"""ONNX translations of operators that move the elements of complex tensors.

torch.onnx represents a complex tensor as a real one with a last axis of 2 (the real
and imaginary parts); torch_lib translates the arithmetic on them and some moves
(``view``, ``slice``, ``cat``, ``permute``...) but not ``expand``, ``index``,
``select``, ``unsqueeze`` or ``index_select``, which rotary frequencies in complex form
go through (video transformers expand them over the frames and index them by
position). These operators touch the complex tensor's own axes only: each is the real
operator on the leading axes, with negative axes counted from the complex rank.
"""

from __future__ import annotations

from typing import Any

import onnxscript
import torch

_op = onnxscript.opset18


def _axis(self, dim: int) -> int:
    """``dim`` of the complex tensor as an axis of its real representation."""
    rank = len(self.shape) - 1
    return dim % rank if dim < 0 else dim


def _expand(self, size, implicit: bool = False):
    from onnxscript.function_libs.torch_lib.ops import common as common_ops

    size = [1 if isinstance(s, int) and s == -1 else s for s in size]
    return _op.Expand(self, common_ops.merge_dims([*size, 2]))


def _index(self, indices):
    # the indices address leading axes only: the parts' axis stays, as any axis the
    # indices leave
    from onnxscript.function_libs.torch_lib.ops.core import aten_index

    return aten_index(self, indices)


def _select(self, dim: int, index):
    from onnxscript.function_libs.torch_lib.ops.core import aten_select

    return aten_select(self, _axis(self, dim), index)


def _unsqueeze(self, dim: int):
    # a new axis of the complex tensor: negative positions count from rank + 1
    rank = len(self.shape) - 1
    axis = dim % (rank + 1) if dim < 0 else dim
    return _op.Unsqueeze(self, _op.Constant(value_ints=[axis]))


def _index_select(self, dim: int, index):
    from onnxscript.function_libs.torch_lib.ops.core import aten_index_select

    return aten_index_select(self, _axis(self, dim), index)


def register_complex_translations(registry: Any) -> None:
    """Registers the complex translations of ``expand``, ``index.Tensor``,
    ``select.int``, ``unsqueeze`` and ``index_select``."""
    aten = torch.ops.aten
    for target, function in (
        (aten.expand.default, _expand),
        (aten.index.Tensor, _index),
        (aten.select.int, _select),
        (aten.unsqueeze.default, _unsqueeze),
        (aten.index_select.default, _index_select),
    ):
        registry.register_op(target, function, is_complex=True)


__all__ = ["register_complex_translations"]
