"""Conditions on sizes written with integers only.

A condition on sizes may hold fractions: a dimension replaced by ``4*q + 2`` after a
divisibility makes ``q = height/4 - 1/2``. The graph computes them exactly with
``fractions.Fraction``, which torch's symbolic integers refuse (``Fraction * SymInt``):
a condition lowered again (the choice between versions, in ONNX) must be written with
integers. :func:`integral_condition` clears the denominators: ``a/d // m`` is
``a // (d*m)``, ``(a/d) % m`` is ``(a % (d*m)) / d``, ``min(a/d, b/e)`` is
``min(a*e, b*d) / (d*e)``, and a relation multiplied by a positive constant keeps its
truth.
"""

from __future__ import annotations

import math

import sympy
from torch.utils._sympy.functions import FloorDiv, Max, Min, Mod, PythonMod

_RELATIONS = (sympy.Eq, sympy.Ne, sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge)
_MOD = (Mod, PythonMod, sympy.Mod)
_MIN_MAX = (Min, Max, sympy.Min, sympy.Max)


def _split(expr: sympy.Expr) -> tuple[sympy.Expr, int] | None:
    """``expr`` as ``numerator / denominator`` with a positive integer denominator."""
    numerator, denominator = sympy.fraction(sympy.together(expr))
    if not denominator.is_Integer or int(denominator) <= 0:
        return None
    return sympy.expand(numerator), int(denominator)


def _integral(expr: sympy.Basic) -> sympy.Basic:
    """``expr`` with the fractions inside floor divisions, remainders, minima and
    maxima moved outside them (the same value)."""
    if not isinstance(expr, sympy.Basic) or expr.is_Atom:
        return expr
    args = [_integral(a) for a in expr.args]
    if isinstance(expr, (FloorDiv, *_MOD)):
        split = _split(args[0])
        if split is not None and split[1] != 1 and args[1].is_Integer:
            numerator, d = split
            if isinstance(expr, FloorDiv):
                return FloorDiv(numerator, d * args[1])
            return expr.func(numerator, d * args[1]) / d
    if isinstance(expr, _MIN_MAX):
        maybe_splits = [_split(a) for a in args]
        splits = [s for s in maybe_splits if s is not None]
        if len(splits) == len(maybe_splits) and any(s[1] != 1 for s in splits):
            common = math.lcm(*(s[1] for s in splits))
            return expr.func(*(n * (common // d) for n, d in splits)) / common
    return expr.func(*args) if args != list(expr.args) else expr


def integral_condition(condition: sympy.Basic) -> sympy.Basic:
    """The same condition with integer coefficients only, where its fractions have
    constant denominators (else as it is)."""
    if isinstance(condition, (sympy.And, sympy.Or, sympy.Not)):
        return condition.func(*(integral_condition(a) for a in condition.args))
    if not isinstance(condition, _RELATIONS) or all(
        r.is_Integer for r in condition.atoms(sympy.Rational)
    ):
        return condition
    difference = _integral(condition.lhs - condition.rhs)
    split = _split(difference)
    if split is None:
        return condition
    return condition.func(split[0], 0)
