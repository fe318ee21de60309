"""Symbolic dimensions: named symbols in a ShapeEnv and sound decisions on them.

A dynamic dimension becomes a ShapeEnv symbol (``s0``, ``s26``...) whose value range
comes from the user's ``Dim(min=..., max=...)`` (default ``[2, int_oo]`` as in
torch.export). The symbol keeps its user-facing name in :attr:`SymbolicDimensions.names`
so that every message and guard is written with the user's names (``batch >= 100``).

Comparisons are decided with :func:`statically_known_true`, which only uses what is
known (ranges, facts added by ``torch._check``, replacements implied by equal names),
never the example's size.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    statically_known_true,
)
from torch.fx.proxy import TraceError
from torch.utils._sympy.numbers import int_oo

from .integer_bounds import nonpositive

#: Default lower bound of a dynamic dimension, the same as torch.export's.
DEFAULT_MIN = 2


@dataclasses.dataclass
class Guard:
    """One assumption a traced graph relies on.

    :param expression: the condition, written with the user's dimension names
    :param value: the value it was decided to have
    :param reason: why it is known: ``"bounds"`` (provable from the declared ranges and
        checked facts), ``"torch._check"`` (a fact the user asserted),
        ``"specialized"`` (taken from the example because the user allowed it) or
        ``"constant argument"`` (a Python scalar input baked into the graph)
    :param location: the user's ``file:line`` that required it
    """

    expression: str
    value: Any
    reason: str
    location: str = ""

    def __str__(self) -> str:
        where = f"  [{self.location}]" if self.location else ""
        return f"{self.expression} -> {self.value} ({self.reason}){where}"


class SymbolicDimensions:
    """Owns the ShapeEnv and FakeTensorMode of one trace and the user names of symbols."""

    def __init__(self) -> None:
        self.shape_env = ShapeEnv(
            specialize_zero_one=False,
            duck_shape=False,
            allow_dynamic_output_shape_ops=True,
            allow_scalar_outputs=True,
        )
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env, allow_non_fake_inputs=True)
        #: user name -> SymInt
        self.by_name: dict[str, torch.SymInt] = {}
        #: ShapeEnv symbol name -> user name
        self.names: dict[str, str] = {}
        self._hints: dict[str, int] = {}
        self._rename: dict[sympy.Symbol, sympy.Symbol] = {}

    # creation

    def dimension(
        self, name: str, hint: int, min_value: int | None = None, max_value: int | None = None
    ) -> torch.SymInt:
        """Returns the SymInt for dimension ``name``, creating it the first time.

        :param name: the user's name of the dimension
        :param hint: the size in the example inputs
        :param min_value: lower bound (default :data:`DEFAULT_MIN`)
        :param max_value: upper bound (default unbounded)
        :raises ValueError: when the example contradicts the bounds or an earlier size
        """
        if name in self.by_name:
            if self._hints[name] != hint:
                raise ValueError(
                    f"dynamic dimension {name!r} has size {self._hints[name]} in one input "
                    f"and {hint} in another; inputs sharing a dimension name must agree, "
                    f"give them different names if they are independent"
                )
            return self.by_name[name]
        low = DEFAULT_MIN if min_value is None else int(min_value)
        high = max_value
        if high is not None and (high in (int_oo, sympy.oo) or high >= 2**62):
            high = None
        if hint < low or (high is not None and hint > high):
            upper = "inf" if high is None else high
            raise ValueError(
                f"the example size {hint} of dynamic dimension {name!r} is outside its "
                f"range [{low}, {upper}]; use an example inside the range or declare "
                f"Dim({name!r}, min=..., max=...) accordingly (dynamic dimensions start "
                f"at {DEFAULT_MIN} unless min= says otherwise)"
            )
        source = ConstantSource(f"dim_{len(self.by_name)}_{_identifier(name)}")
        symbol = self.shape_env.create_symbol(hint, source=source, dynamic_dim=DimDynamic.DYNAMIC)
        self.shape_env.constrain_symbol_range(
            symbol, compiler_min=low, compiler_max=int_oo if high is None else int(high)
        )
        symint = self.shape_env.create_symintnode(symbol, hint=hint, source=source)
        self.by_name[name] = symint
        self.names[str(symbol)] = name
        self._hints[name] = hint
        self._rename[symbol] = sympy.Symbol(name, integer=True)
        return symint

    def fake_tensor(self, tensor: torch.Tensor, sizes: list[int | torch.SymInt]) -> torch.Tensor:
        """Returns a fake tensor with the dtype and device of ``tensor`` and ``sizes``."""
        with self.fake_mode:
            fake = torch.empty(sizes, dtype=tensor.dtype, device=tensor.device)
            if isinstance(tensor, torch.nn.Parameter):
                fake.requires_grad_(tensor.requires_grad)
        return fake

    def from_real(self, tensor: torch.Tensor) -> torch.Tensor:
        """Returns a fake tensor with the static shape of a real tensor (a constant)."""
        return self.fake_mode.from_tensor(tensor, static_shapes=True)

    # rendering

    def render(self, value: Any) -> str:
        """Writes a symbolic expression (SymInt, SymBool, sympy) with the user's names."""
        expr = _expression(value)
        if expr is None:
            return str(value)
        expr = expr.xreplace(self._rename)
        return _pretty(expr)

    def symbols_of(self, value: Any) -> list[str]:
        """Returns the user names of the dimensions an expression depends on."""
        expr = _expression(value)
        if expr is None:
            return []
        return sorted(self.names.get(str(s), str(s)) for s in expr.free_symbols)

    def describe_ranges(self, value: Any) -> str:
        """Describes the known range of every dimension in an expression."""
        expr = _expression(value)
        if expr is None:
            return ""
        parts = []
        for s in sorted(expr.free_symbols, key=str):
            vr = self.shape_env.var_to_range.get(s)
            name = self.names.get(str(s), str(s))
            if vr is None:
                parts.append(f"{name} (data-dependent)")
            else:
                upper = "inf" if vr.upper >= int_oo else int(vr.upper)
                parts.append(f"{name} in [{int(vr.lower)}, {upper}]")
        return ", ".join(parts)

    # decisions

    def decide(self, value: torch.SymBool) -> bool | None:
        """Returns the value of a SymBool if it is provable, None otherwise."""
        if statically_known_true(value):
            return True
        if statically_known_true(torch.sym_not(value)):
            return False
        return self.prove(value.node.expr)

    def snapshot(self) -> tuple[dict, dict]:
        """What is known now (ranges, replacements), to judge guards added later."""
        return dict(self.shape_env.var_to_range), dict(self.shape_env.replacements)

    def prove(self, expr: sympy.Basic, known: tuple[dict, dict] | None = None) -> bool | None:
        """Decides an inequality with floor divisions from the dimensions' ranges.

        ShapeEnv cannot show ``seq // 2 <= seq``. Each ``a // c`` (constant ``c > 0``)
        lies in ``[(a - c + 1) / c, a / c]``; replacing it by the bound that makes the
        difference of both sides largest (or smallest) gives a floor-free expression
        whose range :func:`bound_sympy` computes. Only a proof is returned: None when
        the bounds do not settle it.

        :param known: a :meth:`snapshot`; a guard installed by an operation also narrows
            the ranges, so it must be judged against what was known before
        """
        ranges, replacements = known if known is not None else self.snapshot()
        expr = expr.xreplace(replacements)
        if expr in (sympy.true, sympy.false):
            return bool(expr)
        if isinstance(expr, (sympy.And, sympy.Or)):
            # torch._check(a and b) in torch's kernels: each part is judged alone
            parts = [self.prove(part, known) for part in expr.args]
            decisive = isinstance(expr, sympy.Or)  # the value one part decides
            if decisive in parts:
                return decisive
            return None if None in parts else not decisive
        if isinstance(expr, (sympy.Ne, sympy.Eq)):
            # a != b follows from a < b or a > b
            apart = self.prove(sympy.Lt(expr.lhs, expr.rhs), known) or self.prove(
                sympy.Gt(expr.lhs, expr.rhs), known
            )
            if apart:
                return isinstance(expr, sympy.Ne)
            # a == b follows from a <= b and a >= b
            if self.prove(sympy.Le(expr.lhs, expr.rhs), known) and self.prove(
                sympy.Ge(expr.lhs, expr.rhs), known
            ):
                return isinstance(expr, sympy.Eq)
            return None
        if not isinstance(expr, (sympy.Le, sympy.Lt, sympy.Ge, sympy.Gt)):
            return None
        if isinstance(expr, (sympy.Le, sympy.Lt)):
            diff, strict = expr.lhs - expr.rhs, isinstance(expr, sympy.Lt)
        else:
            diff, strict = expr.rhs - expr.lhs, isinstance(expr, sympy.Gt)
        # claim: diff < 0 (strict) or diff <= 0
        high = self._bound(diff, ranges, upper=True)
        if high is not None and (high < 0 or (not strict and high <= 0)):
            return True
        low = self._bound(diff, ranges, upper=False)
        if low is not None and (low > 0 or (strict and low >= 0)):
            return False
        if diff.is_integer:
            # sizes are integers: see integer_bounds (Min/Max, x <= 0 from x < 1,
            # divisions by a dimension)
            if nonpositive(diff + 1 if strict else diff, ranges, self._bound):
                return True
            if nonpositive(-diff if strict else 1 - diff, ranges, self._bound):
                return False
        return None

    @staticmethod
    def _bound(diff: sympy.Expr, var_to_range: dict, upper: bool):
        from torch.utils._sympy.functions import FloorDiv
        from torch.utils._sympy.value_ranges import bound_sympy

        diff = sympy.expand(diff)
        replacements = {}
        for term in diff.atoms(FloorDiv):
            base, divisor = term.args
            if not (divisor.is_Integer and divisor > 0):
                return None
            coefficient = diff.coeff(term)
            if not coefficient.is_number or term in coefficient.free_symbols:
                return None
            take_high = (coefficient > 0) == upper
            replacements[term] = (base / divisor) if take_high else (base - divisor + 1) / divisor
        free = diff.xreplace(replacements)
        if free.atoms(FloorDiv) or any(not s.is_Symbol for s in free.free_symbols):
            return None
        ranges = {s: var_to_range[s] for s in free.free_symbols if s in var_to_range}
        if len(ranges) != len(free.free_symbols):
            return None
        bound = bound_sympy(free, ranges)
        value = bound.upper if upper else bound.lower
        return value if value.is_number and value.is_finite else None

    def assume(self, value: torch.SymBool) -> None:
        """Adds a fact (``torch._check``) and the relations it implies.

        ShapeEnv stores ``a < b`` and its negation only; ``a <= b`` and ``a != b``
        follow from it and are needed to prove slicing bounds, so they are added too.
        """
        torch._check(value)
        expr = value.node.expr
        implied = []
        if isinstance(expr, (sympy.Lt, sympy.Gt)):
            implied = [
                sympy.Le(expr.lhs, expr.rhs)
                if isinstance(expr, sympy.Lt)
                else sympy.Ge(expr.lhs, expr.rhs),
                sympy.Ne(expr.lhs, expr.rhs),
            ]
        for fact in implied:
            symbool = self.shape_env.create_symboolnode(fact)
            if self.decide(symbool) is None:
                torch._check(symbool)

    def hint(self, value: Any) -> Any:
        """The value a symbolic expression takes on the example inputs."""
        if isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat)):
            return value.node.hint
        return value

    def undecidable_error(self, value: Any, location: str, what: str = "") -> TraceError:
        """Builds the TraceError raised when a comparison cannot be decided."""
        expression = self.render(value)
        ranges = self.describe_ranges(value)
        dims = self.symbols_of(value)
        hint = self.hint(value)
        msg = (
            f"{location}: cannot decide {what or 'the condition'} `{expression}` "
            f"while tracing: it depends on dynamic dimension(s) {', '.join(dims)} "
            f"({ranges}) and is not provable from what is known "
            f"(it is {hint} for the example inputs, but the graph must hold for every "
            f"size). To make it decidable: narrow the dimension's range with "
            f"torch.export.Dim(name, min=..., max=...), assert a fact with "
            f"torch._check(...) before this line, make the dimension static, "
            f"or write the branch with torch.cond."
        )
        return TraceError(msg)


def _expression(value: Any) -> sympy.Expr | None:
    if isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        return value.node.expr
    if isinstance(value, sympy.Basic):
        return value
    return None


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


_RELATIONS = {
    sympy.Eq: "==",
    sympy.Ne: "!=",
    sympy.Lt: "<",
    sympy.Le: "<=",
    sympy.Gt: ">",
    sympy.Ge: ">=",
}


def _pretty(expr: sympy.Basic) -> str:
    """Python-like rendering of relations (sympy prints ``Eq(a, b)``)."""
    for cls, op in _RELATIONS.items():
        if isinstance(expr, cls):
            return f"{_pretty(expr.lhs)} {op} {_pretty(expr.rhs)}"
    if isinstance(expr, sympy.Not):
        return f"not ({_pretty(expr.args[0])})"
    if isinstance(expr, sympy.And):
        return " and ".join(f"({_pretty(a)})" for a in expr.args)
    if isinstance(expr, sympy.Or):
        return " or ".join(f"({_pretty(a)})" for a in expr.args)
    return str(expr)
