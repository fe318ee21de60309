"""Shape rules of elementwise operations: unary, binary, comparisons, ``where``,
``masked_fill``, and ``triu``/``tril`` (a masked copy of their input).

The output of an elementwise operation on exactly contiguous inputs is a fresh
contiguous tensor of the broadcast shape. The dtype follows torch's promotion for
the cases handled here (all tensors of one dtype, Python scalars of a compatible
kind); anything else falls back to torch.
"""

from __future__ import annotations

import operator
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch._prims_common import is_contiguous_for_memory_format_or_false
from torch._subclasses.fake_tensor import FakeTensor

from ._base import (
    FLOATING,
    INTEGRAL,
    TensorFactory,
    Unsupported,
    broadcast_shapes,
    common_device,
    exactly_contiguous,
    is_one,
    needs_grad,
    size_key,
)
from ._strides import decided_contiguity, elementwise_output_strides

_INT_SCALARS = (int, torch.SymInt)
_FLOAT_SCALARS = (float, torch.SymFloat)


def _operand_dtype(operands: tuple[Any, ...]) -> tuple[list[torch.Tensor], torch.dtype]:
    """The tensors among ``operands`` and the dtype torch promotes them to."""
    tensors = [a for a in operands if isinstance(a, torch.Tensor)]
    if not tensors:
        raise Unsupported("no tensor operand")
    dtype = tensors[0].dtype
    for tensor in tensors[1:]:
        if tensor.dtype != dtype:
            raise Unsupported("mixed dtypes")
    for scalar in operands:
        if isinstance(scalar, (torch.Tensor, bool)):
            continue
        if isinstance(scalar, _INT_SCALARS):
            if dtype == torch.bool:
                raise Unsupported("int scalar with a bool tensor")
        elif isinstance(scalar, _FLOAT_SCALARS):
            if dtype not in FLOATING:
                raise Unsupported("float scalar with a non-float tensor")
        else:
            raise Unsupported(f"operand {type(scalar).__name__}")
    return tensors, dtype


def _elementwise(
    factory: TensorFactory,
    operands: tuple[Any, ...],
    out_dtype: Any = None,
    fast_binary: bool = False,
) -> torch.Tensor:
    tensors, dtype = _operand_dtype(operands)
    shape = broadcast_shapes(*(t.shape for t in tensors))
    device = common_device(tensors)
    if out_dtype is not None:
        dtype = out_dtype
    grad = needs_grad(tensors) and dtype.is_floating_point
    strides = output_strides(factory, tensors, shape, fast_binary)
    return factory.new(shape, dtype, device, grad, strides)


def output_strides(
    factory: TensorFactory, tensors: list[torch.Tensor], shape: list[Any], fast_binary: bool
) -> Any:
    """The strides torch gives an elementwise result, ``None`` for contiguous ones.

    ``fast_binary`` follows FakeTensor's fast path for add/sub/mul/div (any operand
    with the output's shape and all contiguous: a contiguous result); otherwise the
    layout is torch's own ``compute_elementwise_output_strides`` of the inputs
    broadcast to the output shape (:func:`~._strides.elementwise_output_strides`).

    A function of the sizes and strides of the operands and of the output shape only:
    memoized (a repeated layer adds the same bias, with permuted strides, to the same
    scores; its contiguity tests and broadcast views are then computed once).
    """
    return factory.memoized(
        _OUTPUT_STRIDES[fast_binary],
        tensors,
        lambda: _output_strides(factory, tensors, shape, fast_binary),
        shape,
    )


_OUTPUT_STRIDES = {True: "output_strides_fast_binary", False: "output_strides"}


def _output_strides(
    factory: TensorFactory, tensors: list[torch.Tensor], shape: list[Any], fast_binary: bool
) -> Any:
    keys = [size_key(s) for s in shape]
    full = [[size_key(s) for s in t.shape] == keys for t in tensors]
    if fast_binary and any(full):
        # exactly contiguous (structural, cheap) implies torch's is_contiguous, whose
        # symbolic evaluation costs a few hundred microseconds per tensor
        if all(
            exactly_contiguous(t) or _is_contiguous(t, torch.contiguous_format) for t in tensors
        ):
            return None
        if all(_is_contiguous(t, torch.channels_last) for t in tensors):
            raise Unsupported("channels-last inputs")
    elif all(full) and 1 not in keys and all(exactly_contiguous(t) for t in tensors):
        # no broadcasting, no size-1 dimension: torch's layout search keeps the order
        return None
    expanded = [
        # the operands are the nodes' fake values
        t if is_full else factory.view(cast(FakeTensor, t), shape, _expanded(t, shape))
        for t, is_full in zip(tensors, full)
    ]
    return elementwise_output_strides(factory.fake_mode.shape_env, expanded)


def _is_contiguous(tensor: torch.Tensor, memory_format: torch.memory_format) -> bool:
    """torch's ``is_contiguous_for_memory_format_or_false``: settled from the ranges of
    the dimensions when they decide it (the same comparisons, no sympy), else torch's."""
    if tensor.dim() != 4 and memory_format == torch.channels_last:
        return False
    decided = decided_contiguity(tensor, memory_format)
    if decided is not None:
        return decided
    return is_contiguous_for_memory_format_or_false(tensor, memory_format=memory_format)


def _expanded(tensor: torch.Tensor, shape: list[Any]) -> list[Any]:
    """Strides of ``tensor.expand(shape)``: 0 on broadcast dimensions."""
    offset = len(shape) - tensor.dim()
    strides: list[Any] = [0] * offset
    for size, out, stride in zip(tensor.shape, shape[offset:], tensor.stride()):
        strides.append(0 if is_one(size) and not is_one(out) else stride)
    return strides


def _no_kwargs(kwargs: dict) -> None:
    if kwargs:
        raise Unsupported(f"keyword arguments {sorted(kwargs)}")


def arithmetic(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """add, mul: the promoted dtype."""
    _no_kwargs(kwargs)
    return _elementwise(factory, args, fast_binary=len(args) == 2)


def arithmetic_no_bool(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """sub, neg: torch refuses bool tensors, let it say so."""
    _no_kwargs(kwargs)
    _, dtype = _operand_dtype(args)
    if dtype == torch.bool:
        raise Unsupported("bool subtraction")
    return _elementwise(factory, args, fast_binary=len(args) == 2)


def true_divide(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``/``: floating inputs only (integers promote to the default dtype)."""
    _no_kwargs(kwargs)
    _, dtype = _operand_dtype(args)
    if dtype not in FLOATING:
        raise Unsupported("integer division")
    return _elementwise(factory, args, fast_binary=len(args) == 2)


def extremum(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``torch.minimum/maximum(a, b)``, and ``torch.min/max(a, b)`` of two tensors (T5's
    relative position buckets); ``min(x)`` or ``min(x, dim)`` are reductions: torch."""
    _no_kwargs(kwargs)
    if len(args) != 2 or not all(isinstance(a, torch.Tensor) for a in args):
        raise Unsupported("not two tensors")
    return _elementwise(factory, args)


def _inplace_arithmetic(no_bool: bool):
    def rule(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
        """``x += y``, ``x -= y``, ``x *= y`` on a tensor ``x`` (``operator.iadd`` & co.,
        T5's relative position buckets): ``x`` itself, written in place.

        Only when nothing can go wrong: the operands promote to ``x``'s dtype (one dtype,
        compatible scalars), broadcast to ``x``'s shape exactly, share ``x``'s device,
        ``x`` is exactly contiguous (no overlapping elements) and no other operand shares
        its storage. A number on the left (``0 += t`` is ``0 + t``) goes to torch.
        """
        _no_kwargs(kwargs)
        if len(args) != 2 or not isinstance(args[0], torch.Tensor):
            raise Unsupported("not a tensor written in place")
        x = args[0]
        tensors, dtype = _operand_dtype(args)
        if no_bool and dtype == torch.bool:
            raise Unsupported("bool subtraction")
        shape = broadcast_shapes(*(t.shape for t in tensors))
        if [size_key(s) for s in shape] != [size_key(s) for s in x.shape]:
            raise Unsupported("the operands do not broadcast to the written tensor")
        common_device(tensors)
        if not exactly_contiguous(x):
            raise Unsupported("written tensor not contiguous")
        storage = x.untyped_storage()._cdata
        if any(t.untyped_storage()._cdata == storage for t in tensors[1:]):
            raise Unsupported("an operand shares the written tensor's storage")
        if needs_grad(tensors) and not x.requires_grad:
            # torch makes `x` require grad: its metadata changes
            raise Unsupported("an operand requires grad")
        return x

    return rule


def comparison(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``< <= > >= == !=``: a bool tensor."""
    _no_kwargs(kwargs)
    return _elementwise(factory, args, torch.bool)


def logical(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``& |`` on bool or integer tensors."""
    _no_kwargs(kwargs)
    _, dtype = _operand_dtype(args)
    if dtype != torch.bool and dtype not in INTEGRAL:
        raise Unsupported("bitwise operation on floats")
    if any(isinstance(a, (float, torch.SymFloat)) for a in args):
        raise Unsupported("bitwise operation with a float")
    return _elementwise(factory, args)


def float_unary(factory: TensorFactory, args: tuple, kwargs: dict, allowed=()) -> torch.Tensor:
    """Unary functions on floating tensors (same dtype)."""
    if len(args) != 1 or any(k not in allowed for k in kwargs):
        raise Unsupported("unexpected arguments")
    if kwargs.get("inplace"):
        raise Unsupported("in-place")
    x = args[0]
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOATING:
        raise Unsupported("not a floating tensor")
    return _elementwise(factory, (x,))


def numeric_unary(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """neg, abs, relu: any non-bool tensor."""
    if len(args) != 1 or any(k != "inplace" for k in kwargs) or kwargs.get("inplace"):
        raise Unsupported("unexpected arguments")
    x = args[0]
    if not isinstance(x, torch.Tensor) or x.dtype == torch.bool:
        raise Unsupported("not a numeric tensor")
    return _elementwise(factory, (x,))


def power(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``x ** scalar`` for a floating ``x``."""
    _no_kwargs(kwargs)
    if len(args) != 2:
        raise Unsupported("unexpected arguments")
    x, exponent = args
    if (
        not isinstance(x, torch.Tensor)
        or x.dtype not in FLOATING
        or isinstance(exponent, bool)
        or not isinstance(exponent, (int, float))
    ):
        raise Unsupported("only floating tensor ** python number")
    return _elementwise(factory, (x,))


def where(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``torch.where(condition, a, b)`` with a bool condition."""
    _no_kwargs(kwargs)
    if len(args) != 3:
        raise Unsupported("where(condition) form")
    condition, a, b = args
    if not isinstance(condition, torch.Tensor) or condition.dtype != torch.bool:
        raise Unsupported("condition is not a bool tensor")
    tensors, dtype = _operand_dtype((a, b))
    shape = broadcast_shapes(condition.shape, *(t.shape for t in tensors))
    device = common_device([condition, *tensors])
    grad = needs_grad(tensors) and dtype.is_floating_point
    strides = output_strides(factory, [condition, *tensors], shape, False)
    return factory.new(shape, dtype, device, grad, strides)


def masked_fill(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``x.masked_fill(mask, value)``: the shape and dtype of ``x``."""
    _no_kwargs(kwargs)
    if len(args) != 3:
        raise Unsupported("unexpected arguments")
    x, mask, value = args
    if not isinstance(x, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise Unsupported("not tensors")
    if mask.dtype != torch.bool or isinstance(value, torch.Tensor):
        raise Unsupported("mask is not bool or value is a tensor")
    _operand_dtype((x, value))
    shape = broadcast_shapes(x.shape, mask.shape)
    if [size_key(s) for s in shape] != [size_key(s) for s in x.shape]:
        raise Unsupported("the mask broadcasts the input")
    common_device([x, mask])
    if not exactly_contiguous(x):
        # torch clones the input contiguous, or keeps its layout, depending on the
        # kernel that runs (ATen's or the reference's): torch decides
        raise Unsupported("non-contiguous input")
    strides = output_strides(factory, [mask, x], shape, False)
    return factory.new(x.shape, x.dtype, x.device, needs_grad([x]), strides)


def triangular(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``triu``/``tril`` (``diagonal`` positional or keyword): a contiguous tensor of the
    input's shape and dtype, whatever the input's layout (torch's kernel and its fake
    decomposition both allocate one). The decomposition builds masks from ``arange`` on
    symbolic sizes: a causal mask's ``triu`` cost a quarter of tiny-llm's capture."""
    if len(args) not in (1, 2) or any(k != "diagonal" for k in kwargs):
        raise Unsupported("unexpected arguments")
    if len(args) == 2 and kwargs:
        raise Unsupported("diagonal given twice")
    x = args[0]
    diagonal = args[1] if len(args) == 2 else kwargs.get("diagonal", 0)
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise Unsupported("not a tensor of rank 2 or more")
    if isinstance(diagonal, bool) or not isinstance(diagonal, _INT_SCALARS):
        raise Unsupported("diagonal is not an int")
    return factory.new(x.shape, x.dtype, x.device, needs_grad([x]), None)


def _float_unary_with(*allowed):
    def rule(factory, args, kwargs):
        return float_unary(factory, args, kwargs, allowed)

    return rule


_FLOAT_UNARY_NAMES = (
    "rsqrt",
    "sqrt",
    "exp",
    "log",
    "tanh",
    "sigmoid",
    "sin",
    "cos",
    "erf",
    "reciprocal",
)

#: FX call_function targets -> rule
FUNCTION_RULES: dict[Any, Any] = {
    operator.add: arithmetic,
    operator.mul: arithmetic,
    operator.sub: arithmetic_no_bool,
    operator.truediv: true_divide,
    operator.neg: numeric_unary,
    operator.pow: power,
    operator.lt: comparison,
    operator.le: comparison,
    operator.gt: comparison,
    operator.ge: comparison,
    operator.eq: comparison,
    operator.ne: comparison,
    operator.and_: logical,
    operator.or_: logical,
    operator.iadd: _inplace_arithmetic(no_bool=False),
    operator.imul: _inplace_arithmetic(no_bool=False),
    operator.isub: _inplace_arithmetic(no_bool=True),
    torch.add: arithmetic,
    torch.mul: arithmetic,
    torch.sub: arithmetic_no_bool,
    torch.div: true_divide,
    torch.neg: numeric_unary,
    torch.abs: numeric_unary,
    torch.relu: numeric_unary,
    F.relu: numeric_unary,
    torch.pow: power,
    torch.lt: comparison,
    torch.le: comparison,
    torch.gt: comparison,
    torch.ge: comparison,
    torch.eq: comparison,
    torch.ne: comparison,
    torch.where: where,
    torch.minimum: extremum,
    torch.maximum: extremum,
    torch.min: extremum,
    torch.max: extremum,
    torch.masked_fill: masked_fill,
    torch.triu: triangular,
    torch.tril: triangular,
    F.gelu: _float_unary_with("approximate"),
    F.silu: _float_unary_with("inplace"),
    F.sigmoid: _float_unary_with(),
    F.tanh: _float_unary_with(),
    **{getattr(torch, name): _float_unary_with() for name in _FLOAT_UNARY_NAMES},
}

#: FX call_method names -> rule
METHOD_RULES: dict[str, Any] = {
    "add": arithmetic,
    "mul": arithmetic,
    "sub": arithmetic_no_bool,
    "div": true_divide,
    "neg": numeric_unary,
    "abs": numeric_unary,
    "relu": numeric_unary,
    "pow": power,
    "lt": comparison,
    "le": comparison,
    "gt": comparison,
    "ge": comparison,
    "eq": comparison,
    "ne": comparison,
    "minimum": extremum,
    "maximum": extremum,
    "min": extremum,
    "max": extremum,
    "masked_fill": masked_fill,
    "triu": triangular,
    "tril": triangular,
    **{name: _float_unary_with() for name in _FLOAT_UNARY_NAMES},
}
