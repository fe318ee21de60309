"""ONNX translations of nearest-neighbour resizing with torch's index arithmetic.

``F.interpolate(mode="nearest")`` and ``mode="nearest-exact"`` pick, for each output
position ``dst`` of an axis of input size ``I`` and output size ``O``, the input
position torch's CPU kernels compute in float32 (float64 inputs: in double, then
rounded to float32 by ``floorf``), with ``scale = 1 / s`` when the scale factor ``s``
is given and ``float(I) / O`` otherwise:

* nearest: ``min(floor(dst * scale), I - 1)``, except that the 2-d kernel copies when
  ``O == I`` and halves when ``O == 2 * I``, even with a scale factor;
* nearest-exact: ``min(floor(max(scale * (dst + 0.5) - 0.5, 0) + 0.5), I - 1)``, the
  product and the subtraction fused (one rounding) in the 1-d and 3-d kernels, as the
  compiler built them, and most often not in the 2-d one.

ONNX ``Resize`` (torch_lib's translation) divides by ``O / I`` exactly instead:
``F.interpolate(x, size=110)`` of 32 positions, or any scale factor that is not a
power of two, takes another input position for some outputs, silently (the shapes
agree). Here each axis is a ``Gather`` of indices computed as torch does; the formula
was checked against torch on every size up to 130 -> 300 and common scale factors,
for float16, bfloat16, float32 and float64, and on every axis of the three ranks
(``unittests/torch/onnx/test_nearest_resize.py``). ``Resize`` stays where it is
exact: nearest with power-of-two integer scale factors (a U-Net's
``scale_factor=2.0``), the division then exact.

One limit is torch's own: where a nearest-exact position is an integer up to one
float32 rounding (``20.5 * (2 / 41)``), torch's 2-d kernel fuses the multiply-add for
some pairs of sizes of the other axis and not for others (resizing ``(4, 4)`` to
``(82, 82)`` takes input column 1 for output column 20, ``(1, 4)`` to ``(1, 82)``
takes column 0): the export follows the unfused arithmetic there, and may take the
neighbouring input position on such ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import onnxscript
import torch

_op = onnxscript.opset18

_FLOAT = onnxscript.FLOAT.dtype
_DOUBLE = onnxscript.DOUBLE.dtype
_INT64 = onnxscript.INT64.dtype


def _power_of_two(scale: float) -> bool:
    return scale >= 1 and scale == int(scale) and (int(scale) & (int(scale) - 1)) == 0


def _size_1d(value: Any):
    """An int, a symbolic size (an ONNX value) or a 1-element list: a 1-d int64."""
    if isinstance(value, int):
        return _op.Constant(value_ints=[value])
    return _op.Reshape(_op.Cast(value, to=_INT64), _op.Constant(value_ints=[1]))


def _output_sizes(output_size: Any, n: int) -> list:
    """The ``n`` output sizes: ``output_size`` a list (ints or symbolic sizes) or one
    1-d int64 value (torch.onnx concatenates a list holding symbolic sizes)."""
    if isinstance(output_size, Sequence):
        return [_size_1d(size) for size in output_size]
    flat = _op.Cast(output_size, to=_INT64)
    return [
        _op.Slice(flat, _op.Constant(value_ints=[i]), _op.Constant(value_ints=[i + 1]))
        for i in range(n)
    ]


def _scalar(value: float, dtype: ir.DataType):
    """A 0-d constant of ``dtype`` (float32 or float64)."""
    numpy_dtype = np.float64 if dtype == ir.DataType.DOUBLE else np.float32
    return _op.Constant(value=ir.tensor(np.asarray(value, dtype=numpy_dtype)))


def _axis_indices(
    in_size,
    out_size,
    scale: float | None,
    exact: bool,
    kernel: tuple[bool, bool],
    compute: ir.DataType,
):
    """The input position of every output position along one axis (1-d int64);
    ``in_size`` and ``out_size`` are 1-d int64 values, ``compute`` torch's type for
    the arithmetic (float32, float64 for float64 inputs); ``kernel`` says whether
    torch's kernel rounds ``scale * (dst + 0.5) - 0.5`` once (nearest-exact) and
    whether it takes shortcuts for sizes 1 and 2 times the input's (nearest)."""
    fused, shortcuts = kernel
    if scale is not None and scale > 0:
        factor = _scalar(1.0 / scale, compute)
    else:
        factor = _op.Div(_op.Cast(in_size, to=compute), _op.Cast(out_size, to=compute))
    dst = _op.Range(_op.Constant(value_int=0), _op.Squeeze(out_size), _op.Constant(value_int=1))
    if exact and fused:
        half = _scalar(0.5, ir.DataType.DOUBLE)
        # scale * (dst + 0.5) - 0.5 with one rounding: exact in double (a float32
        # times a half-integer), then rounded to the kernel's type
        source = _op.Sub(
            _op.Mul(_op.Cast(factor, to=_DOUBLE), _op.Add(_op.Cast(dst, to=_DOUBLE), half)), half
        )
        source = _op.Max(_op.Cast(source, to=compute), _scalar(0.0, compute))
        position = _op.Add(source, _scalar(0.5, compute))
    elif exact:
        half = _scalar(0.5, compute)
        source = _op.Sub(_op.Mul(factor, _op.Add(_op.Cast(dst, to=compute), half)), half)
        position = _op.Add(_op.Max(source, _scalar(0.0, compute)), half)
    else:
        position = _op.Mul(_op.Cast(dst, to=compute), factor)
    # floorf: a double position is rounded to float32 first
    index = _op.Cast(_op.Floor(_op.Cast(position, to=_FLOAT)), to=_INT64)
    index = _op.Min(index, _op.Sub(in_size, _op.Constant(value_ints=[1])))
    if shortcuts and not exact and scale is not None:
        # the 2-d nearest kernel copies when O == I and halves when O == 2 * I
        # whatever the scale factor (1.05 and 2.05 at size 10); the formula gives
        # the same without one
        twice = _op.Mul(in_size, _op.Constant(value_ints=[2]))
        halved = _op.Div(dst, _op.Constant(value_int=2))
        index = _op.Where(
            _op.Equal(out_size, in_size),
            dst,
            _op.Where(_op.Equal(out_size, twice), halved, index),
        )
    return index


def _resized(x, output_size: Any, scales: Sequence[float | None] | None, exact: bool, n: int):
    """``x`` resized along its last ``n`` axes, as torch's nearest kernels do."""
    rank = len(x.shape)
    given = scales is not None and all(s is not None for s in scales)
    if given and not exact and all(_power_of_two(s) for s in scales):
        # dst / s floored: exact for powers of two, as torch's dst * (1 / s)
        return _op.Resize(
            x,
            None,
            _op.Constant(value_floats=[1.0] * (rank - n) + [float(s) for s in scales]),
            mode="nearest",
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
        )
    compute = ir.DataType.DOUBLE if x.dtype == ir.DataType.DOUBLE else ir.DataType.FLOAT
    scales = list(scales) if scales is not None else [None] * n
    in_sizes = [_op.Shape(x, start=rank - n + d, end=rank - n + d + 1) for d in range(n)]
    if output_size is None:
        out_sizes = [_scaled_size(i, s) for i, s in zip(in_sizes, scales)]
    else:
        out_sizes = _output_sizes(output_size, n)
    # torch's compiled 1-d and 3-d nearest-exact kernels fuse the multiply-add, its
    # 2-d one does not (measured on torch 2.13 for x86-64, both memory formats): the
    # two differ only where the position is an integer up to a rounding; its 2-d
    # nearest kernel alone has shortcuts
    kernel = (n != 2, n == 2)
    result = x
    for d in range(n):
        indices = _axis_indices(in_sizes[d], out_sizes[d], scales[d], exact, kernel, compute)
        result = _op.Gather(result, indices, axis=rank - n + d)
    return result


def _scaled_size(in_size, scale: float):
    """torch's output size for a scale factor: ``I * s`` truncated, in double."""
    if scale == int(scale):
        return _op.Mul(in_size, _op.Constant(value_ints=[int(scale)]))
    product = _op.Mul(_op.Cast(in_size, to=_DOUBLE), _scalar(scale, ir.DataType.DOUBLE))
    return _op.Cast(_op.Floor(product), to=_INT64)


def _vec(exact: bool, n: int):
    def translation(input, output_size=None, scale_factors=None):
        return _resized(input, output_size, scale_factors, exact, n)

    translation.__name__ = f"upsample_nearest{'_exact' if exact else ''}{n}d_vec"
    return translation


def _with_scales(exact: bool, n: int):
    def translation(self, output_size, *scales):
        scales = list(scales) + [None] * (n - len(scales))
        # torch's kernel uses each given scale, and I / O where one is missing
        return _resized(self, output_size, scales, exact, n)

    translation.__name__ = f"upsample_nearest{'_exact' if exact else ''}{n}d"
    return translation


def register_nearest_translations(registry: Any) -> None:
    """Registers the translations of ``upsample_nearest{1,2,3}d`` and
    ``_upsample_nearest_exact{1,2,3}d``, both overloads (sizes or scale factors)."""
    for n in (1, 2, 3):
        for exact, name in (
            (False, f"upsample_nearest{n}d"),
            (True, f"_upsample_nearest_exact{n}d"),
        ):
            packet = getattr(torch.ops.aten, name)
            registry.register_op(packet.vec, _vec(exact, n))
            registry.register_op(packet.default, _with_scales(exact, n))


__all__ = ["register_nearest_translations"]
