"""Output strides of elementwise operations, decided from the ranges of the dimensions.

torch lays out an elementwise result (:func:`torch._prims_common.
compute_elementwise_output_strides`) by ordering the dimensions of its inputs:
contiguity tests, then comparisons of strides and sizes, each one through
``guard_or_false`` or ``guard_or_true``. On symbolic sizes each comparison is a sympy
evaluation: the ``&`` of an attention mask or the ``*`` of a rotary embedding costs
about a millisecond.

:func:`elementwise_output_strides` runs the same algorithm (the same comparisons, in the
same order) but settles each comparison from the value ranges of the symbols: sizes and
strides that are a positive integer times a product of symbols have bounds, and equal
expressions are equal. A comparison settled that way holds for every value of the
dimensions. torch reaches the same answer: while tracing (size-oblivious mode) its
``guard_or_false`` proves it from the same ranges (bounds, or ``Mod(q*b, b) == 0`` for
the ratios), and otherwise it would decide from the example, which the ranges contain.
Symbols of sizes known at run time only are left to torch. As soon as one comparison is
not settled, torch's own function runs instead, and decides and guards as usual.
Empty dimensions (a static size 0) are :class:`~._base.Unsupported`, as in every rule.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, cast

import sympy
import torch
from torch._prims_common import (
    apply_perm,
    compute_elementwise_output_strides,
    invert_perm,
)
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.symbol import SymT, symbol_is_type

from ._base import Unsupported, contiguous_strides, size_key

_MISSING = object()
_UNBACKED = (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT)


class _Undecided(Exception):
    """A comparison the ranges do not settle: torch decides it (and guards)."""


@functools.lru_cache(maxsize=4096)
def _monomial(expr: sympy.Expr) -> tuple[int, tuple[tuple[sympy.Symbol, int], ...]] | None:
    """``(c, ((s, k), ...))`` when ``expr`` is ``c * s**k * ...`` with ``c > 0``, else None.

    Structural only (no ranges), hence cached across traces.
    """
    coeff, rest = expr.as_coeff_Mul()
    if not coeff.is_Integer or coeff <= 0:
        return None
    factors = []
    for base, exponent in rest.as_powers_dict().items():
        if not base.is_Symbol or not exponent.is_Integer or exponent <= 0:
            return None
        factors.append((base, int(exponent)))
    return int(coeff), tuple(factors)


@functools.lru_cache(maxsize=1024)
def _range_bounds(value_range: Any) -> tuple[int, float] | None:
    """The bounds of a non-negative integer range as Python numbers (sympy comparisons
    are slow: cached by range)."""
    if value_range.lower == -int_oo or value_range.lower < 0:
        return None
    high = math.inf if value_range.upper == int_oo else int(value_range.upper)
    return int(value_range.lower), high


class RangeDecider:
    """Comparisons of sizes and strides (ints or sympy expressions, see
    :func:`~._base.size_key`) that the value ranges of one ShapeEnv settle;
    :class:`_Undecided` otherwise. Results are cached, which assumes the ranges do not
    change while it is used: build one per layout."""

    def __init__(self, shape_env: Any) -> None:
        self._ranges = shape_env.var_to_range if shape_env is not None else {}
        self._bounds: dict[Any, tuple[int, float] | None] = {}
        self._ratios: dict[tuple[Any, Any], float] = {}

    def bounds(self, key: Any) -> tuple[int, float]:
        """The smallest and largest values of ``key`` (``math.inf``: unbounded)."""
        if type(key) is int:
            return key, key
        cached = self._bounds.get(key, _MISSING)
        found: tuple[int, float] | None
        if cached is _MISSING:
            found = self._bounds[key] = self._monomial_bounds(key)
        else:
            found = cast("tuple[int, float] | None", cached)
        if found is None:
            raise _Undecided
        return found

    def _monomial_bounds(self, key: sympy.Expr) -> tuple[int, float] | None:
        if key.is_Integer:
            return int(key), int(key)
        monomial = _monomial(key)
        if monomial is None:
            return None
        coeff, factors = monomial
        # positive exponents of integer bounds: the lower bound stays an int
        low: int = coeff
        high: float = coeff
        for symbol, exponent in factors:
            symbol_bounds = self._symbol_bounds(symbol)
            if symbol_bounds is None:
                return None
            low *= symbol_bounds[0] ** exponent
            high = 0 if high == 0 or symbol_bounds[1] == 0 else high * symbol_bounds[1] ** exponent
        return low, high

    def _symbol_bounds(self, symbol: sympy.Symbol) -> tuple[int, float] | None:
        if symbol_is_type(symbol, _UNBACKED):
            # torch answers False to what it cannot prove on a size known at run time
            # only, where the decider may prove it (s**2 >= s): let torch decide
            return None
        value_range = self._ranges.get(symbol)
        return None if value_range is None else _range_bounds(value_range)

    def _ratio_low(self, a: Any, b: Any) -> float:
        """The lower bound of ``a / b`` when it is a monomial, else 0."""
        found = self._ratios.get((a, b))
        if found is None:
            quotient = sympy.sympify(a) / b
            if quotient.is_Integer:
                found = int(quotient)
            elif quotient.is_Number or _monomial(quotient) is None:
                found = 0
            else:
                found = self.bounds(quotient)[0]
            self._ratios[a, b] = found
        return found

    def equal(self, a: Any, b: Any) -> bool:
        """``a == b`` for every value (True), for none (False)."""
        if a == b:
            return True
        low_a, high_a = self.bounds(a)
        low_b, high_b = self.bounds(b)
        if high_a < low_b or high_b < low_a:
            return False
        # one is the other times a monomial > 1 (s**2 and s with s >= 2)
        if (low_b > 0 and self._ratio_low(a, b) > 1) or (low_a > 0 and self._ratio_low(b, a) > 1):
            return False
        raise _Undecided

    def greater_equal(self, a: Any, b: Any) -> bool:
        """``a >= b`` for every value (True), for none (False)."""
        low_a, high_a = self.bounds(a)
        low_b, high_b = self.bounds(b)
        if low_a >= high_b:
            return True
        if high_a < low_b:
            return False
        # a = q * b with a monomial q >= 1 (s**2 >= s), or the other way round
        if low_b > 0 and self._ratio_low(a, b) >= 1:
            return True
        if low_a > 0 and self._ratio_low(b, a) > 1:
            return False
        raise _Undecided

    def divides(self, a: Any, b: Any) -> bool:
        """``a % b == 0`` for every value (True), for none (False)."""
        if type(a) is int and type(b) is int and b != 0:
            return a % b == 0
        if b == 0:
            raise _Undecided
        low_a, high_a = self.bounds(a)
        low_b, _ = self.bounds(b)
        if low_b > 0 and self._ratio_low(a, b) >= 1:
            # a quotient with a lower bound is a monomial: an integer multiple
            return True
        if low_a > 0 and high_a < low_b:
            # 0 < a < b: the remainder is a
            return False
        raise _Undecided

    def numel_below_2(self, sizes: Sequence[Any]) -> bool:
        """``prod(sizes) < 2`` for every value (True), for none (False)."""
        low: float = 1
        high: float = 1
        for size in sizes:
            size_low, size_high = self.bounds(size)
            low *= size_low
            high = 0 if size_high == 0 or high == 0 else high * size_high
        if high < 2:
            return True
        if low >= 2:
            return False
        raise _Undecided


def _dense_in_order(decider: RangeDecider, sizes: Sequence[Any], strides: Sequence[Any]) -> bool:
    """torch's ``check_contiguous_sizes_strides(..., false_if_dde=True)``."""
    expected: Any = 1
    for size, stride in reversed(tuple(zip(sizes, strides))):
        if decider.equal(size, 1):
            continue
        if decider.bounds(size)[0] < 1:
            # torch also compares with a product of Max(size, 1): not settled here
            raise _Undecided
        if not decider.equal(stride, expected):
            return False
        expected = expected * size
    return True


def _contiguous(decider: RangeDecider, sizes: Sequence[Any], strides: Sequence[Any]) -> bool:
    """torch's ``is_contiguous(a, false_if_dde=True)``."""
    return decider.numel_below_2(sizes) or _dense_in_order(decider, sizes, strides)


def _dense_in_dimension_order(
    decider: RangeDecider, sizes: Sequence[Any], strides: Sequence[Any], order: Sequence[int]
) -> bool:
    """Strides of a dense layout with ``order`` from the innermost dimension (size-1
    dimensions skipped), as torch's channels-last tests check them."""
    expected: Any = 1
    for index in order:
        if decider.equal(sizes[index], 1):
            continue
        if not decider.equal(strides[index], expected):
            return False
        expected = expected * sizes[index]
    return True


def _channels_last(decider: RangeDecider, sizes: Sequence[Any], strides: Sequence[Any]) -> bool:
    """torch's ``is_channels_last_contiguous_2d(a, false_if_dde=True)``."""
    return len(sizes) == 4 and _dense_in_dimension_order(decider, sizes, strides, (1, 3, 2, 0))


def _channels_last_3d(decider: RangeDecider, sizes: Sequence[Any], strides: Sequence[Any]) -> bool:
    """torch's ``is_channels_last_contiguous_3d(a, false_if_dde=True)``."""
    return len(sizes) == 5 and _dense_in_dimension_order(decider, sizes, strides, (1, 4, 3, 2, 0))


class _SizeStride:
    """torch's ``K``: ``(size, stride)`` ordered by stride, settled by the ranges."""

    __slots__ = ("decider", "size", "stride")

    def __init__(self, decider: RangeDecider, size: Any, stride: Any) -> None:
        self.decider, self.size, self.stride = decider, size, stride

    def __lt__(self, other: _SizeStride) -> bool:
        decider = self.decider
        if not decider.greater_equal(self.stride, other.stride):
            return True
        return (
            decider.equal(self.stride, 0) or decider.divides(other.stride, self.stride)
        ) and not decider.equal(self.stride, other.stride)


def _non_overlapping_and_dense(
    decider: RangeDecider, sizes: Sequence[Any], strides: Sequence[Any]
) -> bool:
    """torch's ``_is_non_overlapping_and_dense_or_false``."""
    if decider.numel_below_2(sizes):
        return True
    if len(sizes) == 1:
        return decider.equal(strides[0], 1)
    ordered = sorted(_SizeStride(decider, s, t) for s, t in zip(sizes, strides))
    return _dense_in_order(
        decider, [p.size for p in ordered][::-1], [p.stride for p in ordered][::-1]
    )


def _should_swap(decider: RangeDecider, tensors: Sequence[Any], shape: Any, a: int, b: int) -> int:
    """torch's ``should_swap`` of ``compute_elementwise_output_logical_to_physical_perm``."""

    def ge(x: Any, y: Any) -> bool:
        if decider.equal(y, 0):
            return True
        if decider.equal(x, 0):
            return False
        return decider.greater_equal(x, y) or decider.divides(x, y)

    for strides in tensors:
        stride_a, stride_b = strides[a], strides[b]
        if decider.equal(stride_a, 0) or decider.equal(stride_b, 0):
            continue
        if decider.equal(stride_a, stride_b):
            if ge(shape[b], shape[a]):
                continue
            return 1
        if ge(stride_b, stride_a):
            return -1
        if ge(stride_a, stride_b):
            return 1
    return 0


def _logical_to_physical_perm(
    decider: RangeDecider, shape: Sequence[Any], tensors: Sequence[Sequence[Any]]
) -> list[int]:
    """torch's ``compute_elementwise_output_logical_to_physical_perm``."""
    ndim = len(shape)
    is_contiguous = True
    is_channels_last = True
    for strides in tensors:
        is_contiguous = is_contiguous and _contiguous(decider, shape, strides)
        is_channels_last = is_channels_last and _channels_last(decider, shape, strides)
    if is_contiguous and not is_channels_last:
        return list(range(ndim))
    if is_channels_last and not is_contiguous:
        return [0, *range(2, ndim), 1]
    perm = list(reversed(range(ndim)))
    # insertion sort with support for ambiguous comparisons (torch's order of work)
    for i in range(1, ndim):
        dim1 = i
        for dim0 in reversed(range(i)):
            comparison = _should_swap(decider, tensors, shape, perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    return list(reversed(perm))


def _decided(decider: RangeDecider, tensors: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    """torch's ``compute_elementwise_output_strides(*tensors)`` (tensors of one shape),
    :class:`_Undecided` when a comparison is not settled."""
    shape = tensors[0].shape
    ndim = len(shape)
    if ndim == 0:
        return ()
    if ndim == 1:
        return (1,)
    sizes = [size_key(s) for s in shape]
    strides = [[size_key(s) for s in t.stride()] for t in tensors]
    if len(tensors) == 1 and _non_overlapping_and_dense(decider, sizes, strides[0]):
        return tensors[0].stride()
    # otherwise torch asks a single tensor's empty_like (C++), which orders the
    # dimensions as the permutation below does (test_strides.py compares them)
    perm = _logical_to_physical_perm(decider, sizes, strides)
    # torch's make_contiguous_strides_for, without re-validating sizes read from tensors
    new_strides = contiguous_strides(apply_perm(shape, perm))
    return tuple(apply_perm(new_strides, invert_perm(perm)))


def elementwise_output_strides(shape_env: Any, tensors: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    """``compute_elementwise_output_strides(*tensors)`` for tensors of one shape (already
    broadcast, no CPU scalar among them), without sympy when the ranges of the
    dimensions settle every comparison torch makes."""
    try:
        return _decided(RangeDecider(shape_env), tensors)
    except _Undecided:
        return compute_elementwise_output_strides(*tensors)


def _symbolic_geometry(tensors: Sequence[Any]) -> Any:
    """The ShapeEnv of the first symbolic size or stride of ``tensors``, or None."""
    return next(
        (
            s.node.shape_env
            for t in tensors
            for s in (*t.shape, *t.stride())
            if isinstance(s, torch.SymInt)
        ),
        None,
    )


_CONTIGUITY_CHECKS = {
    torch.contiguous_format: _contiguous,
    torch.channels_last: _channels_last,
    torch.channels_last_3d: _channels_last_3d,
}


def decided_contiguity(tensor: Any, memory_format: torch.memory_format) -> bool | None:
    """torch's ``is_contiguous_for_memory_format_or_false(tensor, memory_format=...)``
    for a strided tensor with symbolic sizes, when the ranges of the dimensions settle
    it; ``None`` otherwise."""
    check = _CONTIGUITY_CHECKS.get(memory_format)
    if check is None or not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
        return None
    shape_env = _symbolic_geometry([tensor])
    if shape_env is None:
        return None
    try:
        sizes = [size_key(s) for s in tensor.shape]
        strides = [size_key(s) for s in tensor.stride()]
        return check(RangeDecider(shape_env), sizes, strides)
    except (Unsupported, _Undecided):
        return None


def decided_perm(tensors: Sequence[Any]) -> list[int] | None:
    """torch's ``compute_elementwise_output_logical_to_physical_perm(*tensors)`` for
    tensors of one shape (structurally: the same expressions), of rank 2 or more, when
    the ranges of the dimensions settle every comparison; ``None`` otherwise."""
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    ndim = tensors[0].dim()
    if ndim < 2 or any(t.dim() != ndim for t in tensors):
        return None
    try:
        sizes = [size_key(s) for s in tensors[0].shape]
        if any([size_key(s) for s in t.shape] != sizes for t in tensors[1:]):
            return None
        strides = [[size_key(s) for s in t.stride()] for t in tensors]
    except Unsupported:
        return None
    try:
        return _logical_to_physical_perm(RangeDecider(_symbolic_geometry(tensors)), sizes, strides)
    except _Undecided:
        return None
