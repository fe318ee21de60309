"""``torch._grouped_mm`` with offsets (mixture-of-experts layers) in ONNX.

transformers' experts layers sort the (token, expert) pairs by expert and multiply each
group of rows by its expert's weight: ``_grouped_mm(x, w, offs)`` with ``x`` of shape
``(S, K)``, ``w`` of ``(E, K, N)`` and ``offs`` the cumulative row counts, ``(E,)``.
torch_lib has no translation for the offsets (torch.onnx fails on every such model).
Here it is an ONNX ``Loop`` over the experts: expert ``e`` multiplies the rows
``offs[e-1]:offs[e]`` (a ``Slice``, empty for an expert without rows) by ``w[e]``, and
the products are concatenated in order; rows past ``offs[-1]`` are zeros. Each row is
multiplied once, by its expert's weight, as the kernel does.
"""

from __future__ import annotations

import onnx_ir as ir
import onnxscript
from onnxscript import INT64
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat


@onnxscript.script(default_opset=op)
def _grouped_rows(x: TFloat, w: TFloat, offs: INT64) -> TFloat:
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    rows = op.Shape(x, start=0, end=1)
    columns = op.Shape(w, start=2, end=3)
    out = op.Expand(op.CastLike(op.Constant(value_float=0.0), x), op.Concat(zero, columns, axis=0))
    start = zero
    for e in range(op.Squeeze(op.Shape(w, start=0, end=1))):
        index = op.Reshape(e, one)
        end = op.Gather(offs, index)
        weight = op.Squeeze(op.Gather(w, index, axis=0), zero)
        out = op.Concat(out, op.MatMul(op.Slice(x, start, end, zero), weight), axis=0)
        start = end
    left = op.Sub(rows, op.Shape(out, start=0, end=1))
    return op.Pad(out, op.Concat(zero, zero, left, zero, axis=0))


def grouped_mm_to_onnx(self, mat2, offs=None, bias=None, out_dtype=None):
    """``aten._grouped_mm``: a batched ``MatMul`` without offsets, the loop over the
    experts with them (``self`` 2-D, ``mat2`` 3-D: the experts layers' form)."""
    if offs is None:
        result = op.MatMul(self, mat2)
    else:
        if len(self.shape or ()) != 2 or len(mat2.shape or ()) != 3:
            raise NotImplementedError(
                "_grouped_mm with offsets is translated for a 2-D input and 3-D weights "
                "(mixture-of-experts layers)"
            )
        result = _grouped_rows(self, mat2, op.Cast(offs, to=ir.DataType.INT64))
    if bias is not None:
        result = op.Add(result, bias)
    if out_dtype is not None and out_dtype != -1:
        result = op.Cast(result, to=out_dtype)
    return result


__all__ = ["grouped_mm_to_onnx"]
