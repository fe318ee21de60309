"""Proofs on integer expressions of dimensions that interval bounds alone miss.

:meth:`~yobx.torch.tracing.symbolic.symbolic.SymbolicDimensions.prove` bounds a difference of
two sides over the dimensions' ranges. Sizes are integers, and three facts it could not
see follow from that:

- an integer below ``1`` is at most ``0``: ``(d + 1)//2 <= d - 1`` holds for every
  ``d >= 2`` although the relaxed bound of the left side is ``(d + 1)/2``;
- ``Min(4, d) <= d``: a minimum is below each of its arguments, so any one of them
  bounds it from above (a maximum, from below); otherwise the bound is taken case by
  case, the minimum being one of its arguments;
- floor divisions by a dimension (``chunk`` computes ``ceil(d / ceil(d / 2))``): for
  integers and ``b >= 1``, ``a // b <= c`` is ``a <= c*b + b - 1`` and ``a // b >= c``
  is ``a >= c*b``, which are free of that division.

Everything here is a proof or nothing: ``False`` means "not shown", never "false".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
from torch.utils._sympy.functions import FloorDiv
from torch.utils._sympy.functions import Max as TorchMax
from torch.utils._sympy.functions import Min as TorchMin

#: ``bound(expr, ranges, upper)``: a number bounding ``expr`` over ``ranges``, or None
Bound = Callable[[sympy.Expr, dict, bool], Any]

_MINIMA = (sympy.Min, TorchMin)
_EXTREMA = (sympy.Min, sympy.Max, TorchMin, TorchMax)
#: how many divisions by a dimension one proof may remove (each one recurses once)
_MAX_DIVISIONS = 3


def nonpositive(expr: sympy.Expr, ranges: dict, bound: Bound, depth: int = 0) -> bool:
    """Whether the integer-valued ``expr`` is ``<= 0`` for every value in ``ranges``.

    :param expr: an integer-valued expression of the dimensions
    :param ranges: the dimensions' value ranges
    :param bound: bounds an expression free of minima and maxima (floor divisions by
        constants are its business)
    """
    expr = sympy.expand(expr)
    if expr.is_number:
        return bool(expr <= 0)
    high = upper_bound(expr, ranges, bound)
    # an integer smaller than 1 is at most 0
    if high is not None and high < 1:
        return True
    if depth >= _MAX_DIVISIONS:
        return False
    for claim, divisor in _without_symbolic_division(expr):
        if nonpositive(claim, ranges, bound, depth + 1) and nonpositive(
            1 - divisor, ranges, bound, depth + 1
        ):
            return True
    return False


def upper_bound(expr: sympy.Expr, ranges: dict, bound: Bound) -> Any:
    """An upper bound of ``expr``, minima and maxima of its sum taken apart.

    A minimum with a positive coefficient is bounded by any of its arguments (the
    smallest such bound is kept); with a negative one, the expression is bounded case
    by case (the minimum equals one of its arguments) and the largest bound is kept.
    Maxima are the mirror image.
    """
    for atom in _linear_extrema(expr):
        coefficient = expr.coeff(atom)
        any_argument = (coefficient > 0) == isinstance(atom, _MINIMA)
        bounds = [upper_bound(expr.xreplace({atom: arg}), ranges, bound) for arg in atom.args]
        if any_argument:
            known = [b for b in bounds if b is not None]
            return min(known) if known else None
        return None if any(b is None for b in bounds) else max(bounds)
    return bound(expr, ranges, True)


def _linear_extrema(expr: sympy.Expr) -> list[sympy.Expr]:
    """Minima and maxima appearing as terms of the sum ``expr`` with a numeric factor."""
    found = []
    for atom in expr.atoms(*_EXTREMA):
        coefficient = expr.coeff(atom)
        if coefficient.is_number and coefficient != 0 and not (expr - coefficient * atom).has(atom):
            found.append(atom)
    return sorted(found, key=sympy.default_sort_key)


def _without_symbolic_division(expr: sympy.Expr) -> list[tuple[sympy.Expr, sympy.Expr]]:
    """Claims equivalent to ``expr <= 0`` with one division by a dimension removed.

    For each term ``±(a // b)`` of ``expr`` with a non-constant ``b``, returns
    ``(claim, b)``: ``expr <= 0`` holds when ``claim <= 0`` and ``b >= 1`` both hold.
    """
    claims = []
    for term in expr.atoms(FloorDiv):
        numerator, divisor = term.args
        if divisor.is_number:
            continue
        coefficient = expr.coeff(term)
        rest = expr - coefficient * term
        if rest.has(term) or not (rest.is_integer and numerator.is_integer):
            continue
        if coefficient == 1:
            # a//b + rest <= 0  <=>  a//b <= -rest  <=>  a <= (1 - rest)*b - 1
            claims.append((numerator - (1 - rest) * divisor + 1, divisor))
        elif coefficient == -1:
            # rest - a//b <= 0  <=>  a//b >= rest  <=>  a >= rest*b
            claims.append((rest * divisor - numerator, divisor))
    return claims
