"""Constraints: facts on dynamic dimensions that a traced graph relies on.

When a decision on dynamic dimensions is not provable from what is declared (ranges,
``torch._check`` facts, equal names), the tracer adopts the example's answer for
dimensions that allow it (string names, ``Dim.DYNAMIC``, ``Dim.AUTO``) and records it
as a :class:`Constraint`; the traced graph checks every constraint on its inputs when it
runs and raises :class:`ConstraintViolationError` outside them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import sympy
from torch.utils._sympy.functions import FloorDiv, Max, Min, Mod, PythonMod

#: the kinds of constraints, from the most to the least specific
CONSTRAINT_KINDS = ("value", "range", "divisibility", "relation", "other")


@dataclasses.dataclass(frozen=True)
class Constraint:
    """One fact on dynamic dimensions adopted from the example inputs.

    :param expression: the condition, in the user's dimension names
        (``seq <= 128``, ``total == cache + seq``, ``dim % 2 == 0``)
    :param kind: ``"range"``, ``"relation"``, ``"divisibility"``, ``"value"`` (a
        dimension equal to a constant) or ``"other"`` (any other formula)
    :param location: the user's ``file:line`` that needed it
    :param dimensions: the user names of the dimensions involved
    :param when: for a constraint of one version of a capture (see
        :mod:`yobx.torch.tracing.constraints.versions`), the conditions selecting that version, in
        the user's names (``(seq > 16) and (seq <= 64)``): the constraint applies to the
        inputs satisfying them; empty when it applies to every input
    """

    expression: str
    kind: str
    location: str = ""
    dimensions: tuple[str, ...] = ()
    when: str = ""

    def __str__(self) -> str:
        where = f"  [{self.location}]" if self.location else ""
        when = f"  when {self.when}" if self.when else ""
        return f"{self.expression} ({self.kind}){where}{when}"


class ConstraintViolationError(RuntimeError):
    """Raised by a traced graph whose inputs break one of its constraints.

    :param expression: the constraint, in the user's dimension names
    :param values: the dimension values of the inputs, by user name
    :param location: the user's ``file:line`` that needed the constraint
    """

    def __init__(self, expression: str, values: dict[str, int], location: str = ""):
        self.expression = expression
        self.values = dict(values)
        self.location = location
        sizes = ", ".join(f"{name}={value}" for name, value in self.values.items())
        where = f" (needed by {location})" if location else ""
        super().__init__(
            f"the inputs break the constraint `{expression}` of the traced graph{where}: "
            f"{sizes}; the graph was traced for inputs satisfying it and would be wrong "
            f"for these"
        )


# classification of adopted facts


def normalize(fact: sympy.Basic, positive: Callable[[sympy.Symbol], bool]) -> sympy.Basic:
    """Rewrites a fact in its simplest equivalent form for positive symbols.

    ``b*d == 2*b*(d // 2)`` (a reshape into halves) becomes ``d % 2 == 0``:
    ``a // m`` is ``(a - a % m) / m``, and factors known positive are dropped from an
    equation with zero. ``d % 2 != 1`` becomes ``d % 2 == 0``.

    :param fact: a relation that holds
    :param positive: tells whether a symbol is known to be at least 1
    """
    if isinstance(fact, (sympy.And, sympy.Or)):
        return _normalize_connective(fact, positive)
    if isinstance(fact, (sympy.Eq, sympy.Ne)):
        fact = _normalize_extremum(fact)
    if isinstance(fact, (sympy.Eq, sympy.Ne)):
        fact = _normalize_equation(fact, positive)
    if isinstance(fact, sympy.Eq) and _is_mod(fact.lhs) and fact.rhs.is_Integer:
        # (s + b) % m == r is s % m == (r - b) % m
        base, divisor = fact.lhs.args
        offset = base.as_coeff_Add()[0]
        if offset != 0 and divisor.is_Integer and (base - offset).is_Symbol:
            return sympy.Eq(Mod(base - offset, divisor), (fact.rhs - offset) % divisor)
    if isinstance(fact, sympy.Ne):
        mod = fact.lhs if _is_mod(fact.lhs) else fact.rhs if _is_mod(fact.rhs) else None
        other = fact.rhs if mod is fact.lhs else fact.lhs
        if mod is not None and mod.args[1] == 2 and other in (0, 1):
            return sympy.Eq(Mod(*mod.args), 1 - other)
    return fact


_EXTREMA = (sympy.Min, sympy.Max, Min, Max)


def _normalize_connective(fact: sympy.Basic, positive) -> sympy.Basic:
    """``and``/``or`` of normalized parts; on one dimension, the interval it leaves
    (``seq == min(64, seq) or min(64, seq) == 1`` is ``seq <= 64``)."""
    fact = fact.func(*(normalize(part, positive) for part in fact.args))
    if len(fact.free_symbols) != 1 or fact.has(FloorDiv, Mod, PythonMod, Min, Max):
        return fact
    (symbol,) = fact.free_symbols
    try:
        solutions = fact.as_set().intersect(sympy.Interval(0, sympy.oo))
    except (NotImplementedError, TypeError, ValueError):
        return fact
    if isinstance(solutions, sympy.Interval) and not solutions.left_open:
        if solutions.right is sympy.oo:
            return sympy.Ge(symbol, sympy.ceiling(solutions.left))
        if solutions.left <= 0:
            return sympy.Le(symbol, sympy.floor(solutions.right))
    return fact


def _normalize_extremum(fact: sympy.Basic) -> sympy.Basic:
    """``s == min(s, c)`` is ``s <= c``; ``s == max(s, c)`` is ``s >= c``;
    ``min(s, c) == v`` is ``s == v`` below ``c``."""
    for side, other in ((fact.lhs, fact.rhs), (fact.rhs, fact.lhs)):
        if (
            isinstance(other, _EXTREMA)
            and len(other.args) == 2
            and side.is_number
            and any(a.is_number for a in other.args)
        ):
            (bound,) = [a for a in other.args if a.is_number]
            (rest,) = [a for a in other.args if not a.is_number] or [None]
            minimum = isinstance(other, (sympy.Min, Min))
            if rest is not None and ((side < bound) if minimum else (side > bound)):
                holds = sympy.Eq(rest, side)
                return holds if isinstance(fact, sympy.Eq) else sympy.Ne(rest, side)
    for side, other in ((fact.lhs, fact.rhs), (fact.rhs, fact.lhs)):
        if isinstance(other, _EXTREMA) and len(other.args) == 2 and side in other.args:
            (bound,) = [a for a in other.args if a != side]
            relation = sympy.Le if isinstance(other, (sympy.Min, Min)) else sympy.Ge
            holds = relation(side, bound)
            return holds if isinstance(fact, sympy.Eq) else sympy.Not(holds)
    return fact


def _is_mod(expr: sympy.Basic) -> bool:
    return isinstance(expr, (Mod, PythonMod, sympy.Mod))


def _normalize_equation(fact: sympy.Basic, positive) -> sympy.Basic:
    cancelled = sympy.expand(fact.lhs - fact.rhs)
    if cancelled.free_symbols < fact.free_symbols:
        # a term on both sides: `seq + 5 == past + seq` is `past == 5`, a value (a
        # dimension declared dynamic made a constant is then said so, not adopted as
        # a relation that fixes it silently)
        fact = type(fact)(cancelled, 0)
        if not isinstance(fact, (sympy.Eq, sympy.Ne)):
            return fact
        if len(cancelled.free_symbols) == 1:
            solved = _solve_single(sympy.Eq(cancelled, 0))
            if solved is not None and solved.is_Integer:
                fact = type(fact)(next(iter(cancelled.free_symbols)), solved)
    diff = fact.lhs - fact.rhs
    floors = {
        f: (f.args[0] - Mod(*f.args)) / f.args[1]
        for f in diff.atoms(FloorDiv)
        if f.args[1].is_Integer and f.args[1] > 0
    }
    if floors:
        diff = sympy.expand(diff.xreplace(floors))
    diff = sympy.factor_terms(diff)
    factors = sympy.Mul.make_args(diff)
    kept = [f for f in factors if not (f.is_number and f != 0) and not _positive(f, positive)]
    if len(kept) == len(factors) and not floors:
        return fact
    rest = sympy.Mul(*kept)
    # `c*(d % m) - r*c` factors to (d % m) - r: an equation on a remainder
    terms = sympy.Add.make_args(rest)
    mods = [t for t in terms if _is_mod(t)]
    if len(mods) == 1:
        remainder = -(rest - mods[0])
        if remainder.is_Integer:
            return type(fact)(Mod(*mods[0].args), remainder)
    return fact


def _positive(factor: sympy.Expr, positive) -> bool:
    base, exponent = factor.as_base_exp()
    return bool(exponent.is_Integer and exponent > 0 and base.is_Symbol and positive(base))


def classify(fact: sympy.Basic) -> str:
    """The kind of a normalized fact: one of :data:`CONSTRAINT_KINDS`."""
    symbols = fact.free_symbols
    if isinstance(fact, sympy.Eq):
        if _is_mod(fact.lhs) and fact.rhs.is_Integer and fact.lhs.args[1].is_Integer:
            return "divisibility"
        if len(symbols) == 1:
            solved = _solve_single(fact)
            return "value" if solved is not None and solved.is_Integer else "other"
        return "relation"
    if isinstance(fact, (sympy.Le, sympy.Lt, sympy.Ge, sympy.Gt)) and len(symbols) == 1:
        return "range" if _bound_of_single(fact) is not None else "other"
    return "other"


def _isolated(fact: sympy.Basic) -> sympy.Basic:
    """``past + seq - total <= 0`` as ``total >= past + seq``: a linear inequality with
    a dimension of coefficient 1 alone on the left, the other side with as few
    negative terms as possible."""
    if fact.lhs.is_Symbol and not any(
        t.could_extract_minus_sign() for t in sympy.Add.make_args(fact.rhs)
    ):
        return fact
    difference = sympy.expand(fact.lhs - fact.rhs)
    strict = isinstance(fact, (sympy.Lt, sympy.Gt))
    # the fact is `difference < 0` (small) or `difference > 0`
    small = isinstance(fact, (sympy.Le, sympy.Lt))
    candidates = []
    for symbol in sorted(difference.free_symbols, key=str):
        sign = difference.coeff(symbol)
        if sign not in (1, -1) or (difference - sign * symbol).has(symbol):
            continue
        # difference = sign * (symbol - rest)
        rest = sympy.expand(symbol - difference / sign)
        below = (sign > 0) == small
        negatives = sum(t.could_extract_minus_sign() for t in sympy.Add.make_args(rest))
        relation = (
            (sympy.Lt if strict else sympy.Le) if below else (sympy.Gt if strict else sympy.Ge)
        )
        candidates.append((negatives, str(symbol), relation(symbol, rest)))
    return min(candidates, key=lambda c: c[:2])[2] if candidates else fact


def _solve_single(fact: sympy.Basic) -> sympy.Expr | None:
    from torch.utils._sympy.solve import try_solve

    if fact.has(FloorDiv, Mod, PythonMod, Min, Max, sympy.floor, sympy.ceiling):
        # not one-to-one: `(n + 3) // 4 == 1` holds for n in 1..4, and try_solve
        # answers a single n for it
        return None
    (symbol,) = fact.free_symbols
    solved = try_solve(fact, symbol)
    return None if solved is None else solved[1]


def _bound_of_single(fact: sympy.Basic) -> sympy.Basic | None:
    """``a*s + b <= c`` as ``s <= c'`` (integer bound), None if not linear."""
    from torch.utils._sympy.solve import try_solve

    (symbol,) = fact.free_symbols
    try:
        if not sympy.Poly(fact.lhs - fact.rhs, symbol).is_linear:
            return None
    except sympy.PolynomialError:
        return None
    solved = try_solve(fact, symbol)
    if solved is None or solved[0].lhs != symbol:
        return None
    relation = solved[0]
    bound = relation.rhs
    if not bound.is_number:
        return None
    # integers: s < 7.5 is s <= 7, s > 2.5 is s >= 3
    if isinstance(relation, (sympy.Lt, sympy.Le)):
        value = sympy.floor(bound) if isinstance(relation, sympy.Le) else sympy.ceiling(bound) - 1
        return sympy.Le(symbol, value)
    value = sympy.ceiling(bound) if isinstance(relation, sympy.Ge) else sympy.floor(bound) + 1
    return sympy.Ge(symbol, value)


def simplest_form(fact: sympy.Basic, kind: str) -> sympy.Basic:
    """The form a constraint of ``kind`` is reported in (``seq <= 128``, ``d == 6``,
    ``total == past + seq``)."""
    if kind == "relation" and fact.rhs.is_Symbol and not fact.lhs.is_Symbol:
        return sympy.Eq(fact.rhs, fact.lhs)
    if kind == "other" and isinstance(fact, (sympy.Le, sympy.Lt, sympy.Ge, sympy.Gt)):
        return _isolated(fact)
    if kind == "range":
        bound = _bound_of_single(fact)
        return fact if bound is None else bound
    if kind == "value":
        (symbol,) = fact.free_symbols
        return sympy.Eq(symbol, _solve_single(fact))
    return fact


def as_range(fact: sympy.Basic, bounds: tuple) -> sympy.Basic | None:
    """A one-dimension inequality as the range it leaves, when they are equivalent.

    ``(length - 1) // 4 >= 1`` is ``length >= 5``: the ShapeEnv narrowed the range to
    ``bounds`` when the fact was adopted; for an expression that never decreases with
    the dimension (sums, positive multiples, floor divisions by positive constants,
    min, max), the fact holds exactly from the new bound on, which is verified at the
    bound and just outside it.
    """
    if isinstance(fact, sympy.Ne) and 0 in (fact.lhs, fact.rhs):
        fact = _at_least_one(fact.lhs + fact.rhs)
    if not isinstance(fact, (sympy.Le, sympy.Lt, sympy.Ge, sympy.Gt)):
        return None
    if (
        len(fact.free_symbols) != 1
        or not _non_decreasing(fact.lhs)
        or not _non_decreasing(fact.rhs, constant=True)
    ):
        return None
    (symbol,) = fact.free_symbols

    def holds(value: int) -> bool:
        return bool(fact.xreplace({symbol: sympy.Integer(value)}))

    low, high = bounds
    if low > 0 and holds(low) and not holds(low - 1):
        return sympy.Ge(symbol, low)
    if high != math.inf and holds(high) and not holds(high + 1):
        return sympy.Le(symbol, high)
    return None


def _at_least_one(expr: sympy.Expr) -> sympy.Basic | None:
    """``expr != 0`` as ``expr >= 1`` where they are equivalent for every size: an
    integer expression of one dimension that never decreases and is not negative at 0
    (``chunk``'s ``(n + 2) // 3 != 0`` is ``(n + 2) // 3 >= 1``); None otherwise."""
    if len(expr.free_symbols) != 1 or not expr.is_integer or not _non_decreasing(expr):
        return None
    (symbol,) = expr.free_symbols
    at_zero = expr.xreplace({symbol: sympy.Integer(0)})
    return sympy.Ge(expr, 1) if at_zero.is_number and at_zero >= 0 else None


def _non_decreasing(expr: sympy.Expr, constant: bool = False) -> bool:
    if expr.is_number:
        return True
    if constant:
        return False
    if expr.is_Symbol:
        return True
    if isinstance(expr, (sympy.Add, sympy.Min, sympy.Max, Min, Max)):
        return all(_non_decreasing(a) for a in expr.args)
    if isinstance(expr, sympy.Mul):
        numbers = [a for a in expr.args if a.is_number]
        rest = [a for a in expr.args if not a.is_number]
        return all(n > 0 for n in numbers) and len(rest) == 1 and _non_decreasing(rest[0])
    if isinstance(expr, FloorDiv):
        return expr.args[1].is_Integer and expr.args[1] > 0 and _non_decreasing(expr.args[0])
    return False
