"""Refine, don't refuse: facts adopted from the example inputs during a trace.

A decision on dynamic dimensions that is neither provable nor refutable (``seq <= 128``
for a position table, ``total == cache + seq`` for a mask, ``dim % 2 == 0`` for a
reshape into halves) takes the example's answer when the dimensions' declarations
allow it (see :mod:`yobx.torch.tracing.dynamic_shapes`):

* string names and ``Dim.DYNAMIC`` adopt it as a :class:`Constraint`, reported in the
  user's names with the line that needed it, and checked when the graph runs; a fact
  making such a dimension a constant raises :class:`SpecializationError`;
* ``Dim.AUTO`` adopts everything, and a dimension forced to a constant becomes static
  with a warning;
* a named ``torch.export.Dim`` adopts nothing: each needed fact is collected with a
  paste-able fix, and the trace ends with one :class:`StrictDimensionError` listing
  them all (tracing goes on after the first, as if the fact held, to find the others).

Adopting a fact makes it known for later decisions (ranges narrow, equal dimensions are
replaced by one another) so that the graph's decisions stay consistent; a divisibility
``dim % m == r`` replaces ``dim`` with ``m * q + r`` for a new dimension ``q``, so that
``dim // m`` and friends are exact from then on.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable

import sympy
from torch.utils._sympy.functions import FloorDiv

from ..dynamic_shapes import AUTO, DYNAMIC, STRICT
from ..errors import DataDependentError, SpecializationError, StrictDimensionError
from ..symbolic.symbolic import (
    DEFAULT_MIN,
    SymbolicDimensions,
    expression_of,
    quotient_lower_bound,
)
from .constraints import Constraint, as_range, classify, normalize, simplest_form

#: :attr:`AdoptedFact.origin` of a decision the default range ``[2, inf]`` settled and
#: that does not hold at sizes 0 or 1 (see :meth:`Refinements.rely_on_default_bounds`):
#: its other side is at a size serving passes (one token, an empty cache, a batch of
#: one), which versions capture first
DEFAULT_BOUND = "default-bound"


@dataclasses.dataclass(frozen=True)
class AdoptedFact:
    """A constraint and its condition on ShapeEnv symbols (for the runtime checks)."""

    constraint: Constraint
    condition: sympy.Basic
    #: what needed it: ``"branch"`` (the model's own Python deciding, ``if x.shape[2] >
    #: 16``), ``"operator"`` (a kernel's guard), ``"number"`` (a Python number needed
    #: from a size, ``int(seq // 2)``) or ``"default-bound"`` (a decision the default
    #: range ``[2, inf]`` settled, which does not hold at sizes 0 or 1)
    origin: str = "operator"


def _lower_bound(condition: sympy.Basic) -> tuple[str, int] | None:
    """``(name, k)`` for ``condition`` reading ``name >= k`` (a ShapeEnv symbol or its
    twin, which share their name), None otherwise."""
    if (
        isinstance(condition, sympy.GreaterThan)
        and condition.lhs.is_Symbol
        and condition.rhs.is_Integer
    ):
        return condition.lhs.name, int(condition.rhs)
    return None


class Refinements:
    """The facts adopted during one trace, and the fixes named Dims need.

    :param dims: the trace's symbolic dimensions
    :param assume: makes a fact known to the ShapeEnv (the tracer's, which does not
        judge the guard it adds)
    :param adopt_all: adopt facts for every dimension, named Dims included, and let any
        dimension become static (``specialize_undecidable=True``)
    :param strict_at_once: raise a named Dim's first needed constraint where it is
        needed instead of collecting them all (robust tracing isolates the module
        needing it)
    """

    def __init__(
        self,
        dims: SymbolicDimensions,
        assume: Callable[[sympy.Basic], None],
        adopt_all: bool = False,
        strict_at_once: bool = False,
    ):
        self.dims = dims
        self.assume = assume
        self.adopt_all = adopt_all
        self.strict_at_once = strict_at_once
        #: the adopted facts, in order
        self.adopted: list[AdoptedFact] = []
        #: constraints named Dims would need, each with its fix
        self.needed: list[tuple[Constraint, str]] = []
        #: conditions of ``torch._check`` calls: (condition, text, location)
        self.user_checks: list[tuple[sympy.Basic, str, str]] = []
        #: the calls of :meth:`rely_on_default_bounds` already made
        self._relied: set[tuple] = set()
        #: the decisions a version of the capture stands on, in their simplest forms
        #: (see :meth:`assume_path`): met again, they are known, not constraints
        self.path_facts: list[sympy.Basic] = []

    def assume_path(self, fact: sympy.Basic, assume: Callable[[sympy.Basic], None]) -> None:
        """Makes known a decision the version being traced stands on (see
        :mod:`yobx.torch.tracing.constraints.versions`): the trace will meet it again in some form
        (``n % 4 != 0`` as torch's ``PythonMod``...), and :meth:`adopt` recognizes it
        there instead of adopting it as a constraint.

        :param fact: the decision, on this trace's symbols
        :param assume: makes a fact known to the ShapeEnv
        """
        assume(fact)
        form = normalize(fact, lambda s: self.dims.range_of(s)[0] >= 1)
        self.path_facts.append(simplest_form(form, classify(form)))

    @property
    def constraints(self) -> list[Constraint]:
        """The adopted constraints, in the order the trace needed them, but the lower
        bounds a stronger one on the same dimension implies (``seq >= 1`` for a loop
        over ``range(1, seq)``, then ``seq >= 2`` for stacking its steps)."""
        bounds = [_lower_bound(fact.condition) for fact in self.adopted]
        strongest: dict[str, int] = {}
        for bound in bounds:
            if bound is not None:
                strongest[bound[0]] = max(bound[1], strongest.get(bound[0], bound[1]))
        return [
            fact.constraint
            for fact, bound in zip(self.adopted, bounds)
            if bound is None or bound[1] == strongest[bound[0]]
        ]

    def adopt(
        self,
        fact: sympy.Basic,
        location: str,
        what: str,
        known: bool = False,
        origin: str = "operator",
    ) -> Constraint:
        """Adopts ``fact``, true for the example, as a constraint.

        :param fact: the relation that holds for the example inputs
        :param location: the user's ``file:line``
        :param what: what needed it (``the condition``, ``method 'reshape'``)
        :param known: the ShapeEnv already knows it (a guard installed by a kernel)
        :param origin: what needed it (:attr:`AdoptedFact.origin`)
        :raises DataDependentError: the fact depends on tensor values
        :raises SpecializationError: it would make a dimension declared dynamic a constant
        """
        dims = self.dims
        if dims.is_data_dependent(fact):
            raise self.data_dependent_error(fact, location, what)
        original = fact
        fact = normalize(fact, lambda s: dims.range_of(s)[0] >= 1)
        kind = classify(fact)
        form = simplest_form(fact, kind)
        if kind == "value":
            form = self._declared_value(form)
        if form in self.path_facts:
            # a decision the version stands on: known, checked by the choice of version
            if not known:
                self.assume(original)
            return Constraint(dims.render(form), kind, location, tuple(dims.symbols_of(form)))
        strict = not self.adopt_all and any(dims.policy_of(s) == STRICT for s in form.free_symbols)
        if kind == "value" and not strict:
            self._allow_constant(form, location, what)
        if strict and self.strict_at_once:
            names = tuple(dims.symbols_of(form))
            need = Constraint(dims.render(form), kind, location, names)
            raise self._strict_error([(need, self._fix(form, kind, location))], what)
        if not known:
            self.assume(original)
        if _holds_over_declared(form, dims.declared, dims.default_min):
            # `(((h - 1)//4 - 1)//2 + 1) * (...) >= 0`: a torch kernel asked what the
            # declared ranges already settle (interval arithmetic), no constraint
            return Constraint(dims.render(form), kind, location, tuple(dims.symbols_of(form)))
        if form != original:
            # the simplest form tells the ShapeEnv more (`seq <= 128` narrows the range
            # where `seq == min(128, seq)` does not)
            self.assume(form)
        if kind == "other" and len(form.free_symbols) == 1:
            interval = as_range(form, dims.range_of(next(iter(form.free_symbols))))
            if interval is not None:
                kind, form = "range", interval
        names = tuple(dims.symbols_of(form))
        constraint = Constraint(dims.render(form), kind, location, names)
        if strict:
            self.needed.append((constraint, self._fix(form, kind, location)))
        elif not any(
            # the same fact reached another way (reshape checks a remainder and a product)
            f.condition == form and f.constraint.location == location
            for f in self.adopted
        ):
            self.adopted.append(AdoptedFact(constraint, form, origin))
        if kind == "divisibility":
            self._introduce_quotient(form)
        return constraint

    def _declared_value(self, form: sympy.Basic) -> sympy.Basic:
        """``q == 3`` for ``w == 2*q + 1`` is ``w == 7``: a value in the declared names."""
        (symbol,) = form.free_symbols
        definition = self.dims.definitions.get(symbol)
        if definition is None:
            return form
        (base,) = definition.free_symbols
        value = self.dims.shape_env.replace(base).xreplace({symbol: form.rhs})
        return self._declared_value(sympy.Eq(base, value)) if value.is_Integer else form

    def _allow_constant(self, form: sympy.Basic, location: str, what: str) -> None:
        (symbol,) = form.free_symbols
        name = self.dims.render(symbol)
        if self.adopt_all or self.dims.policy_of(symbol) == AUTO:
            warnings.warn(
                f"{location}: {what} needs `{self.dims.render(form)}`: dimension "
                f"{name!r} (Dim.AUTO) becomes static",
                stacklevel=2,
            )
            return
        if self.dims.policy_of(symbol) == DYNAMIC:
            value = form.rhs if form.lhs == symbol else form.lhs
            error = SpecializationError.at(
                location,
                f"{what} needs `{self.dims.render(form)}`, which makes "
                f"dimension {name!r} always {value} (its size in the example), but it is "
                f"declared dynamic. If it is static, declare it so: None or "
                f"torch.export.Dim.STATIC for this axis in dynamic_shapes (or Dim.AUTO to "
                f"let the tracer make it static with a warning); otherwise rewrite this line "
                f"so that it works for every size of {name!r}.",
                expression=self.dims.render(form),
                dimensions=(name,),
            )
            # what the tracer's versions need to capture the other side of it (sizes
            # where it is false: the side of the example becomes one version)
            error.fact = self.dims.user_expression(form)
            raise error

    def _introduce_quotient(self, form: sympy.Basic) -> None:
        """``dim % m == r``: from now on ``dim`` is ``m * q + r`` for a new ``q``."""
        dims = self.dims
        base, divisor = form.lhs.args
        remainder = int(form.rhs)
        if not base.is_Symbol or base in dims.shape_env.replacements:
            return
        modulus = int(divisor)
        low, high = dims.range_of(base)
        hint = int(dims.shape_env.backed_var_to_val[base])
        name = f"{dims.render(base)}_div{modulus}"
        relaxable = base in dims.default_min and low == DEFAULT_MIN
        lowest = quotient_lower_bound(low, modulus, remainder)
        quotient, _ = dims.new_symbol(
            name,
            (hint - remainder) // modulus,
            lowest,
            None if high == math.inf else (int(high) - remainder) // modulus,
            # positive for sympy only when it is at least 1 whatever the sizes: not when
            # its lower bound comes from the default one (`n = 2*q + 1`, q >= 1 from
            # n >= 2; see SymbolicDimensions.lowest_bound), nor when it is 0 (`n = 1`
            # in the example: n >= 1, q >= 0), where sympy would fold `q == 0` to False
            positive=True if lowest >= 1 and not relaxable else None,
        )
        if relaxable:
            dims.default_quotients[quotient] = (modulus, remainder)
        dims.definitions[quotient] = FloorDiv(base - remainder, modulus)
        base_name = dims.user_expression(base)
        # a sympy symbol is its own expression: never None
        assert base_name is not None
        dims._rename[quotient] = (base_name - remainder) / modulus
        dims.shape_env._set_replacement(base, modulus * quotient + remainder, "divisibility")

    def rely_on_default_bounds(
        self, build: Callable | None, operands: list, value, location: str
    ) -> None:
        """A decision proved with the default range ``[2, inf]`` of some dimensions.

        When it does not hold for their smaller sizes too (see
        :meth:`SymbolicDimensions.lowest_bound`), the decision itself becomes a
        constraint (``batch >= 1`` for ``batch == 0 -> False``, ``h*w != 1``), so that
        the graph refuses the sizes it would be wrong for and accepts the others.
        """
        dims = self.dims
        # a model makes the same decision in every layer (`seq > 1` in each attention):
        # the same call with what the ShapeEnv knew then adopts nothing new (the
        # constraints are kept once per expression), and proving it costs milliseconds
        key = self._relied_key(build, operands, value)
        if key is not None:
            if key in self._relied:
                return
            self._relied.add(key)
        claim, symbols, low = dims.lowest_bound(build, operands, value)
        if low == 0:
            return
        if claim is None:
            # an operation whose value cannot be rebuilt: the default bound itself
            # each from where its range starts (the default 2, or its example's 1)
            claims = [
                sympy.Ge(dims.twin(s), min(low, dims.range_of(s)[0]))
                for s in sorted(symbols, key=str)
            ]
        elif isinstance(claim, sympy.Ne) and 0 in (claim.lhs, claim.rhs):
            # a product of sizes other than 0 (`numel() == 0 -> False`): each is >= 1
            product = claim.lhs + claim.rhs
            factors = [f for f in sympy.Mul.make_args(product) if not f.is_number]
            claims = (
                [sympy.Ge(f, 1) for f in factors] if all(f.is_Symbol for f in factors) else [claim]
            )
        else:
            claims = [claim]
        for fact in claims:
            fact = normalize(fact, lambda s: True)
            kind = classify(fact)
            form = simplest_form(fact, kind)
            originals = {s: dims.original(s) for s in form.free_symbols}
            if self.path_facts and form.xreplace(originals) in self.path_facts:
                # a decision the version stands on: the choice of version checks it
                continue
            if kind == "other" and len(form.free_symbols) == 1:
                (symbol,) = form.free_symbols
                interval = as_range(form, (low, dims.range_of(symbol)[1]))
                if interval is not None:
                    kind, form = "range", interval
            expression = dims.render(form)
            if any(adopted.constraint.expression == expression for adopted in self.adopted):
                continue
            names = tuple(dims.symbols_of(form))
            constraint = Constraint(expression, kind, location, names)
            self.adopted.append(AdoptedFact(constraint, form, DEFAULT_BOUND))

    def _relied_key(self, build: Callable | None, operands: list, value) -> tuple | None:
        """A call of :meth:`rely_on_default_bounds` and what its result depends on
        (the ranges, the replacements and the dimensions with a default lower bound),
        or None when an operand is not hashable."""
        shape_env = self.dims.shape_env
        try:
            key = (
                build,
                tuple(expression_of(o) if expression_of(o) is not None else o for o in operands),
                value,
                frozenset(shape_env.var_to_range.items()),
                frozenset(shape_env.replacements.items()),
                frozenset(self.dims.default_min),
            )
            hash(key)
        except TypeError:
            return None
        return key

    # strict dimensions

    def _fix(self, form: sympy.Basic, kind: str, location: str) -> str:
        """A paste-able fix making ``form`` part of the declaration."""
        dims = self.dims
        render = dims.render
        if kind == "range":
            (symbol,) = form.free_symbols
            low, high = dims.range_of(symbol)
            if isinstance(form, sympy.Le):
                high = min(high, int(form.rhs))
            elif isinstance(form, sympy.Ge):
                low = max(low, int(form.rhs))
            bounds = [f"min={low}"] if low > 2 else []
            bounds += [] if high == math.inf else [f"max={high}"]
            name = render(symbol)
            arguments = "".join(f", {bound}" for bound in bounds)
            return f'{name} = torch.export.Dim("{name}"{arguments})'
        if kind == "divisibility":
            base, divisor = form.lhs.args
            name = render(base)
            shift = f" + {form.rhs}" if form.rhs != 0 else ""
            return f'{name} = {divisor} * torch.export.Dim("{name}_div{divisor}"){shift}'
        if kind == "value":
            (symbol,) = form.free_symbols
            return (
                f"None (or torch.export.Dim.STATIC) for the axis of {render(symbol)!r}: "
                f"the code needs `{render(form)}`"
            )
        if kind == "relation":
            for symbol in sorted(form.free_symbols, key=str):
                replacement = dims.shape_env.replacements.get(symbol)
                # a derived Dim is `a * root + b`: one root, integer coefficients
                if (
                    replacement is not None
                    and len(replacement.free_symbols) == 1
                    and symbol not in replacement.free_symbols
                    and replacement.is_polynomial()
                    and sympy.Poly(replacement).is_linear
                    and all(c.is_Integer for c in sympy.Poly(replacement).all_coeffs())
                ):
                    return (
                        f"{render(symbol)} = {render(replacement)}  (declare {render(symbol)!r} "
                        f"as this derived Dim)"
                    )
        return f"torch._check({render(form)})  # before {location}"

    def strict_error(self) -> StrictDimensionError | None:
        """One error listing every constraint named Dims need, None if there is none."""
        return self._strict_error(self.needed) if self.needed else None

    @staticmethod
    def _strict_error(needed: list, what: str = "") -> StrictDimensionError:
        lines = [
            f"  - `{c.expression}` ({c.kind}, needed at {c.location})\n      fix: {fix}"
            for c, fix in needed
        ]
        where = f"{needed[0][0].location}: {what} needs" if what else "the traced code needs"
        return StrictDimensionError(
            f"{where} constraints on dimensions declared with torch.export.Dim, which "
            f"adopts nothing from the example inputs; declare them ({len(needed)} found):\n"
            + "\n".join(lines)
            + "\nor declare the dimensions with a string name or Dim.DYNAMIC to adopt "
            "such facts as checked constraints.",
            needed,
        )

    # data-dependent decisions

    def data_dependent_error(self, fact, location: str, what: str) -> DataDependentError:
        """The error for a decision that depends on tensor values."""
        expression = self.dims.render(fact)
        return DataDependentError.at(
            location,
            f"{what} `{expression}` depends on tensor values (.item(), "
            f"nonzero, a mask's count...), which a graph cannot decide while tracing. "
            f"Write the branch with torch.cond(pred, true_fn, false_fn, operands), "
            f"or compute both sides and select with torch.where.",
            expression=expression,
        )


__all__ = ["AdoptedFact", "Refinements"]


def _holds_over_declared(fact: sympy.Basic, declared: dict, default_min: set) -> bool:
    """``fact`` (an inequality, ``!=`` included) holds for every size in the declared
    ranges, by the interval arithmetic of torch's ``bound_sympy``; False for a fact on
    a symbol without a declared range. A dimension declared without ``min`` counts from 0: the
    graph accepts sizes 0 and 1 unless a decision relied on the default minimum."""
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    if not isinstance(fact, (sympy.Ge, sympy.Gt, sympy.Le, sympy.Lt, sympy.Ne)):
        return False
    ranges = {}
    for symbol in fact.free_symbols:
        if symbol not in declared:
            return False
        low, high = declared[symbol]
        low = 0 if symbol in default_min else low
        ranges[symbol] = ValueRanges(low, sympy.oo if high is None else high)
    try:
        bounds = bound_sympy(fact.lhs - fact.rhs, ranges)
    except Exception:  # an expression torch's interval arithmetic does not know
        return False
    if isinstance(fact, sympy.Ge):
        return bool(bounds.lower >= 0)
    if isinstance(fact, sympy.Gt):
        return bool(bounds.lower > 0)
    if isinstance(fact, sympy.Le):
        return bool(bounds.upper <= 0)
    if isinstance(fact, sympy.Lt):
        return bool(bounds.upper < 0)
    # a != b: the difference never reaches 0
    return bool(bounds.lower > 0 or bounds.upper < 0)
