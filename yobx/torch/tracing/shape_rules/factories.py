"""Shape rules of tensor factories sized by dynamic dimensions.

``torch.arange``, ``torch.zeros/ones/empty/full`` apply when a size argument is
symbolic (the inputs hold no tensor to tell): ``torch.arange(seq)``,
``torch.zeros((1, heads, seq, seq))``; ``Tensor.new_zeros/new_ones/new_empty/new_full``
when the tensor or a size is; ``torch.zeros_like/ones_like/empty_like/full_like`` of an
exactly contiguous tensor with symbolic sizes. Every output is a fresh contiguous tensor
on the CPU; anything else (another device or layout, ``requires_grad``, a size that
may be negative, a fill value of another kind) is torch's.
"""

from __future__ import annotations

from typing import Any

import torch

from ._base import TensorFactory, Unsupported, decide, exactly_contiguous, fake

_INTEGERS = (int, torch.SymInt)


def arange(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``torch.arange(end)`` / ``(start, end)`` on integers, step 1: ``end - start``
    elements, when ``end >= start`` is known from the dimension ranges."""
    if set(kwargs) - {"dtype", "device"} or not 1 <= len(args) <= 3:
        raise Unsupported("unexpected arguments")
    start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    if any(isinstance(a, bool) or not isinstance(a, _INTEGERS) for a in (start, end, step)):
        raise Unsupported("non-integer bounds")
    if not isinstance(step, int) or step != 1:
        raise Unsupported("step")
    if not any(isinstance(a, torch.SymInt) for a in (start, end)):
        raise Unsupported("static bounds")
    if not decide(end >= start):
        raise Unsupported("empty range: torch raises")
    dtype = kwargs.get("dtype") or torch.int64
    device = torch.device(kwargs.get("device") or "cpu")
    if device.type != "cpu":
        raise Unsupported("device")
    length: Any = end if isinstance(start, int) and start == 0 else end - start
    return factory.new([length], dtype, device)


def _sizes(args: tuple) -> list[Any]:
    """The sizes of ``zeros(2, n)`` or ``zeros((2, n))``, each known not negative."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    sizes = list(args)
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, _INTEGERS):
            raise Unsupported("size")
        if isinstance(size, torch.SymInt) and not decide(size >= 0):
            raise Unsupported("a size that may be negative: torch raises")
        if type(size) is int and size < 0:
            raise Unsupported("negative size: torch raises")
    return sizes


_OPTIONS = frozenset({"dtype", "device", "layout", "requires_grad", "pin_memory"})


def _options(kwargs: dict, dtype: torch.dtype, device: Any) -> tuple[torch.dtype, torch.device]:
    """The dtype and device of a factory's output (``dtype``/``device`` override the
    defaults), which must be a plain strided CPU tensor."""
    if set(kwargs) - _OPTIONS:
        raise Unsupported("unexpected arguments")
    if kwargs.get("layout") not in (None, torch.strided) or kwargs.get("requires_grad"):
        raise Unsupported("layout or requires_grad")
    if kwargs.get("pin_memory"):
        raise Unsupported("pinned memory")
    dtype = kwargs.get("dtype") or dtype
    device = torch.device(kwargs.get("device") or device)
    if not isinstance(dtype, torch.dtype) or device.type != "cpu":
        raise Unsupported("dtype or device")
    return dtype, device


def _fill_dtype(value: Any) -> torch.dtype:
    """The dtype ``torch.full(size, value)`` infers from its fill value."""
    if isinstance(value, (bool, torch.SymBool)):
        return torch.bool
    if isinstance(value, _INTEGERS):
        return torch.int64
    if isinstance(value, (float, torch.SymFloat)):
        return torch.get_default_dtype()
    raise Unsupported("fill value")


def _filled(with_value: bool):
    """``torch.zeros/ones/empty`` (``with_value`` False) or ``torch.full``."""

    def rule(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
        if with_value:
            if len(args) != 2:
                raise Unsupported("arguments")
            sizes, dtype = _sizes(args[:1]), _fill_dtype(args[1])
        else:
            sizes, dtype = _sizes(args), torch.get_default_dtype()
        dtype, device = _options(kwargs, dtype, torch.get_default_device())
        return factory.new(sizes, dtype, device)

    return rule


def _new_filled(with_value: bool):
    """``x.new_zeros/new_ones/new_empty`` or ``x.new_full``: the dtype and device of ``x``."""

    def rule(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
        if not args:
            raise Unsupported("arguments")
        x, rest = fake(args[0]), args[1:]
        if with_value:
            if len(rest) != 2:
                raise Unsupported("arguments")
            _fill_dtype(rest[1])  # a fill value of a known kind
            rest = rest[:1]
        dtype, device = _options(kwargs, x.dtype, x.device)
        return factory.new(_sizes(rest), dtype, device)

    return rule


def _like(with_value: bool):
    """``torch.zeros_like/ones_like/empty_like`` or ``torch.full_like`` of an exactly
    contiguous tensor (its layout is preserved: contiguous)."""

    def rule(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
        if len(args) != 1 + with_value:
            raise Unsupported("arguments")
        x = fake(args[0])
        kwargs = dict(kwargs)
        memory_format = kwargs.pop("memory_format", torch.preserve_format)
        if memory_format not in (torch.preserve_format, torch.contiguous_format):
            raise Unsupported("memory format")
        if not exactly_contiguous(x):
            raise Unsupported("layout preserved from a non-contiguous tensor")
        if with_value:
            _fill_dtype(args[1])  # a fill value of a known kind
        dtype, device = _options(kwargs, x.dtype, x.device)
        return factory.new(list(x.shape), dtype, device)

    return rule


FUNCTION_RULES: dict[Any, Any] = {
    torch.arange: arange,
    torch.zeros: _filled(False),
    torch.ones: _filled(False),
    torch.empty: _filled(False),
    torch.full: _filled(True),
}

#: rules of tensors sized after another tensor (applied as the other rules)
LIKE_RULES: dict[Any, Any] = {
    torch.zeros_like: _like(False),
    torch.ones_like: _like(False),
    torch.empty_like: _like(False),
    torch.full_like: _like(True),
}

#: ``Tensor.new_*`` methods, applied when the tensor or a size is symbolic
METHOD_RULES: dict[str, Any] = {
    "new_zeros": _new_filled(False),
    "new_ones": _new_filled(False),
    "new_empty": _new_filled(False),
    "new_full": _new_filled(True),
}
