"""Runtime checks: a traced graph verifies its constraints on its inputs.

The tracer inserts, right after the placeholders, nodes computing the dynamic
dimensions of the inputs (``x.size(1)``) and, for each check, its condition and a call
to :func:`check_constraint`. They are ordinary FX nodes: they survive ``recompile``,
printing and pickling, and the passes keep them (the function is registered with
:func:`torch.fx.node.has_side_effect`). Checked, in order:

1. the ranks and static sizes of the inputs (``x.dim() == 2``, ``x.size(1) == 5``), which
   the graph computes for;
2. the declared range of every dimension (``batch >= 2`` by default, ``Dim(max=...)``);
3. inputs sharing a dimension agree (``x.size(0) == mask.size(0)``), and derived
   dims match their root;
4. every constraint adopted while tracing (``seq <= 128``, ``dim % 2 == 0``...).
"""

from __future__ import annotations

import dataclasses
import fractions
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import sympy
import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.proxy import GraphAppendingTracer, Proxy
from torch.utils._sympy import functions as torch_sympy

from ...passes import register_untouched_functions
from ..errors import TracingError
from ..symbolic.integral_conditions import integral_condition
from ..symbolic.symbolic import SymbolicDimensions
from .constraints import ConstraintViolationError
from .defined_junctions import junction

#: ``node.meta`` key set on the nodes a graph runs to check its inputs (not the model's)
RUNTIME_CHECK = "yobx_runtime_check"


@torch.fx.node.has_side_effect
def check_constraint(
    condition: Any, expression: str, location: str, values: dict[str, Any]
) -> None:
    """Raises :class:`ConstraintViolationError` when ``condition`` is false.

    :param condition: the constraint evaluated on the inputs' sizes
    :param expression: the constraint in the user's dimension names
    :param location: the user's ``file:line`` that needed it
    :param values: the dimensions' values, by user name, for the message
    """
    if isinstance(condition, Proxy):
        # the graph is traced again (torch.fx.symbolic_trace of the GraphModule)
        condition.tracer.create_proxy(
            "call_function", check_constraint, (condition, expression, location, values), {}
        )
        return
    if isinstance(condition, torch.SymBool):
        # fake values (a lowering re-running the graph): only a proven violation
        if statically_known_true(torch.sym_not(condition)):
            raise ConstraintViolationError(expression, {}, location)
        return
    if not condition:
        raise ConstraintViolationError(expression, {k: int(v) for k, v in values.items()}, location)


@dataclasses.dataclass(frozen=True)
class RuntimeCheck:
    """One condition the graph verifies on its inputs.

    :param condition: on ShapeEnv symbols of declared dimensions
    :param expression: in the user's names
    :param location: the line that needed it (empty for declarations)
    :param kind: ``"declared"``, ``"torch._check"`` or the kind of an adopted
        constraint (``"range"``, ``"relation"``...: see
        :data:`~yobx.torch.tracing.constraints.constraints.CONSTRAINT_KINDS`)
    """

    condition: sympy.Basic
    expression: str
    location: str = ""
    kind: str = ""


def graph_checks(dims: SymbolicDimensions, refinements: Any) -> list[RuntimeCheck]:
    """Every condition a traced graph (or an exported model) checks on its inputs'
    sizes, in the order they are checked: the declarations, the ``torch._check`` calls
    of the model, then the constraints adopted from the example.

    :param dims: the trace's symbolic dimensions
    :param refinements: the trace's :class:`~yobx.torch.tracing.constraints.refinement.Refinements`
    """
    return declared_checks(dims) + assumed_checks(refinements)


def assumed_checks(refinements: Any, routed: Any = ()) -> list[RuntimeCheck]:
    """The ``torch._check`` calls of the model, then the constraints adopted from the
    example, except the facts in ``routed`` (decisions that became choices between
    versions of the capture, see :mod:`.versions`)."""
    checks = [
        RuntimeCheck(condition, f"torch._check({text})", location, "torch._check")
        for condition, text, location in refinements.user_checks
    ]
    skipped = {id(fact) for fact in routed}
    checks += [
        RuntimeCheck(
            fact.condition,
            fact.constraint.expression,
            fact.constraint.location,
            fact.constraint.kind,
        )
        for fact in refinements.adopted
        if id(fact) not in skipped
    ]
    return checks


def condition_in_sizes(dims: SymbolicDimensions, condition: sympy.Basic) -> sympy.Basic | None:
    """A check's condition on symbols the inputs' sizes give, None when one is missing.

    ShapeEnv symbols are positive for sympy, which folds ``s >= 1`` to True: the
    condition is written on integer symbols without that assumption (see
    :meth:`SymbolicDimensions.twin`). Symbols defined from others (``dim == 2*q``:
    ``q = dim // 2``) are replaced by their definitions.
    """
    condition = dims.twins(condition)
    for _ in range(len(dims.definitions) + 1):
        defined = [s for s in condition.free_symbols if dims.original(s) in dims.definitions]
        if not defined:
            return condition
        condition = condition.xreplace(
            {s: dims.twins(dims.definitions[dims.original(s)]) for s in defined}
        )
    return None


def size_source(
    dims: SymbolicDimensions, symbol: sympy.Symbol
) -> tuple[str, int | None, int, int] | None:
    """Where the value of a symbol of a check comes from when the model runs:
    ``(input leaf, axis, a, b)``, the axis having size ``a * symbol + b`` (axis None: an
    int input declared dynamic, its value); None when no input holds it.

    A symbol named ``leaf.size(axis)`` (the agreement of inputs sharing a dimension) is
    that size itself.
    """
    name = str(symbol)
    if "." in name:
        leaf, axis = _parse_size(name)
        return leaf, axis, 1, 0
    return dims.sources.get(dims.original(symbol))


def describe_source(
    dims: SymbolicDimensions, symbol: sympy.Symbol, inputs: Mapping[str, str] | None = None
) -> str:
    """``seq is axis 1 of input_ids`` (``axis 2 of x is 2*seq``), for messages; empty for
    a size read directly (``x.size(1)``), which says it itself.

    :param inputs: the name to show for each input leaf (the ONNX input names), by
        default the leaf names
    """
    source = size_source(dims, symbol)
    name = dims.render(symbol)
    if source is None:
        return f"{name} is not an input's size"
    leaf, axis, a, b = source
    if "." in str(symbol):
        return ""
    leaf = (inputs or {}).get(leaf, leaf)
    if axis is None:
        return f"{name} is the int input {leaf}"
    size = f"axis {axis} of {leaf}"
    if (a, b) == (1, 0):
        return f"{name} is {size}"
    return f"{size} is {dims.render(a * symbol + b)}"


def declared_checks(dims: SymbolicDimensions) -> list[RuntimeCheck]:
    """Declared ranges, and agreement of the inputs sharing a dimension; their location
    is the call that declared them (its ``dynamic_shapes``)."""
    where = dims.declared_at
    checks = []
    for symbol, (low, high) in dims.declared.items():
        name = dims.render(symbol)
        if symbol not in dims.default_min:
            # the default lower bound is checked only where a decision needs it
            checks.append(
                RuntimeCheck(
                    # a twin: sympy folds `s >= 1` to True on a positive ShapeEnv symbol
                    sympy.Ge(dims.twin(symbol), low),
                    f"{name} >= {low} (declared)",
                    where,
                    "declared",
                )
            )
        if high is not None:
            checks.append(
                RuntimeCheck(
                    sympy.Le(symbol, high), f"{name} <= {high} (declared)", where, "declared"
                )
            )
    for leaf, axis, expected in dims.occurrences:
        symbol = next(iter(expected.free_symbols))
        source = dims.sources.get(symbol)
        if (
            source is not None
            and expected == source[2] * symbol + source[3]
            and (source[:2] == (leaf, axis))
        ):
            continue  # the axis defining the dimension
        size = sympy.Symbol(f"{leaf}.size({axis})", integer=True)
        checks.append(
            RuntimeCheck(
                sympy.Eq(size, expected),
                f"{leaf}.size({axis}) == {dims.render(expected)} (declared)",
                where,
                "declared",
            )
        )
    return checks


def insert_shape_checks(graph: torch.fx.Graph, input_sizes: dict[str, Any]) -> int:
    """Inserts, after the placeholders, the checks of the rank and the static sizes of
    each tensor input (``x.dim() == 2``, ``x.size(1) == 5``); returns how many.

    A graph computes for them (a slice to ``x.shape[1] - 1`` is ``x[:, :4]`` in the
    graph), as torch.export's programs do, which check them too; ``x.shape[-1]`` of
    another rank is another size, which the sizes checked by index would not see. The
    nodes are built directly: these conditions need no symbolic arithmetic.

    :param input_sizes: the sizes of each input when the trace started, by placeholder
        name (an int declared dynamic has a ``SymInt`` instead of a list)
    """
    placeholders = {n.target: n for n in graph.nodes if n.op == "placeholder"}
    anchor = next((n for n in graph.nodes if n.op != "placeholder"), None)
    if anchor is None:
        return 0
    count = 0
    with graph.inserting_before(anchor):
        for name, sizes in input_sizes.items():
            placeholder = placeholders.get(name)
            if placeholder is None or not isinstance(sizes, (list, tuple)):
                continue
            rank = len(sizes)
            dim = graph.call_method("dim", (placeholder,))
            _check_node(graph, dim, rank, f"{name}.dim() == {rank} (static)", f"{name}.dim()")
            count += 1
            for axis, size in enumerate(sizes):
                if type(size) is not int:
                    continue
                read = graph.call_method("size", (placeholder, axis))
                text = f"{name}.size({axis})"
                _check_node(graph, read, size, f"{text} == {size} (static)", text)
                count += 1
    return count


def _check_node(graph: torch.fx.Graph, read: torch.fx.Node, value: int, text: str, name: str):
    """``check_constraint(read == value)`` after ``read``, whose traced value is ``value``."""
    same = graph.call_function(operator.eq, (read, value))
    check = graph.call_function(check_constraint, (same, text, "", {name: read}))
    for node, val in ((read, value), (same, True), (check, None)):
        node.meta["val"] = val
        node.meta[RUNTIME_CHECK] = True


def insert_runtime_checks(
    graph: torch.fx.Graph,
    dims: SymbolicDimensions,
    checks: list[RuntimeCheck],
    input_sizes: Mapping[str, Sequence[Any] | torch.SymInt] | None = None,
) -> int:
    """Inserts the nodes checking ``checks`` after the placeholders.

    :param input_sizes: the sizes of each tensor input when the trace started, by
        placeholder name (an in-place ``squeeze_`` or ``transpose_`` of an input changes
        its placeholder's fake value afterwards); the placeholders' values otherwise
    :return: the number of checks inserted (checks that are always true are skipped)
    """
    placeholders = {n.target: n for n in graph.nodes if n.op == "placeholder"}
    anchor = next((n for n in graph.nodes if n.op != "placeholder"), None)
    if anchor is None or not checks:
        return 0
    builder = _CheckBuilder(graph, dims, placeholders, input_sizes or {})
    count = 0
    with graph.inserting_before(anchor):
        for check in checks:
            count += builder.add(check)
    return count


def insert_condition(
    graph: torch.fx.Graph,
    dims: SymbolicDimensions,
    condition: sympy.Basic,
    input_sizes: Mapping[str, Sequence[Any] | torch.SymInt] | None = None,
    location: str = "",
) -> torch.fx.Node | bool:
    """Appends to ``graph`` the nodes computing ``condition`` (on ShapeEnv symbols of
    ``dims``) from the sizes of its placeholders, as the runtime checks do; returns the
    node holding its value (a bool when it is constant).

    A division by a size in the condition is checked first: where the size is 0, no
    version was captured on this side of the choice (``(dim + 3)//4`` pieces' count at
    ``dim = 0``), and the graph raises :class:`ConstraintViolationError` naming it
    (``location``: the user's line of the decision) instead of ``ZeroDivisionError``.
    The ONNX model's checks refuse those sizes first.

    :raises TracingError: the condition reads a value no input gives
    """
    placeholders = {n.target: n for n in graph.nodes if n.op == "placeholder"}
    builder = _CheckBuilder(graph, dims, placeholders, input_sizes or {})
    builder.divisors_checked_at = location
    check = RuntimeCheck(condition, dims.render(condition))
    prepared = condition_in_sizes(dims, condition)
    if prepared is None:
        raise builder._unchecked(check)
    # lowered again with symbolic sizes (ONNX), which refuse Fraction * SymInt
    prepared = integral_condition(prepared)
    if any(builder._symbol(s) is None for s in sorted(prepared.free_symbols, key=str)):
        raise builder._unchecked(check)
    result = builder._interpret(prepared)
    if isinstance(result, Proxy):
        return result.node
    return bool(result)


class _CheckBuilder:
    """Builds the nodes of the checks, sharing the size and arithmetic nodes."""

    def __init__(
        self,
        graph: torch.fx.Graph,
        dims: SymbolicDimensions,
        placeholders: dict,
        input_sizes: Mapping[str, Sequence[Any] | torch.SymInt],
    ):
        self.graph = graph
        self.dims = dims
        self.placeholders = placeholders
        self.input_sizes = input_sizes
        self.tracer = GraphAppendingTracer(graph)
        self.proxies: dict[sympy.Expr, Any] = {}
        #: whether divisions are guarded (in a check, see :meth:`_junction`)
        self.guarded = False
        #: the conditions the value being built needs to be defined (divisors other
        #: than zero), and those of each value built (with its proxy, in the memo)
        self.defined: list[Any] = []
        self.needs: dict[sympy.Basic, tuple] = {}
        #: the location divisors are checked at before a division (a choice between
        #: versions, see :func:`insert_condition`); None: they are not
        self.divisors_checked_at: str | None = None

    def add(self, check: RuntimeCheck) -> int:
        condition = condition_in_sizes(self.dims, check.condition)
        if condition is None:
            raise self._unchecked(check)
        if condition is sympy.true:
            return 0
        symbols = sorted(condition.free_symbols, key=str)
        found = {s: self._symbol(s) for s in symbols}
        proxies = {s: p for s, p in found.items() if p is not None}
        if len(proxies) < len(found):
            raise self._unchecked(check)
        self.guarded, self.defined = True, []
        result = self._interpret(condition)
        # where the condition divides by zero outside any `and`/`or`, it fails (eager
        # Python would raise) instead of the graph raising ZeroDivisionError
        for defined in self.defined:
            result = self._call(operator.and_, (defined, result))
        values = {self._display(s): proxies[s].node for s in symbols}
        node = self.graph.call_function(
            check_constraint,
            (
                result.node if isinstance(result, Proxy) else result,
                check.expression,
                check.location,
                values,
            ),
        )
        node.meta["val"] = None
        node.meta[RUNTIME_CHECK] = True
        return 1

    def _unchecked(self, check: RuntimeCheck) -> TracingError:
        # a constraint the graph cannot check would make it silently wrong outside it
        return TracingError.at(
            check.location or "<declaration>",
            f"the constraint `{check.expression}` "
            f"involves a value that is not an input's dimension, so the graph cannot "
            f"check it when it runs; declare the dimensions it needs as dynamic inputs "
            f"or make them static",
            expression=check.expression,
        )

    def _display(self, symbol: sympy.Symbol) -> str:
        name = str(symbol)
        return name if "." in name else self.dims.render(symbol)

    def _symbol(self, symbol: sympy.Symbol) -> Proxy | None:
        if symbol in self.proxies:
            return self.proxies[symbol]
        source = size_source(self.dims, symbol)
        if source is None:
            return None
        leaf, axis, a, b = source
        proxy = self._size(leaf, axis)
        if b:
            proxy = self._call(operator.sub, (proxy, b))
        if a != 1:
            proxy = self._call(operator.floordiv, (proxy, a))
        self.proxies[symbol] = proxy
        return proxy

    def _size(self, leaf: str, axis: int | None) -> Proxy:
        key = sympy.Symbol(f"{leaf}.size({axis})", integer=True)
        if key not in self.proxies:
            placeholder = self.placeholders[leaf]
            if axis is None:
                # an int input declared dynamic: the value itself
                self.proxies[key] = Proxy(placeholder, self.tracer)
                return self.proxies[key]
            node = self.graph.call_method("size", (placeholder, axis))
            # a tensor's sizes: an int input's SymInt (its value) is read above
            sizes = cast("Sequence[Any] | None", self.input_sizes.get(leaf))
            node.meta["val"] = (
                sizes[axis] if sizes is not None else placeholder.meta["val"].shape[axis]
            )
            node.meta[RUNTIME_CHECK] = True
            self.proxies[key] = Proxy(node, self.tracer)
        return self.proxies[key]

    def _interpret(self, expr: sympy.Basic) -> Any:
        """Builds nodes computing ``expr`` from the symbols' proxies; in a check, the
        conditions it needs to be defined are added to :attr:`defined`, also when its
        value comes from the memo."""
        if expr in self.proxies:
            self.defined.extend(self.needs.get(expr, ()))
            return self.proxies[expr]
        if isinstance(expr, sympy.Symbol):
            return self._symbol(expr)
        if expr.is_Integer or isinstance(expr, sympy.logic.boolalg.BooleanAtom):
            return int(expr) if expr.is_Integer else bool(expr)
        if expr.is_Float:
            return float(expr)
        if expr.is_Rational:
            # exact arithmetic: sizes divided by a constant they are multiples of
            proxy = self.tracer.create_proxy(
                "call_function", fractions.Fraction, (int(expr.p), int(expr.q)), {}
            )
            proxy.node.meta["val"] = None
            proxy.node.meta[RUNTIME_CHECK] = True
            self.proxies[expr] = proxy
            return proxy
        outer, self.defined = self.defined, []
        try:
            result = self._compute(expr)
            needs = tuple(self.defined)
        finally:
            self.defined = outer
        self.proxies[expr] = result
        if needs:
            self.needs[expr] = needs
            self.defined.extend(needs)
        return result

    def _compute(self, expr: sympy.Basic) -> Any:
        if self.guarded and isinstance(expr, (sympy.And, sympy.Or)):
            return self._junction(expr)
        function, folds = _operation(expr)
        args = [self._interpret(a) for a in expr.args]
        if self.guarded and isinstance(expr, _DIVISIONS) and isinstance(args[1], Proxy):
            self.defined.append(self._call(operator.ne, (args[1], 0)))
            args[1] = self._call(nonzero_divisor, (args[1],))
        elif self.divisors_checked_at is not None and isinstance(expr, _DIVISIONS):
            self._check_divisor(expr.args[1], args[1])
        if not folds:
            return self._call(function, tuple(args))
        result = args[0]
        for other in args[1:]:
            result = self._call(function, (result, other))
        return result

    def _check_divisor(self, divisor: sympy.Basic, value: Any) -> None:
        """A check that ``divisor`` (``value`` in the graph) is not 0."""
        if not isinstance(value, Proxy):
            return
        symbols = sorted(divisor.free_symbols, key=str)
        names = {s: sympy.Symbol(self._display(s)) for s in symbols}
        expression = f"{divisor.xreplace(names)} != 0"
        # the divisor was computed from them: each is read from an input
        proxies = {s: self._symbol(s) for s in symbols}
        values = {str(names[s]): p.node for s, p in proxies.items() if p is not None}
        nonzero = self._call(operator.ne, (value, 0))
        node = self.graph.call_function(
            check_constraint, (nonzero.node, expression, self.divisors_checked_at, values)
        )
        node.meta["val"] = None
        node.meta[RUNTIME_CHECK] = True

    def _junction(self, expr: sympy.Basic) -> Any:
        """``And``/``Or`` in a check, of operands that may divide by zero, counted as
        the ONNX checks count them (:func:`~.defined_junctions.junction`)."""
        operands = []
        for arg in expr.args:
            outer, self.defined = self.defined, []
            try:
                operands.append((self._interpret(arg), self.defined))
            finally:
                self.defined = outer
        result, defined = junction(
            operands,
            isinstance(expr, sympy.Or),
            lambda a, b: self._call(operator.and_, (a, b)),
            lambda a, b: self._call(operator.or_, (a, b)),
            lambda a: self._call(torch.sym_not, (a,)),
        )
        if defined is not None:
            self.defined.append(defined)
        return result

    def _call(self, function, operands: tuple) -> Any:
        if not any(isinstance(a, Proxy) for a in operands):
            return function(*operands)
        proxy = self.tracer.create_proxy("call_function", function, operands, {})
        proxy.node.meta["val"] = None
        proxy.node.meta[RUNTIME_CHECK] = True
        return proxy


def _parse_size(name: str) -> tuple[str, int | None]:
    leaf, axis = name.rsplit(".size(", 1)
    axis = axis.rstrip(")")
    return leaf, None if axis == "None" else int(axis)


_RELATIONS: dict[type, Callable[..., Any]] = {
    sympy.Eq: operator.eq,
    sympy.Ne: operator.ne,
    sympy.Lt: operator.lt,
    sympy.Le: operator.le,
    sympy.Gt: operator.gt,
    sympy.Ge: operator.ge,
}


def size_min(a: Any, b: Any) -> Any:
    """``min`` of two values of a check: ``torch.sym_min`` on symbolic values, Python's
    ``min`` on numbers, which takes the exact fractions of an expression such as
    ``min(n, n/2 - (n % 2)/2)`` (``torch.sym_min`` refuses a ``Fraction``)."""
    if isinstance(a, _SYMBOLIC) or isinstance(b, _SYMBOLIC):
        return torch.sym_min(a, b)
    return min(a, b)


def size_max(a: Any, b: Any) -> Any:
    """``max`` of two values of a check (see :func:`size_min`)."""
    if isinstance(a, _SYMBOLIC) or isinstance(b, _SYMBOLIC):
        return torch.sym_max(a, b)
    return max(a, b)


def nonzero_divisor(divisor: Any) -> Any:
    """``divisor``, or 1 where it is 0: a check divides by a size only where that size
    is not 0, and counts the part of its condition holding the division as false
    there (see ``_CheckBuilder._junction``)."""
    if isinstance(divisor, _SYMBOLIC):
        return torch.sym_ite(divisor != 0, divisor, 1)
    return divisor if divisor != 0 else 1


_SYMBOLIC = (torch.SymInt, torch.SymFloat)
# a check reads sizes and raises: nothing for the graph passes to rewrite
register_untouched_functions(check_constraint, size_min, size_max, nonzero_divisor)
#: the operations Python refuses for a divisor of 0
_DIVISIONS = (
    torch_sympy.FloorDiv,
    torch_sympy.Mod,
    torch_sympy.PythonMod,
    sympy.Mod,
    torch_sympy.IntTrueDiv,
    torch_sympy.FloatTrueDiv,
)
_FOLDED: dict[type, Callable[..., Any]] = {
    sympy.Add: operator.add,
    sympy.Mul: operator.mul,
    sympy.Min: size_min,
    sympy.Max: size_max,
    torch_sympy.Min: size_min,
    torch_sympy.Max: size_max,
    sympy.And: operator.and_,
    sympy.Or: operator.or_,
}
_BINARY: dict[type, Callable[..., Any]] = {
    torch_sympy.FloorDiv: operator.floordiv,  # CleanDiv too (a subclass)
    torch_sympy.Mod: operator.mod,
    torch_sympy.PythonMod: operator.mod,
    sympy.Mod: operator.mod,
    torch_sympy.PowByNatural: operator.pow,
    torch_sympy.IntTrueDiv: operator.truediv,
    torch_sympy.FloatTrueDiv: operator.truediv,
    # (h * w) ** 0.5 of dimensions (DiT's patch grid side)
    torch_sympy.FloatPow: operator.pow,
    torch_sympy.CeilToInt: math.ceil,
    torch_sympy.FloorToInt: math.floor,
    # int(n * 0.5) and float(n) of a dimension (see symbolic_builtins)
    torch_sympy.TruncToInt: math.trunc,
    torch_sympy.ToFloat: torch.sym_float,
    # not `operator.not_`: Python's `not` asks a symbolic boolean for its value, which
    # the lowering then fixed (a version chosen by `not (a == 1 or n == n // 2)`)
    sympy.Not: torch.sym_not,
}


def _operation(expr: sympy.Basic) -> tuple[Any, bool]:
    """The Python function computing ``expr`` from its arguments, and whether it folds
    over more than two of them."""
    for cls, fn in _FOLDED.items():
        if isinstance(expr, cls):
            return fn, True
    for table in (_RELATIONS, _BINARY):
        for cls, fn in table.items():
            if isinstance(expr, cls):
                return fn, False
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
        return operator.pow, False
    raise NotImplementedError(f"no runtime check for {type(expr).__name__} ({expr})")
