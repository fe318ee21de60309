"""ONNX translations of the RNN custom operators of :mod:`yobx.torch.ops.rnn`.

Lowering ``nn.LSTM`` / ``nn.GRU`` to aten unrolls the recurrence over the time steps,
which fixes the sequence length. Instead the leaf module call becomes one opaque
custom operator (``yobx::lstm``, ``yobx::gru``) whose ONNX translation is the ONNX
``LSTM`` / ``GRU`` operator, one per layer, so the sequence length stays dynamic.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import onnx_ir as ir
import onnxscript
import torch

from ..ops import checks, rnn
from ..ops.rnn import leaf_module_call

# `lstm` and `gru` are read through __getattr__ (defined when first read)
__all__ = ["leaf_module_call", "register_defined_operators", "register_translations"]


#: the custom operators, defined when first read (yobx.torch.ops)
__getattr__ = rnn.operators.module_getattr(__name__)


_op = onnxscript.opset18


def _reorder_gates(weight, order: Sequence[int], gates: int):
    """Splits the gate blocks along axis 0 and concatenates them in ``order``."""
    parts = _op.Split(weight, num_outputs=gates, axis=0)
    return _op.Concat(*[parts[i] for i in order], axis=0)


def _rnn_layer_inputs(weights, layer, directions, has_biases, order, gates):
    """Builds ONNX W, R, B for one layer from PyTorch's flat weights."""
    per_direction = 4 if has_biases else 2
    ws, rs, bs = [], [], []
    for d in range(directions):
        base = (layer * directions + d) * per_direction
        w = _reorder_gates(weights[base], order, gates)
        r = _reorder_gates(weights[base + 1], order, gates)
        ws.append(_op.Unsqueeze(w, [0]))
        rs.append(_op.Unsqueeze(r, [0]))
        if has_biases:
            wb = _reorder_gates(weights[base + 2], order, gates)
            rb = _reorder_gates(weights[base + 3], order, gates)
            bs.append(_op.Unsqueeze(_op.Concat(wb, rb, axis=0), [0]))
    w = _op.Concat(*ws, axis=0) if directions > 1 else ws[0]
    r = _op.Concat(*rs, axis=0) if directions > 1 else rs[0]
    b = None
    if has_biases:
        b = _op.Concat(*bs, axis=0) if directions > 1 else bs[0]
    return w, r, b


def _rnn_to_onnx(kind, x, h0, c0, weights, has_biases, num_layers, bidirectional, batch_first):
    directions = 2 if bidirectional else 1
    direction = "bidirectional" if bidirectional else "forward"
    if batch_first:
        x = _op.Transpose(x, perm=[1, 0, 2])
    hidden_states, cell_states = [], []
    for layer in range(num_layers):
        start, end = layer * directions, (layer + 1) * directions
        h_init = _op.Slice(h0, [start], [end], [0])
        if kind == "lstm":
            # PyTorch orders the gates i, f, g, o; ONNX i, o, f, c.
            w, r, b = _rnn_layer_inputs(weights, layer, directions, has_biases, [0, 3, 1, 2], 4)
            c_init = _op.Slice(c0, [start], [end], [0])
            hidden_size = h0.shape[-1] if h0.shape is not None else None
            y, y_h, y_c = _op.LSTM(
                x, w, r, b, None, h_init, c_init, direction=direction, hidden_size=hidden_size
            )
            cell_states.append(y_c)
        else:
            # PyTorch orders the gates r, z, n; ONNX z, r, h. PyTorch applies the
            # reset gate after the recurrent linear transform: linear_before_reset=1.
            w, r, b = _rnn_layer_inputs(weights, layer, directions, has_biases, [1, 0, 2], 3)
            hidden_size = h0.shape[-1] if h0.shape is not None else None
            y, y_h = _op.GRU(
                x,
                w,
                r,
                b,
                None,
                h_init,
                direction=direction,
                hidden_size=hidden_size,
                linear_before_reset=1,
            )
        hidden_states.append(y_h)
        # Y is [seq, directions, batch, hidden]; the next layer wants [seq, batch, d*h].
        y = _op.Transpose(y, perm=[0, 2, 1, 3])
        x = _op.Reshape(y, _op.Constant(value_ints=[0, 0, -1]))
    output = _op.Transpose(x, perm=[1, 0, 2]) if batch_first else x
    h_n = _op.Concat(*hidden_states, axis=0) if num_layers > 1 else hidden_states[0]
    if kind == "gru":
        return output, h_n
    c_n = _op.Concat(*cell_states, axis=0) if num_layers > 1 else cell_states[0]
    return output, h_n, c_n


def _lstm_to_onnx(x, h0, c0, weights, has_biases, num_layers, bidirectional, batch_first):
    return _rnn_to_onnx(
        "lstm", x, h0, c0, weights, has_biases, num_layers, bidirectional, batch_first
    )


def _gru_to_onnx(x, h0, weights, has_biases, num_layers, bidirectional, batch_first):
    return _rnn_to_onnx(
        "gru", x, h0, None, weights, has_biases, num_layers, bidirectional, batch_first
    )


def _sym_numel_to_onnx(x):
    # a 0-d int64 tensor, as torch_lib gives for aten.sym_size
    return _op.Size(x)


def _masked_select_to_onnx(x, mask):
    # Where(mask, x, x) is x broadcast with the mask; the selected elements come in
    # row-major order, as torch.masked_select returns them
    broadcast = _op.Where(mask, x, x)
    flat = _op.Constant(value_ints=[-1])
    selected = _op.Reshape(_op.Expand(mask, _op.Shape(broadcast)), flat)
    return _op.Compress(_op.Reshape(broadcast, flat), selected, axis=0)


def _stable_sort_to_onnx(self, stable=None, dim: int = -1, descending: bool = False):
    # ONNX TopK breaks ties by the lower index first: over the whole axis, it is the
    # stable sort (argsort(stable=True) of transformers' experts layers)
    if len(self.shape or ()) == 0:
        return _op.Identity(self), _op.Constant(value_int=0)
    count = _op.Shape(self, start=dim, end=dim + 1 if dim != -1 else None)
    values, indices = _op.TopK(self, count, axis=dim, largest=int(descending), sorted=1)
    return values, indices


def _roll_to_onnx(self, shifts, dims=()):
    # torch_lib takes the shifts as an attribute: a shift computed from a dimension
    # (x.roll(x.shape[1] // 2, 1)) is a value, so each axis is rolled by slices
    if not dims:
        flat = _op.Reshape(self, _op.Constant(value_ints=[-1]))
        return _op.Reshape(_roll_axis(flat, shifts[0], 0), _op.Shape(self))
    result = self
    for shift, dim in zip(shifts, dims):
        result = _roll_axis(result, shift, dim % len(self.shape))
    return result


def _roll_axis(x, shift, axis: int):
    """``x`` rolled by ``shift`` (an int or a value) along ``axis``: its last
    ``shift % n`` elements first."""
    axes = _op.Constant(value_ints=[axis])
    size = _op.Shape(x, start=axis, end=axis + 1)
    if isinstance(shift, int):
        shift = _op.Constant(value_ints=[shift])
    else:
        shift = _op.Reshape(_op.Cast(shift, to=ir.DataType.INT64), _op.Constant(value_ints=[1]))
    # an empty axis: nothing moves (and no remainder by zero)
    kept = _op.Sub(size, _op.Mod(shift, _op.Max(size, _op.Constant(value_ints=[1]))))
    zero = _op.Constant(value_ints=[0])
    return _op.Concat(_op.Slice(x, kept, size, axes), _op.Slice(x, zero, kept, axes), axis=axis)


def _split_to_onnx(self, split_size, dim: int = 0):
    # torch splits an empty axis into one empty piece, onnxruntime's SplitToSequence
    # into none: a capture where the axis is 0 (a version for an empty input) reads
    # that one piece
    shape = self.shape
    if shape is not None and isinstance(shape[dim], int) and shape[dim] == 0:
        return _op.SequenceConstruct(self)
    return _op.SplitToSequence(self, split_size, axis=dim)


def _repeat_interleave_to_onnx(self, repeats, dim=None, output_size=None):
    # torch_lib's (onnxscript 0.7.2) puts a repeat computed from a dimension at the axis
    # of the repeated one instead of the new axis after it: the Expand only works where
    # that axis has size 1 or the repeat's size, and fails elsewhere ("invalid expand
    # shape"). Each element is repeated along a new axis after its own, then merged;
    # sizes are read with Shape(start, end), so the rank need not be known.
    if dim is None:
        self = _op.Reshape(self, _op.Constant(value_ints=[-1]))
        dim = 0
    if isinstance(repeats, int):
        count = _op.Constant(value_ints=[repeats])
    else:
        count = _op.Reshape(_op.Cast(repeats, to=ir.DataType.INT64), _op.Constant(value_ints=[1]))
    last = dim == -1
    # the new axis right after `dim`: dim + 1, or `dim` counted from the end of the
    # result (one axis longer)
    unsqueezed = _op.Unsqueeze(self, _op.Constant(value_ints=[dim if dim < 0 else dim + 1]))
    through = _op.Shape(self) if last else _op.Shape(self, start=0, end=dim + 1)
    after = [] if last else [_op.Shape(self, start=dim + 1)]
    tiled = _op.Expand(unsqueezed, _op.Concat(through, count, *after, axis=0))
    before = [] if dim == 0 else [_op.Shape(self, start=0, end=dim)]
    shape = _op.Concat(*before, _op.Constant(value_ints=[-1]), *after, axis=0)
    return _op.Reshape(tiled, shape)


def _searchsorted_to_onnx(
    sorted_sequence, self, *, out_int32: bool = False, right: bool = False, side=None, sorter=None
):
    # torch_lib has none: the position of each value is the number of sorted values
    # below it (or not above it, `right`), every value compared with every sorted one
    # (..., K, 1) against (..., 1, M), or against (M,) for a 1-D sequence
    if sorter is not None:
        raise NotImplementedError("searchsorted with a sorter has no ONNX translation here")
    right = right or side == "right"
    values, sequence = self, sorted_sequence
    if self.dtype != sorted_sequence.dtype:
        # torch compares in the promoted type (int boundaries, float positions)
        integral = all(v.dtype is not None and v.dtype.is_integer() for v in (self, sequence))
        common = ir.DataType.INT64 if integral else ir.DataType.DOUBLE
        values, sequence = _op.Cast(values, to=common), _op.Cast(sequence, to=common)
    values = _op.Unsqueeze(values, _op.Constant(value_ints=[-1]))
    if len(sorted_sequence.shape or ()) > 1:
        sequence = _op.Unsqueeze(sequence, _op.Constant(value_ints=[-2]))
    below = _op.LessOrEqual(sequence, values) if right else _op.Less(sequence, values)
    count = _op.ReduceSum(
        _op.Cast(below, to=ir.DataType.INT64), _op.Constant(value_ints=[-1]), keepdims=0
    )
    return _op.Cast(count, to=ir.DataType.INT32) if out_int32 else count


def _copy_to_onnx(self, src, non_blocking: bool = False):
    # copy(self, src) broadcasts src to self's shape (torch_lib's only casts, which
    # gives K[2:-2, 2:-2, :-1] = v[None, :, None] a source of the wrong shape)
    return _op.Expand(_op.CastLike(src, self), _op.Shape(self))


def _attention_to_onnx(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
):
    """torch_lib's attention, with torch's answer for a query whose keys a boolean mask
    hides all: zeros.

    torch_lib gives the hidden scores the dtype's lowest value, not ``-inf``, so that
    row's softmax is uniform and the row the mean of the values (its NaN guard never
    fires): silently another output, on padded batches. Here the boolean mask becomes
    an additive one of ``0`` and ``-inf`` (torch_lib's float path, without a NaN guard):
    a row whose keys are all hidden comes out NaN, and only those rows, found from the
    mask (its row maximum is ``-inf``), become zeros. A NaN of the inputs stays a NaN,
    as in torch.
    """
    from onnxscript.function_libs.torch_lib.ops.nn import aten_scaled_dot_product_attention

    if attn_mask is None or attn_mask.dtype != onnxscript.BOOL.dtype:
        return aten_scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
        )
    zero = _op.CastLike(_op.Constant(value_float=0.0), query)
    minus_inf = _op.CastLike(_op.Constant(value_float=-math.inf), query)
    additive = _op.Where(attn_mask, zero, minus_inf)
    out = aten_scaled_dot_product_attention(
        query, key, value, additive, dropout_p, is_causal, scale, enable_gqa
    )
    hidden_row = _op.IsInf(
        _op.ReduceMax(additive, _op.Constant(value_ints=[-1]), keepdims=1), detect_positive=0
    )
    return _op.Where(hidden_row, zero, out)


def _symbolic_math(onnx_op: str):
    """``torch._sym_sqrt`` and friends (``math.sqrt(x.shape[0])``): the ONNX operator
    on the size converted to double (a symbolic float is a Python float, a double in
    the ONNX model: see ``_torch_onnx_internals._symbolic_floats_in_double``)."""

    def translation(x):
        return getattr(_op, onnx_op)(_op.Cast(x, to=onnxscript.DOUBLE.dtype))

    translation.__name__ = f"sym_{onnx_op.lower()}"
    return translation


def _sym_float_to_onnx(x):
    # float(n) of a size: a Python float, a double (torch.onnx casts to float32)
    return _op.Cast(x, to=onnxscript.DOUBLE.dtype)


def _truediv_to_onnx(x, y):
    # n / 7 of sizes: Python's true division, in double
    return _op.Div(_op.Cast(x, to=onnxscript.DOUBLE.dtype), _op.Cast(y, to=onnxscript.DOUBLE.dtype))


def _round_to_onnx(x, ndigits=None):
    """``round(h * 0.75)`` of a dimension, an integer: ONNX Round rounds half to even,
    as Python. ``round(x, ndigits)`` has no translation."""
    if ndigits is not None:
        raise NotImplementedError("round() of a size to a number of decimals")
    return _op.Cast(_op.Round(_op.Cast(x, to=onnxscript.DOUBLE.dtype)), to=onnxscript.INT64.dtype)


#: torch's symbolic twins of Python's math functions -> ONNX operator
_SYMBOLIC_MATH = {
    "sqrt": "Sqrt",
    "cos": "Cos",
    "sin": "Sin",
    "tan": "Tan",
    "cosh": "Cosh",
    "sinh": "Sinh",
    "tanh": "Tanh",
    "exp": "Exp",
    "log": "Log",
    "asin": "Asin",
    "acos": "Acos",
    "atan": "Atan",
}


def register_translations(registry: Any) -> None:
    """Adds yobx's translations to torch_lib's registry.

    The RNN custom operators, the checks on tensor values (:mod:`.value_checks`),
    ``_grouped_mm`` with offsets (:mod:`.grouped_mm`), the stable sort, ``roll`` by
    shifts computed from sizes, ``searchsorted``, ``repeat_interleave`` by a repeat
    computed from a size, and what torch_lib lacks or gets wrong:
    ``aten.sym_numel`` (``x.numel()`` on a dynamic shape, e.g. ``reshape(n, -1)``
    lowered), ``aten.masked_select``, ``aten.copy`` broadcasting its source, moves of
    complex tensors (:mod:`.complex_ops`), attention
    with a boolean mask hiding every key of a query (zeros, as torch), and the
    symbolic math functions (``torch._sym_sqrt``...) Python's ``math.sqrt`` of a
    dimension lowers to, ``round`` of a dimension, symbolic floats (``sym_float``,
    ``truediv``) in double as Python computes them, and nearest resizing with
    torch's index arithmetic (:mod:`.nearest_resize`), ``split`` of an empty axis
    (one empty piece, as torch), and means over axes that may be empty (NaN, as torch:
    :mod:`.empty_means`).
    """
    from .complex_ops import register_complex_translations
    from .empty_means import register_mean_translations
    from .grouped_mm import grouped_mm_to_onnx
    from .nearest_resize import register_nearest_translations

    registry.register_op(torch.ops.aten._grouped_mm.default, grouped_mm_to_onnx)
    registry.register_op(torch.ops.aten.sort.stable, _stable_sort_to_onnx)
    registry.register_op(torch.ops.aten.roll.default, _roll_to_onnx)
    registry.register_op(torch.ops.aten.split.Tensor, _split_to_onnx)
    registry.register_op(torch.ops.aten.searchsorted.Tensor, _searchsorted_to_onnx)
    registry.register_op(torch.ops.aten.repeat_interleave.self_int, _repeat_interleave_to_onnx)
    register_nearest_translations(registry)
    register_mean_translations(registry)

    register_defined_operators(registry)
    registry.register_op(torch.ops.aten.sym_numel.default, _sym_numel_to_onnx)
    registry.register_op(torch.ops.aten.masked_select.default, _masked_select_to_onnx)
    registry.register_op(torch.ops.aten.copy.default, _copy_to_onnx)
    register_complex_translations(registry)
    registry.register_op(torch.ops.aten.scaled_dot_product_attention.default, _attention_to_onnx)
    registry.register_op(round, _round_to_onnx)
    registry.register_op(torch.sym_float, _sym_float_to_onnx)
    registry.register_op(operator.truediv, _truediv_to_onnx)
    for name, onnx_op in _SYMBOLIC_MATH.items():
        function = getattr(torch, f"_sym_{name}", None)
        if function is not None:
            registry.register_op(function, _symbolic_math(onnx_op))


def register_defined_operators(registry: Any) -> None:
    """Adds to ``registry`` the translations of yobx's custom operators defined in the
    process and not registered yet (``yobx::value_check``, ``yobx::gated``,
    ``yobx::lstm``, ``yobx::gru``): they are defined when first needed
    (:mod:`yobx.torch.ops`), which may be after the registry was built."""
    from .value_checks import gated_to_onnx, value_check_to_onnx

    translations = []
    if checks.defined():
        translations += [("value_check", value_check_to_onnx), ("gated", gated_to_onnx)]
    if rnn.defined():
        translations += [("lstm", _lstm_to_onnx), ("gru", _gru_to_onnx)]
    for name, translation in translations:
        op = getattr(torch.ops.yobx, name).default
        if not registry.is_registered(op):
            registry.register_op(op, translation)
