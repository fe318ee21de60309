"""The aten call of common torch-level operators, for the direct lowering: elementwise
arithmetic, comparisons, reductions, softmax, views, ``cat`` and slicing (the
neural-network operators are in :mod:`yobx.torch.onnx.direct_nn_rules`).

A rule takes the interpreted arguments of a node (the lowering's values) and returns
the aten call make_fx records for them, ``(overload, args, kwargs)`` in make_fx's form
(trailing arguments at their schema default dropped), or None when the node is in any
other form, which make_fx then lowers. The rules only read argument kinds (tensor,
Python number, int, symbolic int): they never compare a symbolic size, so they add no
guard. :mod:`yobx.torch.onnx.direct_lowering` writes the calls.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from yobx.torch.onnx.direct_arguments import (
    INT64_MAX,
    AtenCall,
    Rule,
    bind,
    is_dim,
    is_number,
    is_size,
    is_tensor,
    shape_arguments,
    trimmed,
)
from yobx.torch.onnx.direct_nn_rules import NN_FUNCTION_RULES, NN_METHOD_RULES, unary

aten = torch.ops.aten
F = torch.nn.functional

# ---------------------------------------------------------------- elementwise


def _binary(tensor_op: Any, commutative: bool) -> Rule:
    """``a op b``: two tensors, or a tensor and a Python number (``2 * x`` is recorded
    as ``mul(x, 2)``, only for commutative operators)."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        if kwargs or len(args) != 2:
            return None
        a, b = args
        if is_tensor(a) and (is_tensor(b) or is_number(b)):
            return tensor_op, (a, b), {}
        if commutative and is_number(a) and is_tensor(b):
            return tensor_op, (b, a), {}
        return None

    return rule


def _tensor_or_scalar(tensor_op: Any, scalar_op: Any) -> Rule:
    """``x op y`` with ``y`` a tensor (``tensor_op``) or a Python number (``scalar_op``):
    comparisons, ``pow``."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        if kwargs or len(args) != 2 or not is_tensor(args[0]):
            return None
        if is_tensor(args[1]):
            return tensor_op, args, {}
        if is_number(args[1]):
            return scalar_op, args, {}
        return None

    return rule


_pow = _tensor_or_scalar(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar)


def _where(args: tuple, kwargs: dict) -> AtenCall | None:
    if kwargs or len(args) != 3 or not all(is_tensor(a) for a in args[:2]):
        return None
    if is_tensor(args[2]):
        return aten.where.self, args, {}
    if is_number(args[2]):
        return aten.where.ScalarOther, args, {}
    return None


def _masked_fill(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = bind(args, kwargs, ("input", "mask", "value"), {})
    if bound is None or not (is_tensor(bound["input"]) and is_tensor(bound["mask"])):
        return None
    if is_number(bound["value"]):
        return aten.masked_fill.Scalar, (bound["input"], bound["mask"], bound["value"]), {}
    return None


# ---------------------------------------------------------------- reductions


def _reduction(full_op: Any, dim_op: Any) -> Rule:
    """``x.mean()``, ``x.mean(-1, keepdim=True)``, ``x.sum((0, 1))`` (no dtype)."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        bound = bind(
            args,
            kwargs,
            ("input", "dim", "keepdim", "dtype"),
            {"dim": None, "keepdim": False, "dtype": None},
        )
        if bound is None or bound["dtype"] is not None or not is_tensor(bound["input"]):
            return None
        dim, keepdim = bound["dim"], bound["keepdim"]
        if type(keepdim) is not bool:
            return None
        if dim is None:
            return (full_op, (bound["input"],), {}) if keepdim is False else None
        dims = [dim] if is_dim(dim) else list(dim) if isinstance(dim, (tuple, list)) else None
        if not dims or not all(is_dim(d) for d in dims):
            return None
        return trimmed(dim_op, (bound["input"], dims, keepdim), {})

    return rule


def _softmax(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = bind(
        args,
        kwargs,
        ("input", "dim", "_stacklevel", "dtype"),
        {"dim": None, "_stacklevel": 3, "dtype": None},
    )
    if bound is None or not is_tensor(bound["input"]) or not is_dim(bound["dim"]):
        return None
    return _softmax_call(bound["input"], bound["dim"], bound["dtype"])


def _softmax_method(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = bind(args, kwargs, ("input", "dim", "dtype"), {"dtype": None})
    if bound is None or not is_tensor(bound["input"]) or not is_dim(bound["dim"]):
        return None
    return _softmax_call(bound["input"], bound["dim"], bound["dtype"])


def _softmax_call(tensor: Any, dim: int, dtype: Any) -> AtenCall | None:
    """``softmax(x, dim, dtype=torch.float32)`` (HF's eager attention): the dtype is
    the third argument of the aten overload."""
    if dtype is not None and not isinstance(dtype, torch.dtype):
        return None
    return trimmed(aten.softmax.int, (tensor, dim, dtype), {})


def _log_softmax(args: tuple, kwargs: dict) -> AtenCall | None:
    call = _softmax(args, kwargs)
    return None if call is None else (aten.log_softmax.int, call[1], call[2])


def _log_softmax_method(args: tuple, kwargs: dict) -> AtenCall | None:
    call = _softmax_method(args, kwargs)
    return None if call is None else (aten.log_softmax.int, call[1], call[2])


# ---------------------------------------------------------------- views and shapes


def _contiguous(args: tuple, kwargs: dict) -> AtenCall | None:
    """``x.contiguous()`` that copies (when the capture's value is ``x`` itself, the
    lowering takes ``x``: see :func:`~yobx.torch.onnx.direct_lowering.identity_value`)."""
    bound = bind(
        args, kwargs, ("input", "memory_format"), {"memory_format": torch.contiguous_format}
    )
    if bound is None or not is_tensor(bound["input"]):
        return None
    if bound["memory_format"] is not torch.contiguous_format:
        return None
    return aten.clone.default, (bound["input"],), {"memory_format": torch.contiguous_format}


def _transpose(args: tuple, kwargs: dict) -> AtenCall | None:
    if kwargs or len(args) != 3 or not is_tensor(args[0]):
        return None
    if not (is_dim(args[1]) and is_dim(args[2])):
        return None
    return aten.transpose.int, args, {}


def _unsqueeze(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = bind(args, kwargs, ("input", "dim"), {})
    if bound is None or not is_tensor(bound["input"]) or not is_dim(bound["dim"]):
        return None
    return aten.unsqueeze.default, (bound["input"], bound["dim"]), {}


def with_sizes(op: Any) -> Rule:
    """``x.view(*sizes)``, ``x.expand(*sizes)``, ``x.permute(*dims)`` (a dtype given to
    ``view`` reinterprets the bytes: make_fx)."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        if kwargs or len(args) < 2 or not is_tensor(args[0]):
            return None
        sizes = shape_arguments(args[1:])
        if sizes is None:
            return None
        return op, (args[0], sizes), {}

    return rule


def function_with_sizes(op: Any, name: str) -> Rule:
    """``torch.permute(x, dims)``, ``torch.reshape(x, shape)``."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        bound = bind(args, kwargs, ("input", name), {})
        if bound is None or not is_tensor(bound["input"]):
            return None
        if not isinstance(bound[name], (tuple, list)):
            return None
        sizes = shape_arguments((bound[name],))
        return None if sizes is None else (op, (bound["input"], sizes), {})

    return rule


def _cat(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = bind(args, kwargs, ("tensors", "dim"), {"dim": 0})
    if bound is None or not isinstance(bound["tensors"], (tuple, list)):
        return None
    tensors = list(bound["tensors"])
    if not tensors or not all(is_tensor(t) for t in tensors) or not is_dim(bound["dim"]):
        return None
    return trimmed(aten.cat.default, (tensors, bound["dim"]), {})


def _getitem(args: tuple, kwargs: dict) -> AtenCall | None:
    """Basic indexing that torch records as one ``slice`` or one ``unsqueeze``:
    ``x[..., a:b]``, ``x[a:b]``, ``x[..., None]``, ``x[None]`` (torch writes a ``slice``
    per slice, full ones included, so longer indexes make chains whose intermediate
    values the capture does not have: make_fx)."""
    if kwargs or len(args) != 2 or not is_tensor(args[0]):
        return None
    tensor, index = args
    index = index if isinstance(index, tuple) else (index,)
    rest = [i for i in index if i is not Ellipsis]
    if len(rest) != 1 or len(index) - len(rest) > 1:
        return None
    item = rest[0]
    # the item applies to the first dimension, or after an Ellipsis to the last one
    first = index[0] is not Ellipsis
    if item is None:
        dim = 0 if first else tensor.dim()
        return aten.unsqueeze.default, (tensor, dim), {}
    if not isinstance(item, slice) or tensor.dim() == 0:
        return None
    start = 0 if item.start is None else item.start
    stop = INT64_MAX if item.stop is None else item.stop
    step = 1 if item.step is None else item.step
    if not (is_size(start) and is_size(stop) and is_dim(step) and step > 0):
        return None
    dim = 0 if first else tensor.dim() - 1
    return trimmed(aten.slice.Tensor, (tensor, dim, start, stop, step), {})


# ---------------------------------------------------------------- tables

_BINARY = {
    operator.add: _binary(aten.add.Tensor, True),
    operator.sub: _binary(aten.sub.Tensor, False),
    operator.mul: _binary(aten.mul.Tensor, True),
    operator.truediv: _binary(aten.div.Tensor, False),
}
_COMPARISONS = {
    operator.eq: _tensor_or_scalar(aten.eq.Tensor, aten.eq.Scalar),
    operator.ne: _tensor_or_scalar(aten.ne.Tensor, aten.ne.Scalar),
    operator.lt: _tensor_or_scalar(aten.lt.Tensor, aten.lt.Scalar),
    operator.le: _tensor_or_scalar(aten.le.Tensor, aten.le.Scalar),
    operator.gt: _tensor_or_scalar(aten.gt.Tensor, aten.gt.Scalar),
    operator.ge: _tensor_or_scalar(aten.ge.Tensor, aten.ge.Scalar),
}
_UNARY_NAMES = ("neg", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "abs")

#: call_function target -> rule
FUNCTION_RULES: dict[Any, Rule] = {
    **_BINARY,
    **_COMPARISONS,
    operator.neg: unary(aten.neg.default),
    operator.pow: _pow,
    operator.getitem: _getitem,
    torch.add: _binary(aten.add.Tensor, False),
    torch.sub: _binary(aten.sub.Tensor, False),
    torch.mul: _binary(aten.mul.Tensor, False),
    torch.div: _binary(aten.div.Tensor, False),
    torch.pow: _pow,
    torch.cat: _cat,
    torch.concat: _cat,
    torch.where: _where,
    torch.transpose: _transpose,
    torch.unsqueeze: _unsqueeze,
    torch.permute: function_with_sizes(aten.permute.default, "dims"),
    torch.softmax: _softmax_method,
    F.softmax: _softmax,
    F.log_softmax: _log_softmax,
    torch.log_softmax: _log_softmax_method,
    **{getattr(torch, name): unary(getattr(aten, name).default) for name in _UNARY_NAMES},
    **NN_FUNCTION_RULES,
}

#: call_method name -> rule
METHOD_RULES: dict[str, Rule] = {
    "add": _binary(aten.add.Tensor, False),
    "sub": _binary(aten.sub.Tensor, False),
    "mul": _binary(aten.mul.Tensor, False),
    "div": _binary(aten.div.Tensor, False),
    "pow": _pow,
    "transpose": _transpose,
    "unsqueeze": _unsqueeze,
    "view": with_sizes(aten.view.default),
    "expand": with_sizes(aten.expand.default),
    "permute": with_sizes(aten.permute.default),
    "mean": _reduction(aten.mean.default, aten.mean.dim),
    "sum": _reduction(aten.sum.default, aten.sum.dim_IntList),
    "softmax": _softmax_method,
    "log_softmax": _log_softmax_method,
    "masked_fill": _masked_fill,
    "contiguous": _contiguous,
    **{name: unary(getattr(aten, name).default) for name in _UNARY_NAMES},
    **NN_METHOD_RULES,
}
