"""Proofs of identities with remainders and floor divisions by constants.

Padding to a multiple and splitting into windows write sizes such as
``n + (4 - n % 4) % 4`` and then ask torch questions like
``16*b*X*Y == 256*b*(X // 4)*(Y // 4)`` for ``X`` of that form: true for every size
(``X`` is a multiple of 4), but out of reach of interval bounds.

An expression built from sums, products, remainders ``a % c`` and floor divisions
``a // c`` by positive constants only depends on its symbols through polynomials once
their residues modulo ``L`` (the least common multiple of the divisors) are fixed:
writing each symbol ``s = L*t + r``, every remainder becomes a constant and every floor
division ``(a - a % c) / c`` a polynomial in ``t``. An equality is then proved by
checking, for each combination of residues, that the difference of both sides expands
to zero. This holds for every non-negative integer, so for every size.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import sympy
from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

#: at most this many residue combinations are enumerated
MAX_CASES = 4096


def is_identity(
    difference: sympy.Expr, positive: Callable[[sympy.Expr], bool] | None = None
) -> bool:
    """Whether ``difference`` is 0 for every non-negative integer value of its symbols.

    False means "not shown", never "false".

    :param positive: tells whether an expression is at least 1 for every size; a floor
        division by such an expression that divides exactly (``(16*b*x*y) // (x*y)``,
        a view's ``-1``) is replaced by its quotient
    """
    expr = _plain(difference, positive)
    if expr is None:
        return False
    divisors = [int(m.args[1]) for m in expr.atoms(sympy.Mod)]
    if not divisors:
        return sympy.expand(expr) == 0
    modulus = math.lcm(*divisors)
    symbols = sorted(set().union(*(m.args[0].free_symbols for m in expr.atoms(sympy.Mod))), key=str)
    if modulus ** len(symbols) > MAX_CASES:
        return False
    fresh = {s: sympy.Symbol(f"_t_{s.name}", integer=True, nonnegative=True) for s in symbols}
    for residues in itertools.product(range(modulus), repeat=len(symbols)):
        case = expr.xreplace({s: modulus * fresh[s] + r for s, r in zip(symbols, residues)})
        case = sympy.expand(case)
        if case.has(sympy.Mod) or case != 0:
            return False
    return True


def _plain(expr: sympy.Expr, positive: Callable[[sympy.Expr], bool] | None) -> sympy.Expr | None:
    """``expr`` with sympy's ``Mod`` only: ``a // c`` is ``(a - a % c) / c``; None when
    a division or a remainder is not by a positive integer constant (or an exact
    division by a positive expression), or anything else than sums, products and
    integer powers appears."""
    if expr.is_Atom:
        return expr if (expr.is_Symbol or expr.is_Integer or expr.is_Rational) else None
    plain = [_plain(a, positive) for a in expr.args]
    args = [a for a in plain if a is not None]
    if len(args) != len(plain):
        return None
    if isinstance(expr, (FloorDiv, Mod, PythonMod, sympy.Mod)):
        base, divisor = args
        if not divisor.is_number and positive is not None:
            quotient = sympy.cancel(base / divisor)
            exact = sympy.fraction(quotient)[1].is_number
            if exact and positive(divisor):
                return quotient if isinstance(expr, FloorDiv) else sympy.Integer(0)
        if not (divisor.is_Integer and divisor > 0):
            return None
        remainder = sympy.Mod(base, divisor)
        return remainder if not isinstance(expr, FloorDiv) else (base - remainder) / divisor
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        return expr.func(*args)
    if isinstance(expr, sympy.Pow) and args[1].is_Integer and args[1] >= 0:
        return args[0] ** args[1]
    return None


def padding_as_ceiling(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each padding to a multiple written as a ceiling.

    ``(c - n % c) % c`` (how much padding makes ``n`` a multiple of ``c``, and ``-n % c``,
    the same number) becomes ``c*((n + c - 1) // c) - n``. Both are equal for every
    integer ``n`` and constant ``c > 0``. The second form cancels against ``n`` in the
    padded size (``n + pad`` is ``c*((n + c - 1) // c)``), a form torch simplifies
    (``(n + pad) // c`` is ``(n + c - 1) // c``) and the range prover bounds
    (``n <= n + pad``). Left as written, chunked attention's sizes grow into
    ``Min(n, 64*((n + (64 - n % 64) % 64)//64))``, which no prover reduces to ``n``,
    and every operation on them costs seconds on fake tensors.
    """
    if not expr.has(Mod, PythonMod):
        return expr

    def rewrite(remainder: sympy.Expr) -> sympy.Expr:
        dividend, divisor = remainder.args
        if not (divisor.is_Integer and divisor > 0):
            return remainder
        padded = _padded(dividend, divisor, python=isinstance(remainder, PythonMod))
        if padded is None:
            return remainder
        return divisor * FloorDiv(padded + divisor - 1, divisor) - padded

    return expr.replace(lambda e: isinstance(e, (Mod, PythonMod)), rewrite)


def _padded(dividend: sympy.Expr, divisor: sympy.Integer, python: bool) -> sympy.Expr | None:
    """``n`` when ``dividend % divisor`` is ``-n % divisor``: ``k*c - n % c`` for a
    multiple ``k*c`` of the divisor, or ``-n`` itself for Python's remainder (torch's
    ``Mod`` is only defined on non-negative numbers); None otherwise."""
    constant, rest = dividend.as_coeff_Add()
    if (
        constant.is_Integer
        and constant % divisor == 0
        and isinstance(-rest, (Mod, PythonMod))
        and (-rest).args[1] == divisor
    ):
        return (-rest).args[0]
    if python and constant == 0 and rest.could_extract_minus_sign():
        return -rest
    return None
