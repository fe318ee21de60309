"""Proofs on dimension expressions from their ranges, where ShapeEnv gives up.

ShapeEnv cannot show ``seq // 2 <= seq``. Each ``a // c`` (constant ``c > 0``) lies in
``[(a - c + 1) / c, a / c]``; replacing it by the bound that makes the difference of
both sides largest (or smallest) gives a floor-free expression whose range
:func:`bound_sympy` computes. Only a proof is returned: None when the bounds do not
settle it. :meth:`SymbolicDimensions.prove
<yobx.torch.tracing.symbolic.symbolic.SymbolicDimensions.prove>` calls it with what is known.
"""

from __future__ import annotations

from typing import Any

import sympy
from torch.utils._sympy.functions import FloorDiv

from .integer_bounds import nonpositive
from .residues import is_identity


def prove_from_ranges(expr: sympy.Basic, ranges: dict, replacements: dict) -> bool | None:
    """Decides a relation (``==``, ``!=``, ``<``..., ``and``, ``or``) on dimensions.

    :param expr: the relation, a sympy boolean
    :param ranges: ``var_to_range`` of the ShapeEnv, or a snapshot of it
    :param replacements: ``replacements`` of the ShapeEnv, or a snapshot of it
    :return: True or False when proved, None otherwise
    """
    expr = expr.xreplace(replacements)
    if expr in (sympy.true, sympy.false):
        return bool(expr)
    if isinstance(expr, (sympy.And, sympy.Or)):
        # torch._check(a and b) in torch's kernels: each part is judged alone
        parts = [prove_from_ranges(part, ranges, replacements) for part in expr.args]
        decisive = isinstance(expr, sympy.Or)  # the value one part decides
        if decisive in parts:
            return decisive
        return None if None in parts else not decisive
    if isinstance(expr, (sympy.Ne, sympy.Eq)):
        return _prove_equality(expr, ranges, replacements)
    if not isinstance(expr, (sympy.Le, sympy.Lt, sympy.Ge, sympy.Gt)):
        return None
    if isinstance(expr, (sympy.Le, sympy.Lt)):
        diff, strict = expr.lhs - expr.rhs, isinstance(expr, sympy.Lt)
    else:
        diff, strict = expr.rhs - expr.lhs, isinstance(expr, sympy.Gt)
    # claim: diff < 0 (strict) or diff <= 0
    high = bound_without_floors(diff, ranges, upper=True)
    if high is not None and (high < 0 or (not strict and high <= 0)):
        return True
    low = bound_without_floors(diff, ranges, upper=False)
    if low is not None and (low > 0 or (strict and low >= 0)):
        return False
    if diff.is_integer:
        # sizes are integers: see integer_bounds (Min/Max, x <= 0 from x < 1,
        # divisions by a dimension)
        if nonpositive(diff + 1 if strict else diff, ranges, bound_without_floors):
            return True
        if nonpositive(-diff if strict else 1 - diff, ranges, bound_without_floors):
            return False
    return None


def _prove_equality(expr: sympy.Basic, ranges: dict, replacements: dict) -> bool | None:
    """``a == b`` or ``a != b``, from the inequalities they follow from."""
    # a != b follows from a < b or a > b
    apart = prove_from_ranges(
        sympy.Lt(expr.lhs, expr.rhs), ranges, replacements
    ) or prove_from_ranges(sympy.Gt(expr.lhs, expr.rhs), ranges, replacements)
    if apart:
        return isinstance(expr, sympy.Ne)
    # a == b follows from a <= b and a >= b, or from an identity on residues
    # (padding to a multiple: `n + (4 - n % 4) % 4` is divisible by 4)
    if (
        prove_from_ranges(sympy.Le(expr.lhs, expr.rhs), ranges, replacements)
        and prove_from_ranges(sympy.Ge(expr.lhs, expr.rhs), ranges, replacements)
    ) or is_identity(expr.lhs - expr.rhs, lambda e: _at_least_one(e, ranges)):
        return isinstance(expr, sympy.Eq)
    return None


def _at_least_one(expr: sympy.Expr, ranges: dict) -> bool:
    """Whether an integer expression is at least 1 for every size in ``ranges``."""
    low = bound_without_floors(expr, ranges, upper=False)
    return low is not None and low >= 1


def bound_without_floors(diff: sympy.Expr, var_to_range: dict, upper: bool) -> Any:
    """An upper (or lower) bound of ``diff`` once its floor divisions by a constant are
    replaced by the rational bound on the matching side; None when not finite or when
    ``diff`` depends on something without a range."""
    from torch.utils._sympy.value_ranges import bound_sympy

    diff = sympy.expand(diff)
    # A floor division that is a term of the sum (times a number) is replaced by
    # the rational bound on the side that makes the sum largest (or smallest);
    # anywhere else (inside a remainder, a product of symbols, a minimum) it is
    # left to bound_sympy, which bounds it on its own.
    terms = []
    for term in sympy.Add.make_args(diff):
        coefficient, rest = term.as_coeff_Mul()
        if isinstance(rest, FloorDiv) and rest.args[1].is_Integer and rest.args[1] > 0:
            base, divisor = rest.args
            take_high = (coefficient > 0) == upper
            rest = (base / divisor) if take_high else (base - divisor + 1) / divisor
        terms.append(coefficient * rest)
    free = sympy.Add(*terms)
    if any(not s.is_Symbol for s in free.free_symbols):
        return None
    ranges = {s: var_to_range[s] for s in free.free_symbols if s in var_to_range}
    if len(ranges) != len(free.free_symbols):
        return None
    try:
        bound = bound_sympy(free, ranges)
    except TypeError:
        # torch's bounds of a floor division by fractional bounds (half a size
        # written `(q - (q + 1) % 2 + 1)/2`) compare an unevaluated `2 // (1/2)`
        return None
    value = bound.upper if upper else bound.lower
    return value if value.is_number and value.is_finite else None


__all__ = ["bound_without_floors", "prove_from_ranges"]
