"""The aten call of each common torch-level operator, for the direct lowering.

A rule takes the interpreted arguments of a node (the lowering's values) and returns
the aten call make_fx records for them, ``(overload, args, kwargs)`` in make_fx's form
(trailing arguments at their schema default dropped), or None when the node is in any
other form, which make_fx then lowers. The rules only read argument kinds (tensor,
Python number, int, symbolic int): they never compare a symbolic size, so they add no
guard. :mod:`yobx.torch.onnx.direct_lowering` writes the calls.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten
F = torch.nn.functional

#: what an aten call is made of: the overload, positional and keyword arguments
AtenCall = tuple[torch._ops.OpOverload, tuple, dict]
#: a rule: the interpreted arguments of a node -> its aten call, or None (make_fx)
Rule = Callable[[tuple, dict], "AtenCall | None"]

_INT64_MAX = 9223372036854775807


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _is_number(value: Any) -> bool:
    """A plain Python int or float (a bool changes the promotion, a symbolic scalar
    is recorded through its own node: both go through make_fx)."""
    return type(value) in (int, float)


def _is_dim(value: Any) -> bool:
    return type(value) is int


def _is_size(value: Any) -> bool:
    """An element of a shape argument: an int or a symbolic int (tracked by make_fx)."""
    return type(value) is int or isinstance(value, torch.SymInt)


def _bind(args: tuple, kwargs: dict, names: tuple[str, ...], defaults: dict) -> dict | None:
    """Binds ``args``/``kwargs`` to ``names`` (Python's rules, without ``*args``);
    None when an argument is unknown, given twice or missing."""
    if len(args) > len(names):
        return None
    bound = dict(zip(names, args))
    for name, value in kwargs.items():
        if name not in names or name in bound:
            return None
        bound[name] = value
    for name in names:
        if name not in bound:
            if name not in defaults:
                return None
            bound[name] = defaults[name]
    return bound


def _shape_arguments(args: tuple) -> list | None:
    """``x.view(2, 3)`` and ``x.view((2, 3))`` alike: the sizes as a list."""
    sizes = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
    sizes = list(sizes)
    return sizes if all(_is_size(s) for s in sizes) else None


def _is_default(value: Any, argument: Any) -> bool:
    """Whether ``value`` is the schema ``argument``'s default, compared only between
    plain constants (a tensor's ``!=`` is elementwise, a symbolic int's would guard)."""
    if not argument.has_default_value():
        return False
    default = argument.default_value
    if value is None or default is None:
        return value is default
    plain = (int, float, bool, str)
    return type(value) in plain and type(value) is type(default) and value == default


def _trimmed(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> AtenCall:
    """Drops trailing positional arguments and keyword-only arguments at their schema
    default: make_fx records them so (``layer_norm(x, [4], w, b)`` without ``eps``)."""
    schema = op._schema.arguments
    positional = [a for a in schema if not a.kwarg_only]
    keyword_only = {a.name: a for a in schema if a.kwarg_only}
    args = list(args)
    while (
        args and len(args) <= len(positional) and _is_default(args[-1], positional[len(args) - 1])
    ):
        args.pop()
    kwargs = {
        k: v
        for k, v in kwargs.items()
        if not (k in keyword_only and _is_default(v, keyword_only[k]))
    }
    return op, tuple(args), kwargs


# ---------------------------------------------------------------- elementwise


def _binary(tensor_op: Any, commutative: bool) -> Rule:
    """``a op b``: two tensors, or a tensor and a Python number (``2 * x`` is recorded
    as ``mul(x, 2)``, only for commutative operators)."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        if kwargs or len(args) != 2:
            return None
        a, b = args
        if _is_tensor(a) and (_is_tensor(b) or _is_number(b)):
            return tensor_op, (a, b), {}
        if commutative and _is_number(a) and _is_tensor(b):
            return tensor_op, (b, a), {}
        return None

    return rule


def _comparison(tensor_op: Any, scalar_op: Any) -> Rule:
    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        if kwargs or len(args) != 2 or not _is_tensor(args[0]):
            return None
        if _is_tensor(args[1]):
            return tensor_op, args, {}
        if _is_number(args[1]):
            return scalar_op, args, {}
        return None

    return rule


def _unary(op: Any) -> Rule:
    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        if kwargs or len(args) != 1 or not _is_tensor(args[0]):
            return None
        return op, args, {}

    return rule


def _activation(op: Any) -> Rule:
    """``F.relu(x, inplace=False)``, ``F.silu(x)``: in-place forms go through make_fx."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        bound = _bind(args, kwargs, ("input", "inplace"), {"inplace": False})
        if bound is None or bound["inplace"] is not False or not _is_tensor(bound["input"]):
            return None
        return op, (bound["input"],), {}

    return rule


def _gelu(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = _bind(args, kwargs, ("input", "approximate"), {"approximate": "none"})
    if bound is None or not _is_tensor(bound["input"]):
        return None
    if bound["approximate"] not in ("none", "tanh"):
        return None
    return _trimmed(aten.gelu.default, (bound["input"],), {"approximate": bound["approximate"]})


def _pow(args: tuple, kwargs: dict) -> AtenCall | None:
    if kwargs or len(args) != 2 or not _is_tensor(args[0]):
        return None
    if _is_tensor(args[1]):
        return aten.pow.Tensor_Tensor, args, {}
    if _is_number(args[1]):
        return aten.pow.Tensor_Scalar, args, {}
    return None


def _where(args: tuple, kwargs: dict) -> AtenCall | None:
    if kwargs or len(args) != 3 or not all(_is_tensor(a) for a in args[:2]):
        return None
    if _is_tensor(args[2]):
        return aten.where.self, args, {}
    if _is_number(args[2]):
        return aten.where.ScalarOther, args, {}
    return None


def _masked_fill(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = _bind(args, kwargs, ("input", "mask", "value"), {})
    if bound is None or not (_is_tensor(bound["input"]) and _is_tensor(bound["mask"])):
        return None
    if _is_number(bound["value"]):
        return aten.masked_fill.Scalar, (bound["input"], bound["mask"], bound["value"]), {}
    return None


# ---------------------------------------------------------------- reductions


def _reduction(full_op: Any, dim_op: Any) -> Rule:
    """``x.mean()``, ``x.mean(-1, keepdim=True)``, ``x.sum((0, 1))`` (no dtype)."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        bound = _bind(
            args,
            kwargs,
            ("input", "dim", "keepdim", "dtype"),
            {"dim": None, "keepdim": False, "dtype": None},
        )
        if bound is None or bound["dtype"] is not None or not _is_tensor(bound["input"]):
            return None
        dim, keepdim = bound["dim"], bound["keepdim"]
        if type(keepdim) is not bool:
            return None
        if dim is None:
            return (full_op, (bound["input"],), {}) if keepdim is False else None
        dims = [dim] if _is_dim(dim) else list(dim) if isinstance(dim, (tuple, list)) else None
        if not dims or not all(_is_dim(d) for d in dims):
            return None
        return _trimmed(dim_op, (bound["input"], dims, keepdim), {})

    return rule


def _softmax(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = _bind(
        args,
        kwargs,
        ("input", "dim", "_stacklevel", "dtype"),
        {"dim": None, "_stacklevel": 3, "dtype": None},
    )
    if bound is None or not _is_tensor(bound["input"]) or not _is_dim(bound["dim"]):
        return None
    if bound["dtype"] is not None:
        return None
    return aten.softmax.int, (bound["input"], bound["dim"]), {}


def _softmax_method(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = _bind(args, kwargs, ("input", "dim", "dtype"), {"dtype": None})
    if bound is None or bound["dtype"] is not None or not _is_dim(bound["dim"]):
        return None
    return aten.softmax.int, (bound["input"], bound["dim"]), {}


# ---------------------------------------------------------------- matrix products, norms


def _matmul(args: tuple, kwargs: dict) -> AtenCall | None:
    if kwargs or len(args) != 2 or not all(_is_tensor(a) for a in args):
        return None
    return aten.matmul.default, args, {}


def _addmm(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = _bind(args, kwargs, ("input", "mat1", "mat2", "beta", "alpha"), {"beta": 1, "alpha": 1})
    if bound is None or not all(_is_tensor(bound[k]) for k in ("input", "mat1", "mat2")):
        return None
    if not (_is_number(bound["beta"]) and _is_number(bound["alpha"])):
        return None
    return _trimmed(
        aten.addmm.default,
        (bound["input"], bound["mat1"], bound["mat2"]),
        {"beta": bound["beta"], "alpha": bound["alpha"]},
    )


def _linear(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = _bind(args, kwargs, ("input", "weight", "bias"), {"bias": None})
    if bound is None or not (_is_tensor(bound["input"]) and _is_tensor(bound["weight"])):
        return None
    if bound["bias"] is not None and not _is_tensor(bound["bias"]):
        return None
    return _trimmed(aten.linear.default, (bound["input"], bound["weight"], bound["bias"]), {})


def _layer_norm(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = _bind(
        args,
        kwargs,
        ("input", "normalized_shape", "weight", "bias", "eps"),
        {"weight": None, "bias": None, "eps": 1e-5},
    )
    if bound is None or not _is_tensor(bound["input"]):
        return None
    shape = bound["normalized_shape"]
    shape = [shape] if _is_dim(shape) else list(shape) if isinstance(shape, (tuple, list)) else None
    if not shape or not all(_is_size(s) for s in shape) or not _is_number(bound["eps"]):
        return None
    if any(bound[k] is not None and not _is_tensor(bound[k]) for k in ("weight", "bias")):
        return None
    call = (bound["input"], shape, bound["weight"], bound["bias"], bound["eps"])
    return _trimmed(aten.layer_norm.default, call, {})


def _attention(args: tuple, kwargs: dict) -> AtenCall | None:
    """``F.scaled_dot_product_attention`` on 4-d inputs without dropout: the one form
    the lowering keeps whole (others are lifted to 4-d or decomposed: make_fx)."""
    bound = _bind(
        args,
        kwargs,
        ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"),
        {
            "attn_mask": None,
            "dropout_p": 0.0,
            "is_causal": False,
            "scale": None,
            "enable_gqa": False,
        },
    )
    if bound is None or not all(_is_tensor(bound[k]) for k in ("query", "key", "value")):
        return None
    if any(bound[k].dim() != 4 for k in ("query", "key", "value")):
        return None
    mask, scale = bound["attn_mask"], bound["scale"]
    if (mask is not None and not _is_tensor(mask)) or (scale is not None and not _is_number(scale)):
        return None
    if bound["dropout_p"] not in (0, 0.0) or type(bound["dropout_p"]) not in (int, float):
        return None
    if type(bound["is_causal"]) is not bool or type(bound["enable_gqa"]) is not bool:
        return None
    call = (
        bound["query"],
        bound["key"],
        bound["value"],
        mask,
        bound["dropout_p"],
        bound["is_causal"],
    )
    keywords = {"scale": scale, "enable_gqa": bound["enable_gqa"]}
    return _trimmed(aten.scaled_dot_product_attention.default, call, keywords)


def _embedding(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = _bind(
        args,
        kwargs,
        ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse"),
        {
            "padding_idx": None,
            "max_norm": None,
            "norm_type": 2.0,
            "scale_grad_by_freq": False,
            "sparse": False,
        },
    )
    # max_norm renormalizes the weight in place; the others only change the gradient
    if bound is None or bound["max_norm"] is not None:
        return None
    if not (_is_tensor(bound["input"]) and _is_tensor(bound["weight"])):
        return None
    return _embedding_call(
        bound["weight"],
        bound["input"],
        bound["padding_idx"],
        bound["scale_grad_by_freq"],
        bound["sparse"],
    )


def _embedding_call(weight, indices, padding_idx, scale_grad_by_freq, sparse) -> AtenCall | None:
    if padding_idx is None:
        padding_idx = -1
    elif not _is_dim(padding_idx):
        return None
    elif padding_idx < 0:
        # F.embedding's normalization of a negative index
        padding_idx = weight.shape[0] + padding_idx
        if not _is_dim(padding_idx):
            return None
    if type(scale_grad_by_freq) is not bool or type(sparse) is not bool:
        return None
    call = (weight, indices, padding_idx, scale_grad_by_freq, sparse)
    return _trimmed(aten.embedding.default, call, {})


# ---------------------------------------------------------------- views and shapes


def _transpose(args: tuple, kwargs: dict) -> AtenCall | None:
    if kwargs or len(args) != 3 or not _is_tensor(args[0]):
        return None
    if not (_is_dim(args[1]) and _is_dim(args[2])):
        return None
    return aten.transpose.int, args, {}


def _unsqueeze(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = _bind(args, kwargs, ("input", "dim"), {})
    if bound is None or not _is_tensor(bound["input"]) or not _is_dim(bound["dim"]):
        return None
    return aten.unsqueeze.default, (bound["input"], bound["dim"]), {}


def with_sizes(op: Any) -> Rule:
    """``x.view(*sizes)``, ``x.expand(*sizes)``, ``x.permute(*dims)`` (a dtype given to
    ``view`` reinterprets the bytes: make_fx)."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        if kwargs or len(args) < 2 or not _is_tensor(args[0]):
            return None
        sizes = _shape_arguments(args[1:])
        if sizes is None:
            return None
        return op, (args[0], sizes), {}

    return rule


def function_with_sizes(op: Any, name: str) -> Rule:
    """``torch.permute(x, dims)``, ``torch.reshape(x, shape)``."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        bound = _bind(args, kwargs, ("input", name), {})
        if bound is None or not _is_tensor(bound["input"]):
            return None
        if not isinstance(bound[name], (tuple, list)):
            return None
        sizes = _shape_arguments((bound[name],))
        return None if sizes is None else (op, (bound["input"], sizes), {})

    return rule


def _cat(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = _bind(args, kwargs, ("tensors", "dim"), {"dim": 0})
    if bound is None or not isinstance(bound["tensors"], (tuple, list)):
        return None
    tensors = list(bound["tensors"])
    if not tensors or not all(_is_tensor(t) for t in tensors) or not _is_dim(bound["dim"]):
        return None
    return _trimmed(aten.cat.default, (tensors, bound["dim"]), {})


def _getitem(args: tuple, kwargs: dict) -> AtenCall | None:
    """Basic indexing that torch records as one ``slice`` or one ``unsqueeze``:
    ``x[..., a:b]``, ``x[a:b]``, ``x[..., None]``, ``x[None]`` (torch writes a ``slice``
    per slice, full ones included, so longer indexes make chains whose intermediate
    values the capture does not have: make_fx)."""
    if kwargs or len(args) != 2 or not _is_tensor(args[0]):
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
    stop = _INT64_MAX if item.stop is None else item.stop
    step = 1 if item.step is None else item.step
    if not (_is_size(start) and _is_size(stop) and _is_dim(step) and step > 0):
        return None
    dim = 0 if first else tensor.dim() - 1
    return _trimmed(aten.slice.Tensor, (tensor, dim, start, stop, step), {})


# ---------------------------------------------------------------- tables

_BINARY = {
    operator.add: _binary(aten.add.Tensor, True),
    operator.sub: _binary(aten.sub.Tensor, False),
    operator.mul: _binary(aten.mul.Tensor, True),
    operator.truediv: _binary(aten.div.Tensor, False),
}
_COMPARISONS = {
    operator.eq: _comparison(aten.eq.Tensor, aten.eq.Scalar),
    operator.ne: _comparison(aten.ne.Tensor, aten.ne.Scalar),
    operator.lt: _comparison(aten.lt.Tensor, aten.lt.Scalar),
    operator.le: _comparison(aten.le.Tensor, aten.le.Scalar),
    operator.gt: _comparison(aten.gt.Tensor, aten.gt.Scalar),
    operator.ge: _comparison(aten.ge.Tensor, aten.ge.Scalar),
}
_UNARY_NAMES = ("neg", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "abs")

#: call_function target -> rule
FUNCTION_RULES: dict[Any, Rule] = {
    **_BINARY,
    **_COMPARISONS,
    operator.neg: _unary(aten.neg.default),
    operator.pow: _pow,
    operator.matmul: _matmul,
    operator.getitem: _getitem,
    torch.add: _binary(aten.add.Tensor, False),
    torch.sub: _binary(aten.sub.Tensor, False),
    torch.mul: _binary(aten.mul.Tensor, False),
    torch.div: _binary(aten.div.Tensor, False),
    torch.pow: _pow,
    torch.matmul: _matmul,
    torch.addmm: _addmm,
    torch.cat: _cat,
    torch.concat: _cat,
    torch.where: _where,
    torch.transpose: _transpose,
    torch.unsqueeze: _unsqueeze,
    torch.permute: function_with_sizes(aten.permute.default, "dims"),
    torch.softmax: _softmax_method,
    F.softmax: _softmax,
    F.linear: _linear,
    F.layer_norm: _layer_norm,
    F.scaled_dot_product_attention: _attention,
    F.embedding: _embedding,
    F.gelu: _gelu,
    F.relu: _activation(aten.relu.default),
    F.silu: _activation(aten.silu.default),
    torch.relu: _unary(aten.relu.default),
    **{getattr(torch, name): _unary(getattr(aten, name).default) for name in _UNARY_NAMES},
}

#: call_method name -> rule
METHOD_RULES: dict[str, Rule] = {
    "add": _binary(aten.add.Tensor, False),
    "sub": _binary(aten.sub.Tensor, False),
    "mul": _binary(aten.mul.Tensor, False),
    "div": _binary(aten.div.Tensor, False),
    "pow": _pow,
    "matmul": _matmul,
    "transpose": _transpose,
    "unsqueeze": _unsqueeze,
    "view": with_sizes(aten.view.default),
    "expand": with_sizes(aten.expand.default),
    "permute": with_sizes(aten.permute.default),
    "mean": _reduction(aten.mean.default, aten.mean.dim),
    "sum": _reduction(aten.sum.default, aten.sum.dim_IntList),
    "softmax": _softmax_method,
    "masked_fill": _masked_fill,
    "relu": _unary(aten.relu.default),
    **{name: _unary(getattr(aten, name).default) for name in _UNARY_NAMES},
}


def module_call(module: torch.nn.Module, args: tuple, kwargs: dict) -> AtenCall | None:
    """``nn.Linear``, ``nn.Embedding``, ``nn.LayerNorm`` and the activations, exactly
    these classes (a subclass may override ``forward``) and without hooks."""
    hooks = torch.nn.modules.module
    if module._forward_hooks or module._forward_pre_hooks:
        return None
    if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
        return None
    kind = type(module)
    if kind is torch.nn.Linear:
        return _linear((*args, module.weight, module.bias), kwargs) if len(args) == 1 else None
    if kind is torch.nn.Embedding:
        if kwargs or len(args) != 1 or module.max_norm is not None or not _is_tensor(args[0]):
            return None
        return _embedding_call(
            module.weight, args[0], module.padding_idx, module.scale_grad_by_freq, module.sparse
        )
    if kind is torch.nn.LayerNorm:
        if kwargs or len(args) != 1:
            return None
        return _layer_norm(
            (args[0], module.normalized_shape, module.weight, module.bias, module.eps), {}
        )
    if kind in (torch.nn.ReLU, torch.nn.SiLU) and not module.inplace:
        op = aten.relu.default if kind is torch.nn.ReLU else aten.silu.default
        return _unary(op)(args, kwargs)
    if kind is torch.nn.GELU:
        return _gelu(args, {"approximate": module.approximate, **kwargs})
    return None
