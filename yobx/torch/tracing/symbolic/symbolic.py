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
import functools
import math
import operator
from collections.abc import Callable
from typing import Any, cast

import sympy
import torch
from torch._guards import GuardSource, Source, dataclass_with_cached_hash
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    statically_known_true,
)
from torch.utils._sympy.functions import FloorDiv, Max, Min, Mod, PythonMod
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges

from yobx.torch.bounded_cache import BoundedCache

from ..dynamic_shapes import UNBOUNDED
from .expression_text import pretty
from .range_proofs import prove_from_ranges
from .residues import padding_as_ceiling
from .static_fakes import StaticFakes


@dataclass_with_cached_hash(frozen=True)
class DimensionSource(Source):
    """Where a user's dimension comes from, for the ShapeEnv (its messages name it).

    The same as dynamo's ``ConstantSource``, which lives in ``torch._dynamo.source``:
    importing that module imports dynamo (half a second), which importing the tracer
    does not need (the first trace does: creating a ShapeEnv imports it).
    """

    source_name: str

    @property
    def guard_source(self) -> GuardSource:
        return GuardSource.CONSTANT

    @property
    def _name_template(self) -> str:
        return self.source_name

    def make_guard(self, fn: Any) -> Any:
        raise NotImplementedError


def static_fake(fake_mode: FakeTensorMode, tensor: torch.Tensor) -> torch.Tensor:
    """The fake tensor of a real tensor (a parameter, a buffer, a constant), static
    shape, one per tensor.

    A tensor on the meta device (a model built without its weights) becomes a fake CPU
    tensor: the model computes as on the CPU, where its inputs and the tensors its
    ``forward`` creates live, and no data is ever read.
    """
    fake = fake_mode.from_tensor(tensor, static_shapes=True)
    if tensor.device.type == "meta" and fake.device.type == "meta":
        fake.fake_device = torch.device("cpu")
    return fake


#: Default lower bound of a dynamic dimension, the same as torch.export's.
DEFAULT_MIN = 2

#: the range ShapeEnv.create_symbol gives a size (``specialize_zero_one=False``)
_NEW_SIZE_RANGE = ValueRanges(0, int_oo)
#: results of :meth:`SymbolicDimensions.prove` by expression and what was known, and a
#: mark for a question not asked yet
_PROOFS: dict[tuple, bool | None] = BoundedCache(20_000)
_UNPROVED = object()
#: torch's own undecided questions longer than this are not given to the prover
_MAX_PROVED_OPERATIONS = 24


@dataclasses.dataclass
class Guard:
    """One assumption a traced graph relies on.

    :param expression: the condition, written with the user's dimension names
    :param value: the value it was decided to have
    :param reason: why it is known: ``"bounds"`` (provable from the declared ranges and
        checked facts), ``"torch._check"`` (a fact the user asserted),
        ``"adopted"`` (taken from the example and recorded as a constraint, see
        :mod:`yobx.torch.tracing.constraints.refinement`), ``"constant argument"`` (a Python
        scalar input baked into the graph), or, for a module
        :class:`~yobx.torch.tracing.RobustTracer` runs as an opaque leaf, the output
        shapes it produced: ``"specialized"`` (on fake inputs with symbolic dimensions)
        or ``"example"`` (taken from the eager run when the fake run failed)
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
    """Owns the ShapeEnv and FakeTensorMode of one trace and the user names of symbols.

    Besides the names, it remembers for every symbol how the user declared it (its
    :attr:`policies`: may a fact be adopted from the example?) and where its value comes
    from when the graph runs (:attr:`sources`: an input's axis), which is what the
    runtime checks of the constraints need.
    """

    def __init__(self) -> None:
        self.shape_env = ShapeEnv(
            specialize_zero_one=False,
            duck_shape=False,
            allow_dynamic_output_shape_ops=True,
            allow_scalar_outputs=True,
        )
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env, allow_non_fake_inputs=True)
        #: the fake copies of the traced module's plain parameters and buffers
        self.static_fakes = StaticFakes(self.fake_mode)
        #: user name -> SymInt
        self.by_name: dict[str, torch.SymInt] = {}
        #: ShapeEnv symbol name -> user name
        self.names: dict[str, str] = {}
        #: symbol -> :data:`~yobx.torch.tracing.dynamic_shapes.DYNAMIC`, ``AUTO``, ``STRICT``
        self.policies: dict[sympy.Symbol, str] = {}
        #: symbol -> (input leaf name, axis, a, b): the axis has size ``a * symbol + b``
        #: (axis None: an int input declared dynamic, its value)
        self.sources: dict[sympy.Symbol, tuple[str, int | None, int, int]] = {}
        #: every declared dynamic axis: (input leaf name, axis, expected size expression)
        self.occurrences: list[tuple[str, int | None, sympy.Expr]] = []
        #: declared bounds of each symbol, checked when the graph runs
        self.declared: dict[sympy.Symbol, tuple[int, int | None]] = {}
        #: ``file:line`` of the call declaring them (``trace(..., dynamic_shapes=...)``),
        #: the location of their checks
        self.declared_at = ""
        #: symbols whose lower bound is the default one (see :meth:`lowest_bound`)
        self.default_min: set[sympy.Symbol] = set()
        #: the quotients ``q`` of a dimension of :attr:`default_min` written ``m*q + r``
        #: (``n % m == r``), whose lower bound comes from the default one: ``(m, r)``
        self.default_quotients: dict[sympy.Symbol, tuple[int, int]] = {}
        #: names of dimensions without a declared minimum that take a size below the
        #: default minimum, 1 or 0, and the smallest (their example's size, or the
        #: example's of the capture this one stands in for)
        self.small_sizes: dict[str, int] = {}
        #: symbols introduced by a divisibility (``dim == 2*k``): k -> its value
        #: as an expression of the other symbols (``(dim - r) // m``)
        self.definitions: dict[sympy.Symbol, sympy.Expr] = {}
        #: loop-index symbols -> the largest value they take (``stop - 1``): a relation
        #: the ranges cannot hold, known to :meth:`prove` (see :mod:`.loops`)
        self.loop_bounds: dict[sympy.Symbol, sympy.Expr] = {}
        self._hints: dict[str, int] = {}
        self._rename: dict[sympy.Symbol, sympy.Expr] = {}
        self._twins: dict[sympy.Symbol, sympy.Symbol] = {}
        self._originals: dict[sympy.Symbol, sympy.Symbol] = {}
        #: called with ``(condition, value)`` when torch decides, from the ranges alone,
        #: whether a floor division of sizes is 0 and the answer rests on the default
        #: lower bound (see :meth:`consult_prover`); None: such decisions are not
        #: reported (the tracer sets it while torch splits a tensor into pieces)
        self.on_default_bound_division: Callable[[sympy.Basic, bool], None] | None = None
        #: called with ``(condition, value)`` when torch decides, from the ranges alone,
        #: an inequality of sizes whose answer is another one when the dimensions with
        #: the default lower bound are 1 (see :meth:`consult_prover`); None: such
        #: decisions are not reported (the tracer sets it while torch slices a tensor)
        self.on_default_bound_decision: Callable[[sympy.Basic, bool], None] | None = None

    def __deepcopy__(self, memo: dict) -> SymbolicDimensions:
        """A deep copy is the same object: the dimensions of one trace are not copied.

        Graph modules keep their trace's dimensions in ``meta`` and users deep-copy graph
        modules (``copy.deepcopy(gm)``). The copy must keep the same symbols: the fake
        values in its nodes' ``meta`` are shared with the original and belong to this
        ShapeEnv. And copying the FakeTensorMode would duplicate the ``StorageWeakRef``
        objects its converter keeps for constant tensors: each copy releases the same
        weak reference when collected, the storage is released once too often and the
        process later crashes (a freed ``StorageImpl`` written to).
        """
        memo[id(self)] = self
        return self

    def consult_prover(self) -> None:
        """Lets torch's own static decisions use :meth:`prove` when it finds no answer.

        Kernels ask the ShapeEnv questions like ``max(0, min(1, s - s//2)) == 1``
        (``expand`` after a slice), true for every size but beyond its simplifier;
        without an answer they guard on the example or, size-obliviously, take the
        answer for large sizes, which can be wrong. Only a proof is returned; the hook
        is set on this ShapeEnv instance, nothing global changes.
        """
        shape_env = self.shape_env
        original = shape_env._maybe_evaluate_static
        # kernels ask the same questions again and again (every view of a layer):
        # answers are kept until the ShapeEnv learns something new
        answers: dict[sympy.Basic, Any] = {}
        failed: set[tuple] = set()
        version = [None]

        reported: set[sympy.Basic] = set()

        def maybe_evaluate_static(expr, **kwargs):
            if version[0] != shape_env._version_counter:
                answers.clear()
                failed.clear()
                version[0] = shape_env._version_counter
            key = (expr, tuple(sorted(kwargs.items(), key=lambda item: item[0])))
            try:
                result = None if key in failed else original(expr, **kwargs)
            except TypeError:
                # torch's bounds of a size written with a fraction (`(n - n % 2)/2`,
                # the half of an even size) have fractional ends, and the floor
                # division of such bounds compares an unevaluated `1 // (1/2)`
                # ("cannot determine truth value of Relational"): no static answer,
                # the question is then answered as any other (the prover, or a
                # guard); torch does not cache a failure, so it is remembered here
                failed.add(key)
                result = None
            if result is not None:
                if (
                    self.on_default_bound_decision is not None
                    and result in (sympy.true, sympy.false)
                    and expr not in reported
                    and not kwargs
                    and _differs_at_one(expr, result, self.default_min)
                ):
                    # `x[0:2]` decides `2 > n -> False` from the default range: the
                    # slice has 2 rows, where eager has 1 at n = 1. Reported, the
                    # decision gets a version at that size as any other decision the
                    # default range settles
                    reported.add(expr)
                    self.on_default_bound_decision(expr, bool(result))
                elif (
                    self.on_default_bound_division is not None
                    and result in (sympy.true, sympy.false)
                    and expr not in reported
                    and not kwargs
                    and _quotient_is_zero(expr)
                    and expr.free_symbols & self.default_min
                ):
                    # `chunk` decides `(n + 2) // 3 == 0 -> False` inside torch with
                    # the default range, then divides by that quotient (the number of
                    # pieces): at n = 0 the graph would divide by zero. Reported, the
                    # decision gets a version at that size as any other decision the
                    # default range settles. Other static decisions (a product of sizes
                    # is not 0: an empty tensor's fast path) change no shape
                    reported.add(expr)
                    self.on_default_bound_division(expr, bool(result))
                return result
            if (
                kwargs.get("var_to_range") is not None
                or kwargs.get("axioms") is not None
                or kwargs.get("unbacked_only")
                or not isinstance(expr, sympy.logic.boolalg.Boolean)
                # torch's own bounds handle a floor division alone, not how it
                # compares with what it divides (`4*(n//4) <= n`, a slice to whole
                # blocks); minima, maxima and remainders are where its simplifier
                # stops short too
                or not expr.has(Mod, PythonMod, Min, Max, sympy.Min, sympy.Max, FloorDiv)
                # long expressions are the strides of contiguity questions, which only
                # choose a layout; proving them costs more than it brings
                or sympy.count_ops(expr) > _MAX_PROVED_OPERATIONS
            ):
                return result
            if expr not in answers:
                proved = self.prove(expr)
                answers[expr] = None if proved is None else sympy.sympify(proved)
            return answers[expr]

        # torch clears the method's lru_cache when ranges change; the hook is a plain
        # function standing for that lru_cache wrapper, given its methods
        maybe_evaluate_static.cache_clear = original.cache_clear  # type: ignore[attr-defined]
        maybe_evaluate_static.cache_info = original.cache_info  # type: ignore[attr-defined]
        shape_env._maybe_evaluate_static = maybe_evaluate_static  # type: ignore[assignment]

    # creation

    def dimension(
        self,
        name: str,
        hint: int,
        min_value: int | None = None,
        max_value: int | None = None,
        policy: str = "dynamic",
        source: tuple[str, int | None] | None = None,
    ) -> torch.SymInt:
        """Returns the SymInt for dimension ``name``, creating it the first time.

        :param name: the user's name of the dimension
        :param hint: the size in the example inputs
        :param min_value: lower bound (default :data:`DEFAULT_MIN`)
        :param max_value: upper bound (default unbounded)
        :param policy: how facts on it may be adopted (see
            :mod:`yobx.torch.tracing.dynamic_shapes`)
        :param source: the input leaf and axis holding it
        :raises ValueError: when the example contradicts the bounds or an earlier size
        """
        if name in self.by_name:
            if self._hints[name] != hint:
                raise ValueError(
                    f"dynamic dimension {name!r} has size {self._hints[name]} in one input "
                    f"and {hint} in another; inputs sharing a dimension name must agree, "
                    f"give them different names if they are independent"
                )
            symint = self.by_name[name]
            self._record(symint.node.expr, source, 1, 0)
            return symint
        low = DEFAULT_MIN if min_value is None else int(min_value)
        smallest = min(hint, self.small_sizes.get(name, hint))
        if min_value is None and policy != "strict" and smallest < DEFAULT_MIN:
            # a decode step's one new token, a prefill's empty cache: the dimension
            # takes that size too, and a decision on `seq == 1` gets versions (the
            # tracer captures from another size first, the range kept)
            low = max(0, smallest)
        high = max_value
        if high is not None and (high in (int_oo, sympy.oo) or high >= UNBOUNDED):
            high = None
        if hint < low or (high is not None and hint > high):
            upper = "inf" if high is None else high
            raise ValueError(
                f"the example size {hint} of dynamic dimension {name!r} is outside its "
                f"range [{low}, {upper}]; use an example inside the range or declare "
                f"Dim({name!r}, min=..., max=...) accordingly (dynamic dimensions start "
                f"at {DEFAULT_MIN} unless min= says otherwise)"
            )
        # sympy takes a positive symbol as never 0 (`s == 0` folds to False)
        symbol, symint = self.new_symbol(name, hint, low, high, positive=True if low else None)
        if min_value is None:
            self.default_min.add(symbol)
        self.policies[symbol] = policy
        self.declared[symbol] = (low, high)
        self.by_name[name] = symint
        self._hints[name] = hint
        self._record(symbol, source, 1, 0)
        return symint

    def new_symbol(
        self, name: str, hint: int, low: int, high: int | None, positive: bool | None = True
    ) -> tuple[sympy.Symbol, torch.SymInt]:
        """Creates a ShapeEnv symbol named ``name`` for the user, in ``[low, high]``.

        :param positive: sympy's assumption on the symbol: True for a size (sympy then
            folds ``s == 0`` to False by itself), None for a value that may be 0 (a
            loop's index)
        """
        source = DimensionSource(f"dim_{len(self.names)}_{_identifier(name)}")
        symbol = self.shape_env.create_symbol(
            hint, source=source, dynamic_dim=DimDynamic.DYNAMIC, positive=positive
        )
        if low >= 0 and self.shape_env.var_to_range.get(symbol) == _NEW_SIZE_RANGE:
            # The range is [0, oo] and becomes [low, high], which torch computes as an
            # intersection with sympy's Max and Min (half the cost of a dimension). From
            # the unknown range, torch takes [low, high] as it is: the same range.
            self.shape_env.var_to_range[symbol] = ValueRanges.unknown_int()
        self.shape_env.constrain_symbol_range(
            symbol, compiler_min=low, compiler_max=int_oo if high is None else int(high)
        )
        # a new symbol (specialize_zero_one=False, DYNAMIC): a SymInt, never a folded int
        symint = cast(
            torch.SymInt, self.shape_env.create_symintnode(symbol, hint=hint, source=source)
        )
        self.names[str(symbol)] = name
        self._rename[symbol] = sympy.Symbol(name, integer=True)
        return symbol, symint

    def derived_dimension(
        self, spec: Any, hint: int, source: tuple[str, int | None] | None = None
    ) -> torch.SymInt:
        """The SymInt of a derived dim (``2 * seq``) whose axis has size ``hint``."""
        from ..dynamic_shapes import solve_root

        root = spec.root
        root_sym = self.dimension(
            root.name, solve_root(spec, hint), root.min, root.max, root.policy
        )
        derived = spec.derived(root_sym)
        if self.hint(derived) != hint:
            raise ValueError(
                f"input {source} has size {hint} which does not match the derived "
                f"dimension {spec.name}"
            )
        # sizes a * root + b: the root's value follows from the axis when the graph runs
        a = int(spec.derived(1)) - int(spec.derived(0))
        b = int(spec.derived(0))
        self._record(root_sym.node.expr, source, a, b)
        return derived

    def expression_dimension(
        self, spec: Any, hint: int, source: tuple[str, int | None]
    ) -> torch.SymInt | int:
        """The size of an axis declared by an expression of other dimensions
        (``"past + seq"``, see :func:`~yobx.torch.tracing.dynamic_shapes.axis_spec`),
        whose example size is ``hint``: the expression of their SymInts, which the
        graph checks on its inputs (``mask.size(1) == past + seq``)."""
        values: dict[sympy.Basic, Any] = {}
        for symbol in sorted(spec.expression.free_symbols, key=str):
            if symbol.name not in self.by_name:
                raise ValueError(
                    f"input {source[0]!r} axis {source[1]} is declared {spec.name!r}, "
                    f"which names {symbol.name!r}, a dimension no other axis declares; "
                    f"declare {symbol.name!r} on the axis it is the size of"
                )
            values[symbol] = self.by_name[symbol.name]
        size = _evaluate(spec.expression, values)
        if self.hint(size) != hint:
            known = ", ".join(f"{s} = {self.hint(v)}" for s, v in values.items())
            raise ValueError(
                f"input {source[0]!r} axis {source[1]} has size {hint} in the example, "
                f"but is declared {spec.name!r}, which is {self.hint(size)} there "
                f"({known}); give an example where it holds, or another name"
            )
        if isinstance(size, torch.SymInt):
            self.occurrences.append((*source, size.node.expr))
        return size

    def _record(
        self, symbol: sympy.Expr, source: tuple[str, int | None] | None, a: int, b: int
    ) -> None:
        if source is None:
            return
        self.occurrences.append((*source, a * symbol + b))
        if isinstance(symbol, sympy.Symbol) and (
            symbol not in self.sources or (a, b) == (1, 0) != self.sources[symbol][2:]
        ):
            self.sources[symbol] = (*source, a, b)

    def policy_of(self, symbol: sympy.Symbol) -> str | None:
        """How facts on ``symbol`` may be adopted; None for data-dependent symbols."""
        symbol = self.original(symbol)
        policy = self.policies.get(symbol)
        if policy is None and symbol in self.definitions:
            bases = self.definitions[symbol].free_symbols
            policies = [self.policy_of(s) for s in bases]
            return "strict" if "strict" in policies else (policies[0] if policies else None)
        return policy

    def twin(self, symbol: sympy.Symbol) -> sympy.Symbol:
        """The symbol of the same name for sympy's non-negative integers.

        ShapeEnv symbols are positive for sympy, which folds ``s == 0`` to False and
        ``s >= 1`` to True on construction: right for the dimensions' ranges, wrong for
        a condition the graph must check on any input. Conditions checked at run time
        and decisions re-proved for small sizes use the twins.
        """
        twin = self._twins.get(symbol)
        if twin is None:
            twin = sympy.Symbol(symbol.name, integer=True, nonnegative=True)
            self._twins[symbol] = twin
            self._originals[twin] = symbol
        return twin

    def twins(self, expr: sympy.Basic) -> sympy.Basic:
        """``expr`` written with :meth:`twin` symbols."""
        return expr.xreplace(
            {
                s: self.twin(s)
                for s in expr.free_symbols
                if s.is_positive or s in self.default_quotients
            }
        )

    def original(self, symbol: sympy.Symbol) -> sympy.Symbol:
        """The ShapeEnv symbol of a :meth:`twin` (itself for any other symbol)."""
        return self._originals.get(symbol, symbol)

    def symint(self, symbol: sympy.Symbol) -> torch.SymInt:
        """A SymInt standing for ``symbol``."""
        # a symbol, not an integer: torch wraps it in a SymInt
        return cast(
            torch.SymInt, self.shape_env.create_symintnode(symbol, hint=self.hint_of(symbol))
        )

    def hint_of(self, symbol: sympy.Symbol) -> int:
        """The size of a dimension in the example inputs."""
        return int(self.shape_env.backed_var_to_val[symbol])

    def user_expression(self, value: Any) -> sympy.Expr | None:
        """An expression in the user's dimension names (symbols named after them)."""
        expr = expression_of(value)
        if expr is None:
            return None
        return expr.xreplace({s: self._rename.get(self.original(s), s) for s in expr.free_symbols})

    def user_symbols(self) -> dict[str, sympy.Expr]:
        """Maps the name of each ShapeEnv symbol the user knows to its expression in the
        user's dimension names: ``s26 -> batch``, and for the quotient a divisibility
        introduced (``width == 2*q + 1``), ``q -> width/2 - 1/2``: its own name
        (``width_div2``) would stand for another size in a capture where ``width`` is
        even."""
        return {str(symbol): expr for symbol, expr in self._rename.items()}

    def canonical(self, value: Any) -> Any:
        """``value``, or the same integer written in a form the provers reduce: a
        padding to a multiple becomes a ceiling (see
        :func:`~.residues.padding_as_ceiling`)."""
        if not isinstance(value, torch.SymInt) or value.node.maybe_as_int() is not None:
            return value
        expr = value.node.expr
        rewritten = padding_as_ceiling(expr)
        if rewritten is expr or rewritten == expr:
            return value
        return self.shape_env.create_symintnode(rewritten, hint=value.node.hint)

    def fake_tensor(self, tensor: torch.Tensor, sizes: list[int | torch.SymInt]) -> torch.Tensor:
        """Returns a fake tensor with the dtype and device of ``tensor`` and ``sizes``."""
        from ..shape_rules._base import TensorFactory, Unsupported

        grad = isinstance(tensor, torch.nn.Parameter) and tensor.requires_grad
        try:
            # directly, as the shape rules create their outputs: the fake mode's dispatch
            # (and its cache) costs a few milliseconds for each input
            return TensorFactory(self.fake_mode).new(sizes, tensor.dtype, tensor.device, grad)
        except Unsupported:
            pass  # an empty dimension: torch's own path
        with self.fake_mode:
            fake = torch.empty(sizes, dtype=tensor.dtype, device=tensor.device)
            if isinstance(tensor, torch.nn.Parameter):
                fake.requires_grad_(tensor.requires_grad)
        return fake

    def from_real(self, tensor: torch.Tensor) -> torch.Tensor:
        """Returns a fake tensor with the static shape of a real tensor (a constant)."""
        fake = self.static_fakes.get(tensor)
        return fake if fake is not None else static_fake(self.fake_mode, tensor)

    # rendering

    def render(self, value: Any) -> str:
        """Writes a symbolic expression (SymInt, SymBool, sympy) with the user's names."""
        expr = expression_of(value)
        if expr is None:
            return str(value)
        expr = expr.xreplace({s: self._rename.get(self.original(s), s) for s in expr.free_symbols})
        return pretty(expr)

    def symbols_of(self, value: Any) -> list[str]:
        """Returns the user names of the dimensions an expression depends on."""
        expr = expression_of(value)
        if expr is None:
            return []
        return sorted(self.names.get(str(s), str(s)) for s in expr.free_symbols)

    def describe_ranges(self, value: Any) -> str:
        """Describes the known range of every dimension in an expression."""
        expr = expression_of(value)
        if expr is None:
            return ""
        parts = []
        for s in sorted(expr.free_symbols, key=str):
            name = self.names.get(str(s), str(s))
            if self.is_data_dependent(s):
                parts.append(f"{name} (data-dependent)")
                continue
            low, high = self.range_of(s)
            upper = "inf" if high == math.inf else high
            parts.append(f"{name} in [{low}, {upper}]")
        return ", ".join(parts)

    def range_of(self, expr: sympy.Expr) -> tuple[int | float, int | float]:
        """The known range of an integer expression, ``math.inf`` when unbounded."""
        from torch.utils._sympy.value_ranges import bound_sympy

        expr = self.shape_env.replace(expr.xreplace(self._originals))
        bound = bound_sympy(expr, self.shape_env.var_to_range)
        return _finite(bound.lower), _finite(bound.upper)

    def is_data_dependent(self, value: Any) -> bool:
        """True when an expression depends on tensor values (``.item()``, ``nonzero``)."""
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

        expr = expression_of(value)
        if expr is None:
            return False
        return bool(free_unbacked_symbols(expr)) or any(
            self.original(s) not in self.shape_env.backed_var_to_val for s in expr.free_symbols
        )

    # decisions

    def decide(self, value: torch.SymBool) -> bool | None:
        """Returns the value of a SymBool if it is provable, None otherwise."""
        if statically_known_true(value):
            return True
        if statically_known_true(torch.sym_not(value)):
            return False
        return self.prove(value.node.expr)

    def lowest_bound(
        self, build: Callable[..., sympy.Basic] | None, operands: list[Any], value: Any
    ) -> tuple[sympy.Basic | None, list[sympy.Symbol], int]:
        """How small the dimensions declared without a lower bound may be for a
        decision to keep its value.

        Decisions are made with the default range ``[2, inf]`` (as torch.export does;
        ``[1, inf]`` for a dimension whose example is 1), but a graph is only as good as
        its decisions: ``x.shape[0] == 0 -> False`` is
        wrong for an empty input, ``seq > 1 -> True`` for one token. The decision is
        proved again with those dimensions starting at 0, then at 1, on :meth:`twin`
        symbols (sympy's positivity alone folds ``s == 0`` to False).

        :param build: builds the decided expression from the operands (a comparison
            returning ``value``, or an expression equal to ``value``); None when
            unknown, which needs the default bound
        :param operands: sympy expressions, SymInts or numbers
        :param value: what the expression was decided to be
        :return: the decision as a condition on twin symbols (None when ``build`` is
            None), the dimensions relaxed, and the lowest bound (0, 1 or 2) they need
        """
        from torch.utils._sympy.value_ranges import ValueRanges

        operands = [
            sympy.sympify(expression_of(o) if expression_of(o) is not None else o) for o in operands
        ]
        symbols = set().union(*(o.free_symbols for o in operands)) if operands else set()
        relaxable = [s for s in symbols if self._relaxable(s) or s in self.default_quotients]
        if not relaxable:
            return None, [], 0
        # what the decision was made with: the default bound, or 1 when every relaxed
        # dimension starts at its example's 1
        needed = (
            DEFAULT_MIN
            if any(s in self.default_quotients or self._lower(s) == DEFAULT_MIN for s in relaxable)
            else 1
        )
        if build is None:
            return None, relaxable, needed
        decided = build(*(self.twins(o) for o in operands))
        if isinstance(value, bool) and isinstance(decided, sympy.logic.boolalg.Boolean):
            claim = decided if value else sympy.Not(decided)
        else:
            claim = sympy.Eq(decided, value)
        if claim is sympy.true:
            return claim, relaxable, 0
        ranges = {self.twin(s): self.shape_env.var_to_range[s] for s in symbols}
        for low in range(needed):
            relaxed = dict(ranges)
            for s in relaxable:
                # a quotient `n = m*q + r` from n >= low
                modulus, remainder = self.default_quotients.get(s, (1, 0))
                lowest = quotient_lower_bound(low, modulus, remainder)
                current = ranges[self.twin(s)]
                relaxed[self.twin(s)] = ValueRanges(min(lowest, current.lower), current.upper)
            if self.prove(claim, (relaxed, {})) is True:
                return claim, relaxable, low
        return claim, relaxable, needed

    def _lower(self, symbol: sympy.Symbol) -> Any:
        return self.shape_env.var_to_range[symbol].lower

    def _relaxable(self, symbol: sympy.Symbol) -> bool:
        """A dimension declared without a lower bound whose range still starts where
        the tracer put it: at the default 2, or at 1 when the example is 1 (a decode
        step's one token). The graph takes the sizes below it as well (no check refuses
        them): a decision made from that bound is proved again below it."""
        if symbol not in self.default_min:
            return False
        lower = self._lower(symbol)
        return lower == self.declared[symbol][0] and 0 < lower <= DEFAULT_MIN

    def snapshot(self) -> tuple[dict, dict]:
        """What is known now (ranges, replacements), to judge guards added later."""
        return dict(self.shape_env.var_to_range), dict(self.shape_env.replacements)

    def prove(self, expr: sympy.Basic, known: tuple[dict, dict] | None = None) -> bool | None:
        """Decides an inequality with floor divisions from the dimensions' ranges (see
        :func:`~yobx.torch.tracing.symbolic.range_proofs.prove_from_ranges`); only a proof is
        returned: None when the ranges do not settle it.

        :param known: a :meth:`snapshot`; a guard installed by an operation also narrows
            the ranges, so it must be judged against what was known before
        """
        ranges, replacements = known if known is not None else self.snapshot()
        # a function of its three arguments only (sympy's symbols are values: the same
        # name and assumptions, the same symbol), and a model asks the same questions
        # in every layer (`seq > 1` in each attention: milliseconds of bounds each) and
        # every trace: kept for the process
        key = (expr, frozenset(ranges.items()), frozenset(replacements.items()))
        cached = _PROOFS.get(key, _UNPROVED)
        proved: bool | None
        if cached is _UNPROVED:
            proved = _PROOFS[key] = prove_from_ranges(expr, ranges, replacements)
        else:
            proved = cast("bool | None", cached)
        if proved is None and self.loop_bounds:
            proved = self._prove_in_loops(expr, ranges, replacements)
        return proved

    def _prove_in_loops(self, expr: sympy.Basic, ranges: dict, replacements: dict) -> bool | None:
        """Proves a fact on loop indices from ``start <= i <= stop - 1``: the lower bound
        is the index's range, the upper one a relation, proved by writing the index
        ``(stop - 1) - r`` for a new ``r >= 0``. Both describe more values than the index
        takes, so what they prove (true or false) holds for the index."""
        from torch.utils._sympy.value_ranges import ValueRanges

        indices = [s for s in expr.free_symbols if s in self.loop_bounds]
        if not indices:
            return None
        if isinstance(expr, (sympy.And, sympy.Or)):
            # `narrow` checks both bounds at once: each proved on its own
            parts = [self.prove(part, (ranges, replacements)) for part in expr.args]
            if isinstance(expr, sympy.And):
                return False if False in parts else (True if all(parts) else None)
            return True if True in parts else (False if not any(p is None for p in parts) else None)
        ranges = dict(ranges)
        replaced = {}
        # a decision proved again for small sizes is written with twin symbols
        # (lowest_bound): the bounds must be too
        twinned = any(s in self._originals for s in expr.free_symbols)
        for s in indices:
            rest = sympy.Symbol(f"{s}_rest", integer=True, nonnegative=True)
            ranges[rest] = ValueRanges(0, int_oo)
            bound = self.loop_bounds[s]
            replaced[s] = (self.twins(bound) if twinned else bound) - rest
        substituted = expr.xreplace(replaced)
        if substituted in (sympy.true, sympy.false):
            return bool(substituted)
        return self.prove(substituted, (ranges, replacements))

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


def quotient_lower_bound(low: Any, modulus: int, remainder: int) -> int:
    """The least ``q >= 0`` with ``modulus * q + remainder >= low``: the lower bound of
    the quotient of a dimension at least ``low`` written ``modulus * q + remainder``."""
    return max(0, math.ceil((low - remainder) / modulus))


def expression_of(value: Any) -> sympy.Expr | None:
    """The sympy expression of a SymInt, SymBool or SymFloat (a sympy value is its own),
    None for anything else."""
    if isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        return value.node.expr
    if isinstance(value, sympy.Basic):
        return value
    return None


def _finite(value: Any) -> int | float:
    """An int, or ``±math.inf`` for sympy's and torch's infinities."""
    if value in (int_oo, sympy.oo) or value == math.inf:
        return math.inf
    if value in (-int_oo, -sympy.oo) or value == -math.inf:
        return -math.inf
    return int(value) if value.is_integer else float(value)


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _differs_at_one(expr: sympy.Basic, answer: Any, default_min: set) -> bool:
    """Whether the inequality ``expr``, answered ``answer`` from the ranges, has the
    other answer when its dimensions with the default lower bound are 1 (and its other
    symbols leave it decided): what the default range, not the sizes, decided."""
    symbols = expr.free_symbols & default_min
    if not symbols or not isinstance(expr, (sympy.Ge, sympy.Gt, sympy.Le, sympy.Lt)):
        # an equality with 1 chooses strides (a size-1 dimension's), not values
        return False
    try:
        at_one = expr.xreplace({s: sympy.Integer(1) for s in symbols})
    except Exception:
        return False
    return at_one in (sympy.true, sympy.false) and at_one != answer


def _quotient_is_zero(expr: sympy.Basic) -> bool:
    """Whether ``expr`` asks if a floor division is 0 (``(n + 2) // 3 == 0``)."""
    return (
        isinstance(expr, (sympy.Eq, sympy.Ne))
        and 0 in (expr.lhs, expr.rhs)
        and isinstance(expr.lhs + expr.rhs, FloorDiv)
    )


def _evaluate(expression: sympy.Expr, values: dict[sympy.Basic, Any]) -> Any:
    """``expression`` (a polynomial with integer coefficients) computed on ``values``
    (SymInts by symbol) with Python's arithmetic, which SymInts follow."""
    if expression in values:
        return values[expression]
    if expression.is_Integer:
        return int(expression)
    args = [_evaluate(a, values) for a in expression.args]
    if expression.is_Add:
        return functools.reduce(operator.add, args)
    if expression.is_Mul:
        return functools.reduce(operator.mul, args)
    if expression.is_Pow and expression.exp.is_Integer and expression.exp > 0:
        return functools.reduce(operator.mul, [args[0]] * int(expression.exp))
    raise ValueError(f"cannot compute {expression} from sizes")
