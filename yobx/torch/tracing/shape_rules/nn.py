"""Shape rules of the costly building blocks of transformers: matrix products,
normalizations, softmax, reductions, concatenation, embeddings, and the ``torch.nn``
leaf modules made of them.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._prims_common import suggest_memory_format

from . import elementwise
from ._base import (
    FLOATING,
    TensorFactory,
    Unsupported,
    broadcast_shapes,
    common_device,
    exactly_contiguous,
    fake,
    is_static,
    needs_grad,
    normalize_dim,
    require_contiguous,
    same_size,
)


def _float_operands(*tensors: torch.Tensor) -> torch.dtype:
    dtype = tensors[0].dtype
    if dtype not in FLOATING or any(t.dtype != dtype for t in tensors):
        raise Unsupported("not floating tensors of one dtype")
    return dtype


def _linear(factory, x, weight, bias) -> torch.Tensor:
    if x.dim() < 2 or weight.dim() != 2:
        raise Unsupported("1-D input or weight")
    tensors = [x, weight] + ([bias] if bias is not None else [])
    dtype = _float_operands(*tensors)
    if not same_size(x.shape[-1], weight.shape[1]):
        raise Unsupported("inner dimensions")
    if bias is not None and (bias.dim() != 1 or not same_size(bias.shape[0], weight.shape[0])):
        raise Unsupported("bias shape")
    device = common_device(tensors)
    return factory.new([*x.shape[:-1], weight.shape[0]], dtype, device, needs_grad(tensors))


def linear(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``F.linear(x, weight, bias=None)``."""
    if set(kwargs) - {"bias"} or len(args) not in (2, 3):
        raise Unsupported("unexpected arguments")
    bias = kwargs.get("bias", args[2] if len(args) == 3 else None)
    return _linear(factory, fake(args[0]), args[1], bias)


def matmul(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``a @ b`` with both operands at least 2-D.

    ATen computes these through ``mm``/``bmm`` and a final view: the output is
    contiguous. The one exception, a 2-D ``a`` times a batched ``b`` (computed
    transposed), falls back.
    """
    if kwargs or len(args) != 2:
        raise Unsupported("unexpected arguments")
    a, b = fake(args[0]), fake(args[1])
    if a.dim() < 2 or b.dim() < 2 or (a.dim() == 2 and b.dim() > 2):
        raise Unsupported("1-D operand or transposed computation")
    dtype = _float_operands(a, b)
    if not same_size(a.shape[-1], b.shape[-2]):
        raise Unsupported("inner dimensions")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    device = common_device([a, b])
    return factory.new([*batch, a.shape[-2], b.shape[-1]], dtype, device, needs_grad([a, b]))


def bmm(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``torch.bmm(a, b)``: 3-D operands with the same batch size (no broadcasting)."""
    if kwargs or len(args) != 2:
        raise Unsupported("unexpected arguments")
    a, b = fake(args[0]), fake(args[1])
    if a.dim() != 3 or b.dim() != 3 or not same_size(a.shape[0], b.shape[0]):
        raise Unsupported("bmm shapes")
    return matmul(factory, args, kwargs)


def addmm(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``torch.addmm(bias, a, b)`` (Hugging Face's Conv1D)."""
    if kwargs or len(args) != 3:
        raise Unsupported("alpha, beta")
    bias, a, b = (fake(t) for t in args)
    if a.dim() != 2 or b.dim() != 2 or not same_size(a.shape[1], b.shape[0]):
        raise Unsupported("shapes")
    dtype = _float_operands(bias, a, b)
    out = [a.shape[0], b.shape[1]]
    shape = broadcast_shapes(bias.shape, out)
    if not all(same_size(x, y) for x, y in zip(shape, out)):
        raise Unsupported("bias broadcasts the product")
    device = common_device([bias, a, b])
    return factory.new(out, dtype, device, needs_grad([bias, a, b]))


def _softmax(factory, args, kwargs) -> torch.Tensor:
    allowed = {"dim", "dtype", "_stacklevel"}
    if set(kwargs) - allowed or len(args) > 3:
        raise Unsupported("unexpected arguments")
    x = fake(args[0])
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    dtype = kwargs.get("dtype", args[2] if len(args) > 2 and not isinstance(args[2], int) else None)
    if dim is None or x.dtype not in FLOATING or (dtype is not None and dtype not in FLOATING):
        raise Unsupported("implicit dim or non-floating input")
    normalize_dim(dim, x.dim())
    require_contiguous(x)
    return factory.new(x.shape, dtype or x.dtype, x.device, needs_grad([x]))


def _reduction(factory, args, kwargs) -> torch.Tensor:
    """``mean``/``sum`` over explicit dimensions of a floating tensor."""
    if set(kwargs) - {"dim", "keepdim"} or len(args) > 3:
        raise Unsupported("unexpected arguments")
    x = fake(args[0])
    dims = kwargs.get("dim", args[1] if len(args) > 1 else None)
    keepdim = kwargs.get("keepdim", args[2] if len(args) > 2 else False)
    if dims is None or type(keepdim) is not bool or x.dtype not in FLOATING:
        raise Unsupported("full reduction, dtype")
    dims = [dims] if type(dims) is int else list(dims)
    rank = x.dim()
    reduced = {normalize_dim(d, rank) for d in dims}
    if not reduced or len(reduced) != len(dims):
        raise Unsupported("repeated dimensions")
    require_contiguous(x)
    shape = []
    for i, size in enumerate(x.shape):
        if i in reduced:
            if is_static(size, 0):
                raise Unsupported("empty reduction")
            if keepdim:
                shape.append(1)
        else:
            shape.append(size)
    return factory.new(shape, x.dtype, x.device, needs_grad([x]))


def cat(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``torch.cat(tensors, dim)`` of exactly contiguous tensors of one dtype."""
    if set(kwargs) - {"dim"} or len(args) not in (1, 2):
        raise Unsupported("unexpected arguments")
    tensors = args[0]
    dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise Unsupported("not a sequence")
    tensors = [fake(t) for t in tensors]
    rank = tensors[0].dim()
    dtype = tensors[0].dtype
    if rank == 0 or any(t.dim() != rank or t.dtype != dtype for t in tensors):
        raise Unsupported("ranks or dtypes differ")
    dim = normalize_dim(dim, rank)
    if not all(exactly_contiguous(t) for t in tensors) and any(
        suggest_memory_format(t) != torch.contiguous_format for t in tensors[:1]
    ):
        raise Unsupported("the first input suggests another memory format")
    shape = list(tensors[0].shape)
    total: Any = shape[dim]
    for tensor in tensors[1:]:
        for i, size in enumerate(tensor.shape):
            if i == dim:
                total = total + size
            elif not same_size(size, shape[i]):
                raise Unsupported("other dimensions differ")
    shape[dim] = total
    device = common_device(tensors)
    grad = needs_grad(tensors) and dtype.is_floating_point
    return factory.new(shape, dtype, device, grad)


def _layer_norm(factory, x, normalized_shape, weight, bias) -> torch.Tensor:
    x = fake(x)
    normalized = list(normalized_shape)
    if not normalized or len(normalized) > x.dim():
        raise Unsupported("normalized shape")
    tail = x.shape[x.dim() - len(normalized) :]
    if not all(same_size(a, b) for a, b in zip(tail, normalized)):
        raise Unsupported("normalized shape differs")
    tensors = [t for t in (x, weight, bias) if t is not None]
    _float_operands(*tensors)
    require_contiguous(x)
    device = common_device(tensors)
    return factory.new(x.shape, x.dtype, device, needs_grad(tensors))


def layer_norm(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``F.layer_norm(x, normalized_shape, weight, bias, eps)``."""
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    bound = dict(zip(names, args))
    if set(kwargs) - set(names) or len(args) > len(names):
        raise Unsupported("unexpected arguments")
    bound.update(kwargs)
    return _layer_norm(
        factory, bound["input"], bound["normalized_shape"], bound.get("weight"), bound.get("bias")
    )


def _embedding(factory, indices, weight) -> torch.Tensor:
    indices = fake(indices)
    if weight.dim() != 2 or indices.dtype not in (torch.int64, torch.int32):
        raise Unsupported("embedding shapes")
    device = common_device([indices, weight])
    grad = needs_grad([weight])
    return factory.new([*indices.shape, weight.shape[1]], weight.dtype, device, grad)


def embedding(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``F.embedding(indices, weight)`` without ``max_norm`` (which writes the weight)."""
    if len(args) != 2 or kwargs.get("max_norm") is not None:
        raise Unsupported("max_norm or unexpected arguments")
    return _embedding(factory, args[0], args[1])


# leaf modules: an exact type match only, a subclass may override forward


def linear_module(factory, module: nn.Linear, args, kwargs) -> torch.Tensor:
    if kwargs or len(args) != 1:
        raise Unsupported("unexpected arguments")
    weight, bias = factory.parameter(module.weight), factory.parameter(module.bias)
    return _linear(factory, fake(args[0]), weight, bias)


def layer_norm_module(factory, module: nn.LayerNorm, args, kwargs) -> torch.Tensor:
    if kwargs or len(args) != 1:
        raise Unsupported("unexpected arguments")
    weight, bias = factory.parameter(module.weight), factory.parameter(module.bias)
    return _layer_norm(factory, args[0], module.normalized_shape, weight, bias)


def embedding_module(factory, module: nn.Embedding, args, kwargs) -> torch.Tensor:
    if kwargs or len(args) != 1 or module.max_norm is not None:
        raise Unsupported("max_norm or unexpected arguments")
    return _embedding(factory, args[0], factory.parameter(module.weight))


def activation_module(factory, module: nn.Module, args, kwargs) -> torch.Tensor:
    if kwargs or len(args) != 1 or getattr(module, "inplace", False):
        raise Unsupported("in-place or unexpected arguments")
    if isinstance(module, nn.ReLU):
        return elementwise.numeric_unary(factory, args, {})
    return elementwise.float_unary(factory, args, {})


def _eval_dropout(x: Any, p: Any, training: Any, inplace: Any) -> torch.Tensor:
    """Dropout outside training returns its input itself (ATen's ``dropout``: ``if
    (!train) return input``); training and in-place forms go to torch."""
    if training is not False or inplace is not False:
        raise Unsupported("dropout in training or in place")
    if type(p) not in (int, float) or not 0.0 <= p <= 1.0:
        raise Unsupported("dropout probability")
    return fake(x)


def dropout(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``F.dropout(input, p=0.5, training=True, inplace=False)`` with ``training=False``."""
    names = ("input", "p", "training", "inplace")
    if len(args) > len(names) or set(kwargs) - set(names):
        raise Unsupported("unexpected arguments")
    bound = {"p": 0.5, "training": True, "inplace": False, **dict(zip(names, args)), **kwargs}
    if "input" not in bound:
        raise Unsupported("no input")
    return _eval_dropout(bound["input"], bound["p"], bound["training"], bound["inplace"])


def dropout_module(factory, module: nn.Dropout, args, kwargs) -> torch.Tensor:
    """``nn.Dropout`` in eval mode: its input itself."""
    if kwargs or len(args) != 1:
        raise Unsupported("unexpected arguments")
    return _eval_dropout(args[0], module.p, module.training, module.inplace)


def encoder_layer_module(factory, module: nn.TransformerEncoderLayer, args, kwargs):
    """A ``TransformerEncoderLayer`` returns a tensor shaped like its input.

    Every sub-block is residual (``x + sa(x)``, ``x + ff(x)``), so the output has the
    shape of ``src``; masks only change values. They must be absent or tensors whose
    shapes broadcast (checked at run time by the module itself).
    """
    names = ("src", "src_mask", "src_key_padding_mask", "is_causal")
    if set(kwargs) - set(names) or len(args) > len(names):
        raise Unsupported("unexpected arguments")
    bound = {**dict(zip(names, args)), **kwargs}
    if bound.get("src_mask") is not None or bound.get("src_key_padding_mask") is not None:
        raise Unsupported("masks")
    src = fake(bound["src"])
    embed = module.self_attn.embed_dim
    if src.dim() not in (2, 3) or not same_size(src.shape[-1], embed):
        raise Unsupported("input shape")
    params = list(module.parameters())
    _float_operands(src, *params)
    require_contiguous(src)
    return factory.new(src.shape, src.dtype, src.device, needs_grad([src, *params]))


FUNCTION_RULES: dict[Any, Any] = {
    F.linear: linear,
    torch.matmul: matmul,
    operator.matmul: matmul,
    torch.bmm: bmm,
    torch.addmm: addmm,
    torch.softmax: _softmax,
    torch.log_softmax: _softmax,
    F.softmax: _softmax,
    F.log_softmax: _softmax,
    torch.mean: _reduction,
    torch.sum: _reduction,
    torch.cat: cat,
    torch.concat: cat,
    F.layer_norm: layer_norm,
    F.embedding: embedding,
    F.dropout: dropout,
}

METHOD_RULES: dict[str, Any] = {
    "matmul": matmul,
    "bmm": bmm,
    "softmax": _softmax,
    "log_softmax": _softmax,
    "mean": _reduction,
    "sum": _reduction,
}

MODULE_RULES: dict[type, Any] = {
    nn.Linear: linear_module,
    nn.LayerNorm: layer_norm_module,
    nn.Embedding: embedding_module,
    nn.ReLU: activation_module,
    nn.GELU: activation_module,
    nn.SiLU: activation_module,
    nn.Tanh: activation_module,
    nn.Sigmoid: activation_module,
    nn.TransformerEncoderLayer: encoder_layer_module,
    nn.Dropout: dropout_module,
}
