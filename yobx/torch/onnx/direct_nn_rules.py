"""Direct lowering rules of neural-network operators: matrix products, normalizations,
attention, embeddings, convolutions, activations, and the module forms of these."""

from __future__ import annotations

import operator
from typing import Any

import torch

from yobx.torch.onnx.direct_arguments import (
    AtenCall,
    Rule,
    bind,
    is_dim,
    is_number,
    is_optional_tensor,
    is_size,
    is_tensor,
    per_dimension,
    trimmed,
)
from yobx.torch.tracing.shape_rules.resample import INTERPOLATE_DEFAULTS, INTERPOLATE_PARAMETERS

aten = torch.ops.aten
F = torch.nn.functional


def unary(op: Any) -> Rule:
    """The rule of a one-tensor operator without options (``torch.relu(x)``,
    ``x.exp()``, ``nn.SiLU()``)."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        if kwargs or len(args) != 1 or not is_tensor(args[0]):
            return None
        return op, args, {}

    return rule


def _activation(op: Any) -> Rule:
    """``F.relu(x, inplace=False)``, ``F.silu(x)``: in-place forms go through make_fx."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        bound = bind(args, kwargs, ("input", "inplace"), {"inplace": False})
        if bound is None or bound["inplace"] is not False or not is_tensor(bound["input"]):
            return None
        return op, (bound["input"],), {}

    return rule


def _gelu(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = bind(args, kwargs, ("input", "approximate"), {"approximate": "none"})
    if bound is None or not is_tensor(bound["input"]):
        return None
    if bound["approximate"] not in ("none", "tanh"):
        return None
    return trimmed(aten.gelu.default, (bound["input"],), {"approximate": bound["approximate"]})


def _matmul(args: tuple, kwargs: dict) -> AtenCall | None:
    if kwargs or len(args) != 2 or not all(is_tensor(a) for a in args):
        return None
    return aten.matmul.default, args, {}


def _addmm(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = bind(args, kwargs, ("input", "mat1", "mat2", "beta", "alpha"), {"beta": 1, "alpha": 1})
    if bound is None or not all(is_tensor(bound[k]) for k in ("input", "mat1", "mat2")):
        return None
    if not (is_number(bound["beta"]) and is_number(bound["alpha"])):
        return None
    return trimmed(
        aten.addmm.default,
        (bound["input"], bound["mat1"], bound["mat2"]),
        {"beta": bound["beta"], "alpha": bound["alpha"]},
    )


def _convolution(op: Any, rank: int) -> Rule:
    """``F.conv2d(x, w, b, stride, padding, dilation, groups)`` with numeric padding (a
    string padding is another overload: make_fx)."""

    def rule(args: tuple, kwargs: dict) -> AtenCall | None:
        bound = bind(
            args,
            kwargs,
            ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
            {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1},
        )
        if bound is None or not (is_tensor(bound["input"]) and is_tensor(bound["weight"])):
            return None
        if not is_optional_tensor(bound["bias"]):
            return None
        geometry = [per_dimension(bound[k], rank) for k in ("stride", "padding", "dilation")]
        if any(g is None for g in geometry) or not is_dim(bound["groups"]):
            return None
        call = (bound["input"], bound["weight"], bound["bias"], *geometry, bound["groups"])
        return trimmed(op, call, {})

    return rule


def _linear(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = bind(args, kwargs, ("input", "weight", "bias"), {"bias": None})
    if bound is None or not (is_tensor(bound["input"]) and is_tensor(bound["weight"])):
        return None
    if not is_optional_tensor(bound["bias"]):
        return None
    return trimmed(aten.linear.default, (bound["input"], bound["weight"], bound["bias"]), {})


def _layer_norm(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = bind(
        args,
        kwargs,
        ("input", "normalized_shape", "weight", "bias", "eps"),
        {"weight": None, "bias": None, "eps": 1e-5},
    )
    if bound is None or not is_tensor(bound["input"]):
        return None
    shape = bound["normalized_shape"]
    shape = [shape] if is_dim(shape) else list(shape) if isinstance(shape, (tuple, list)) else None
    if not shape or not all(is_size(s) for s in shape) or not is_number(bound["eps"]):
        return None
    if not (is_optional_tensor(bound["weight"]) and is_optional_tensor(bound["bias"])):
        return None
    call = (bound["input"], shape, bound["weight"], bound["bias"], bound["eps"])
    return trimmed(aten.layer_norm.default, call, {})


def _group_norm(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = bind(
        args,
        kwargs,
        ("input", "num_groups", "weight", "bias", "eps"),
        {"weight": None, "bias": None, "eps": 1e-5},
    )
    if bound is None or not is_tensor(bound["input"]) or not is_dim(bound["num_groups"]):
        return None
    if not (is_optional_tensor(bound["weight"]) and is_optional_tensor(bound["bias"])):
        return None
    if not is_number(bound["eps"]):
        return None
    call = (bound["input"], bound["num_groups"], bound["weight"], bound["bias"], bound["eps"])
    return trimmed(aten.group_norm.default, call, {})


_UPSAMPLING = {
    "nearest": aten.upsample_nearest2d.vec,
    "bilinear": aten.upsample_bilinear2d.vec,
    "bicubic": aten.upsample_bicubic2d.vec,
}


def _interpolate(args: tuple, kwargs: dict) -> AtenCall | None:
    """``F.interpolate`` of a 4-d tensor to a given ``size`` (a vision transformer's
    position table, 380 ms through make_fx on symbolic sizes): the ``upsample_*2d.vec``
    overload torch records; a scale factor or antialiasing go through make_fx."""
    bound = bind(args, kwargs, INTERPOLATE_PARAMETERS, INTERPOLATE_DEFAULTS)
    if bound is None or not is_tensor(bound["input"]) or bound["input"].dim() != 4:
        return None
    if bound["scale_factor"] is not None or bound["recompute_scale_factor"] is not None:
        return None
    op = _UPSAMPLING.get(bound["mode"]) if isinstance(bound["mode"], str) else None
    size = bound["size"]
    size = (
        [size, size] if is_size(size) else list(size) if isinstance(size, (tuple, list)) else None
    )
    if op is None or bound["antialias"] is not False or not size or len(size) != 2:
        return None
    if not all(is_size(s) for s in size):
        return None
    if bound["mode"] == "nearest":
        if bound["align_corners"] is not None:
            return None
        return op, (bound["input"], size, None), {}
    align_corners = False if bound["align_corners"] is None else bound["align_corners"]
    if type(align_corners) is not bool:
        return None
    return op, (bound["input"], size, align_corners, None), {}


def _attention(args: tuple, kwargs: dict) -> AtenCall | None:
    """``F.scaled_dot_product_attention`` on 4-d inputs without dropout: the one form
    the lowering keeps whole (others are lifted to 4-d or decomposed: make_fx)."""
    bound = bind(
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
    if bound is None or not all(is_tensor(bound[k]) for k in ("query", "key", "value")):
        return None
    if any(bound[k].dim() != 4 for k in ("query", "key", "value")):
        return None
    mask, scale = bound["attn_mask"], bound["scale"]
    if not is_optional_tensor(mask) or (scale is not None and not is_number(scale)):
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
    return trimmed(aten.scaled_dot_product_attention.default, call, keywords)


def _embedding(args: tuple, kwargs: dict) -> AtenCall | None:
    bound = bind(
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
    if not (is_tensor(bound["input"]) and is_tensor(bound["weight"])):
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
    elif not is_dim(padding_idx):
        return None
    elif padding_idx < 0:
        # F.embedding's normalization of a negative index
        padding_idx = weight.shape[0] + padding_idx
        if not is_dim(padding_idx):
            return None
    if type(scale_grad_by_freq) is not bool or type(sparse) is not bool:
        return None
    call = (weight, indices, padding_idx, scale_grad_by_freq, sparse)
    return trimmed(aten.embedding.default, call, {})


#: call_function target -> rule
NN_FUNCTION_RULES: dict[Any, Rule] = {
    operator.matmul: _matmul,
    torch.matmul: _matmul,
    torch.addmm: _addmm,
    F.linear: _linear,
    F.layer_norm: _layer_norm,
    F.group_norm: _group_norm,
    F.conv1d: _convolution(aten.conv1d.default, 1),
    F.conv2d: _convolution(aten.conv2d.default, 2),
    F.conv3d: _convolution(aten.conv3d.default, 3),
    F.scaled_dot_product_attention: _attention,
    F.interpolate: _interpolate,
    F.embedding: _embedding,
    F.gelu: _gelu,
    F.relu: _activation(aten.relu.default),
    F.silu: _activation(aten.silu.default),
    torch.relu: unary(aten.relu.default),
}

#: call_method name -> rule
NN_METHOD_RULES: dict[str, Rule] = {
    "matmul": _matmul,
    "relu": unary(aten.relu.default),
}

_CONVOLUTION_MODULES = {
    torch.nn.Conv1d: (aten.conv1d.default, 1),
    torch.nn.Conv2d: (aten.conv2d.default, 2),
    torch.nn.Conv3d: (aten.conv3d.default, 3),
}
_POOLING_MODULES = {
    torch.nn.MaxPool1d: (aten.max_pool1d.default, 1),
    torch.nn.MaxPool2d: (aten.max_pool2d.default, 2),
}


def _max_pool(module: Any, args: tuple, kwargs: dict) -> AtenCall | None:
    """``nn.MaxPool1d/2d`` without indices (their module stores the stride, the kernel
    size when it was not given)."""
    if kwargs or len(args) != 1 or not is_tensor(args[0]) or module.return_indices:
        return None
    op, rank = _POOLING_MODULES[type(module)]
    geometry = [
        per_dimension(getattr(module, k), rank)
        for k in ("kernel_size", "stride", "padding", "dilation")
    ]
    if any(g is None for g in geometry) or type(module.ceil_mode) is not bool:
        return None
    return trimmed(op, (args[0], *geometry, module.ceil_mode), {})


def module_call(module: torch.nn.Module, args: tuple, kwargs: dict) -> AtenCall | None:
    """``nn.Linear``, ``nn.Embedding``, ``nn.LayerNorm``, ``nn.GroupNorm``, convolutions
    with zero padding,
    max pooling and the activations, exactly these classes (a subclass may override
    ``forward``) and without hooks."""
    hooks = torch.nn.modules.module
    if module._forward_hooks or module._forward_pre_hooks:
        return None
    if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
        return None
    kind = type(module)
    if kind is torch.nn.Linear:
        return _linear((*args, module.weight, module.bias), kwargs) if len(args) == 1 else None
    if kind is torch.nn.Embedding:
        if kwargs or len(args) != 1 or module.max_norm is not None or not is_tensor(args[0]):
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
        return unary(op)(args, kwargs)
    if kind is torch.nn.GroupNorm:
        if kwargs or len(args) != 1:
            return None
        call = (args[0], module.num_groups, module.weight, module.bias, module.eps)
        return _group_norm(call, {})
    if kind in _CONVOLUTION_MODULES:
        if kwargs or len(args) != 1 or module.padding_mode != "zeros":
            return None
        op, rank = _CONVOLUTION_MODULES[kind]
        geometry = (module.stride, module.padding, module.dilation, module.groups)
        return _convolution(op, rank)((args[0], module.weight, module.bias, *geometry), {})
    if kind in _POOLING_MODULES:
        return _max_pool(module, args, kwargs)
    if kind is torch.nn.GELU:
        return _gelu(args, {"approximate": module.approximate, **kwargs})
    return None
