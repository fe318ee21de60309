"""An exported model checks what it assumes: the constraints as ONNX nodes.

A traced graph checks its constraints when it runs
(:mod:`yobx.torch.tracing.constraints.runtime_checks`). ONNX has no assertion operator, so the
same conditions are computed from the inputs' shapes (``Shape``, integer arithmetic,
comparisons) and each one decides the shape a ``Reshape`` of a one-element token asks
for: ``[1]`` when the condition holds, ``[2]`` when it does not, which onnxruntime
refuses. That ``Reshape`` is **named after the constraint**, and onnxruntime's error
names the node::

    Non-zero status code returned while running Reshape node.
    Name:'yobx check failed: seq <= 16 (range), needed at model.py:6; seq is axis 2 of x'

The checks form one chain (each ``Reshape`` reads the token the previous one returned),
so the first broken constraint, in the order the tracer checks them, is the one
reported; with many checks, they are combined first and the chain runs only when one
fails. The token then gates every input the model reads (a ``Reshape`` to the input's
own shape, a view), so that no node of the model runs, and no output is returned,
before every check has passed. Outputs computed from no input at all are gated
themselves. :mod:`.check_gates` writes the chain and the gates.

The conditions are exact: sizes are int64, a division by a constant keeps a scale
instead of rounding (``n/2 - (n % 2)/2``), a floor division or a remainder follows
Python's signs, and a division by a size that is zero at run time breaks the check
(Python raises there) instead of reaching onnxruntime's integer division.
"""

from __future__ import annotations

import dataclasses
import fractions
import functools
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir
import sympy
from torch.utils._sympy import functions as torch_sympy

from yobx.torch.onnx.check_gates import Holds, SizePair, chain_checks, compare_sizes, gate_graph
from yobx.torch.onnx.errors import OnnxExportError
from yobx.torch.tracing.constraints.defined_junctions import junction
from yobx.torch.tracing.constraints.runtime_checks import (
    RuntimeCheck,
    condition_in_sizes,
    describe_source,
    size_source,
)
from yobx.torch.tracing.constraints.size_search import compile_condition, holds

#: the beginning of the name of every node checking a constraint
CHECK_NODE_PREFIX = "yobx check failed: "
#: the beginning of the names of the nodes computing the checks and the gates
HELPER_NODE_PREFIX = "yobx_checks/"


def is_check_node(node: ir.Node | Any) -> bool:
    """Whether an ONNX node (``onnx_ir`` or ``onnx.NodeProto``) is one of the nodes the
    runtime checks added, rather than the model's own computation."""
    name = node.name or ""
    return name.startswith(CHECK_NODE_PREFIX) or name.startswith(HELPER_NODE_PREFIX)


#: metadata_props key listing the checks of the model (JSON)
RUNTIME_CHECKS_KEY = "yobx.runtime_checks"

#: ``(input leaf, axis)``: one size of one input (axis None: an int input's value)
SizeKey = tuple[str, "int | None"]


@dataclasses.dataclass(frozen=True)
class ModelCheck:
    """One condition an exported model checks on its inputs' sizes.

    :param name: the name of the ONNX node that fails when the condition does not hold,
        which onnxruntime's error message repeats
    :param expression: the condition in the user's dimension names
    :param kind: ``"declared"``, ``"torch._check"`` or the constraint's kind
    :param location: the user's ``file:line`` that needed it
    :param condition: the condition on the symbols of :attr:`sources`
    :param sources: symbol -> ``(input leaf, axis, a, b)``: the axis has size
        ``a * symbol + b`` (axis None: an int input, its value)
    """

    name: str
    expression: str
    kind: str
    location: str
    condition: sympy.Basic
    sources: Mapping[sympy.Symbol, tuple[str, int | None, int, int]]

    def reads(self) -> list[SizeKey]:
        """The input sizes the condition depends on."""
        return list(self.read_keys)

    @functools.cached_property
    def read_keys(self) -> tuple[SizeKey, ...]:
        """:meth:`reads`, computed once: validation asks for them for every candidate
        size it tries."""
        return tuple(sorted({(leaf, axis) for leaf, axis, _, _ in self.sources.values()}, key=str))

    def holds(self, sizes: Mapping[SizeKey, int]) -> bool:
        """Whether the condition holds for these input sizes (False where the model's
        computation of it divides by zero, as the ONNX check does).

        The condition is compiled once into Python (exact fractions, Python's floor
        division and remainder): validation evaluates it for thousands of sizes.
        """
        values = [
            (int(sizes[leaf, axis]) - b) // a
            for leaf, axis, a, b in (self.sources[s] for s in self._symbols)
        ]
        return holds(self._compiled, values)

    @functools.cached_property
    def _symbols(self) -> list[sympy.Symbol]:
        return sorted(self.sources, key=str)

    @functools.cached_property
    def _compiled(self) -> Any:
        return compile_condition(self.condition, self._symbols)


def failed_check(message: str) -> str | None:
    """The name of the check node an onnxruntime error names (``yobx check failed:
    seq <= 16 ...``), None when the error comes from elsewhere."""
    start = message.find(CHECK_NODE_PREFIX)
    if start < 0:
        return None
    end = message.find("' Status Message", start)
    return message[start:] if end < 0 else message[start:end]


def model_checks(tracer: Any) -> list[RuntimeCheck]:
    """The conditions an export of ``tracer``'s last trace must check, in order."""
    if tracer is None or getattr(tracer, "dims", None) is None:
        return []
    return tracer.checks


def checks_to_json(checks: list[ModelCheck]) -> str:
    """The checks as a JSON list of ``{"name", "expression", "kind", "location"}``."""
    return json.dumps(
        [
            {"name": c.name, "expression": c.expression, "kind": c.kind, "location": c.location}
            for c in checks
        ]
    )


def add_runtime_checks(
    model: ir.Model, tracer: Any, inputs: Mapping[str, ir.Value]
) -> list[ModelCheck]:
    """Adds to ``model`` the nodes checking every constraint of ``tracer``'s last trace
    and gates the inputs with them (see the module's documentation).

    :param model: the exported model (its main graph is changed)
    :param tracer: the :class:`~yobx.torch.tracing.CustomTracer` that captured it
    :param inputs: the ONNX input of each placeholder, by placeholder name
    :return: the checks added, in the order onnxruntime runs them
    :raises OnnxExportError: a condition reads a size no input has, or an operation
        the checks cannot compute
    """
    dims = tracer.dims if tracer is not None else None
    checks = model_checks(tracer)
    if dims is None or not checks:
        return []
    builder = _CheckGraph(model.graph, inputs)
    added: list[ModelCheck] = []
    taken: set[str] = set()
    # messages name the inputs as the ONNX model does (past_key_values.0.key)
    names = {leaf: value.name for leaf, value in inputs.items()}
    for check in checks:
        condition = condition_in_sizes(dims, check.condition)
        if condition is sympy.true:
            continue
        sources = _sources(dims, check, condition)
        expression = _with_input_names(check.expression, condition, names)
        name = _unique(_node_name(dims, check, expression, condition, names), taken)
        taken.add(name)
        builder.check(condition, sources, name, check)
        added.append(ModelCheck(name, expression, check.kind, check.location, condition, sources))
    if added:
        builder.gate()
    return added


def _sources(dims: Any, check: RuntimeCheck, condition: sympy.Basic | None) -> dict:
    """Where each symbol of a check's condition comes from, or a clear error."""
    sources = {}
    for symbol in sorted(condition.free_symbols if condition is not None else (), key=str):
        source = size_source(dims, symbol)
        if source is None:
            condition = None
            break
        sources[symbol] = source
    if condition is None:
        raise OnnxExportError(
            f"the constraint `{check.expression}` ({check.location or 'declared'}) involves "
            f"a value that is not an input's dimension, so the ONNX model cannot check "
            f"it when it runs; declare the dimensions it needs as dynamic inputs or make "
            f"them static (runtime_checks=False exports without any check: the model is "
            f"then silently wrong outside its constraints)"
        )
    return sources


def _with_input_names(expression: str, condition: sympy.Basic, names: Mapping[str, str]) -> str:
    """The text of a check with the ONNX names of the inputs whose sizes it reads
    directly (``past_key_values.0.value.size(0) == batch``)."""
    for symbol in condition.free_symbols:
        text = str(symbol)
        if ".size(" in text:
            leaf, _, rest = text.rpartition(".size(")
            expression = expression.replace(text, f"{names.get(leaf, leaf)}.size({rest}")
    return expression


def _node_name(
    dims: Any,
    check: RuntimeCheck,
    expression: str,
    condition: sympy.Basic,
    names: Mapping[str, str],
) -> str:
    """``yobx check failed: seq <= 16 (range), needed at model.py:6; seq is axis 2 of x``"""
    text = expression
    if check.kind and not text.endswith(f"({check.kind})") and check.kind != "torch._check":
        text += f" ({check.kind})"
    if check.location:
        text += f", needed at {check.location}"
    described = [describe_source(dims, s, names) for s in sorted(condition.free_symbols, key=str)]
    described = [d for d in described if d]
    if described:
        text += "; " + ", ".join(described)
    return CHECK_NODE_PREFIX + text


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    index = 2
    while f"{name} #{index}" in taken:
        index += 1
    return f"{name} #{index}"


# arithmetic on the inputs' sizes, in ONNX nodes


@dataclasses.dataclass(frozen=True)
class _Exact:
    """An exact number computed by the model: ``value / scale`` (``value`` an int64
    tensor of one element, ``scale`` a positive integer)."""

    value: ir.Value
    scale: int = 1


@dataclasses.dataclass(frozen=True)
class _Real:
    """A float64 number computed by the model (a true division by a size)."""

    value: ir.Value


#: a number: a Python constant (``Fraction`` or ``float``), or computed
_Number = Any


class _CheckGraph:
    """Builds the checks' nodes at the beginning of a graph, sharing sizes, constants
    and arithmetic between checks, then gates the inputs with the chain's token."""

    def __init__(self, graph: ir.Graph, inputs: Mapping[str, ir.Value]):
        self.graph = graph
        self.inputs = inputs
        self.nodes: list[ir.Node] = []
        self.constants: dict[tuple, ir.Value] = {}
        self.memo: dict[sympy.Basic, Any] = {}
        #: conditions a computation needs to be defined (divisors other than zero)
        self.defined: list[Any] = []
        #: the symbols of the check being built and where their values come from
        self.sources: dict = {}
        #: how many nodes were written (their outputs are numbered)
        self.written = 0
        #: ``(holds, name)`` of each check, in order (see :mod:`.check_gates`)
        self.conditions: list[tuple[Holds, str]] = []
        #: the chain's first token: a one-element tensor each check reshapes
        self.token = self.constant(np.array([0], dtype=np.int64))

    # nodes

    def op(
        self, op_type: str, inputs: list, name: str | None = None, into: list | None = None, **a
    ) -> ir.Value:
        """The output of a new node, appended to ``into`` (default: the nodes written
        before the model's)."""
        index, self.written = self.written, self.written + 1
        if name is None:
            name = f"{HELPER_NODE_PREFIX}{op_type}_{index}"
        node = ir.node(op_type, inputs, attributes=a or None, name=name)
        # named here: onnx_ir's automatic names (val_N) may collide with names used
        # in the subgraphs of an If (the choice between versions)
        node.outputs[0].name = f"{HELPER_NODE_PREFIX}v{index}"
        (self.nodes if into is None else into).append(node)
        return node.outputs[0]

    def append(self, node: ir.Node) -> None:
        """Appends a node made elsewhere to the nodes written before the model's."""
        self.nodes.append(node)

    def constant(self, array: np.ndarray) -> ir.Value:
        """A constant, written once."""
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self.constants:
            self.constants[key] = self.op("Constant", [], value=ir.tensor(array))
        return self.constants[key]

    def int_constant(self, value: int) -> ir.Value:
        """A one-element int64 constant, written once."""
        return self.constant(np.array([value], dtype=np.int64))

    def _bool(self, value: bool) -> ir.Value:
        return self.constant(np.array([value], dtype=np.bool_))

    # the chain and the gates

    def check(self, condition: sympy.Basic, sources: dict, name: str, check: RuntimeCheck):
        self.sources = sources
        self.defined = []
        pair = _size_pair(condition, sources, self.inputs)
        if pair is not None:
            self.conditions.append((pair, name))
            return
        try:
            holds = self._boolean(self._interpret(condition))
        except NotImplementedError as exc:
            raise OnnxExportError(
                f"the ONNX model cannot check the constraint `{check.expression}` "
                f"({check.location or 'declared'}): {exc}; export with "
                f"runtime_checks=False to go without its checks (the model is then "
                f"silently wrong outside its constraints)"
            ) from exc
        for defined in self.defined:
            holds = self.op("And", [self._boolean(defined), holds])
        self.conditions.append((holds, name))

    def gate(self) -> None:
        """Chains the checks, makes every input the model reads go through the chain's
        token (outputs computed from no input too), and inserts the nodes at the
        graph's start (:mod:`.check_gates`)."""
        conditions = compare_sizes(self, self.conditions)
        token = chain_checks(self, self.token, conditions, HELPER_NODE_PREFIX)
        ours = {id(node) for node in self.nodes}
        after = gate_graph(self.graph, self, token, ours, HELPER_NODE_PREFIX)
        graph = self.graph
        if len(graph):
            graph.insert_before(graph[0], self.nodes)
        else:
            graph.extend(self.nodes)
        graph.extend(after)

    # interpretation of a condition

    def _interpret(self, expr: sympy.Basic) -> _Number:
        """The value of ``expr``; the conditions it needs to be defined (divisors
        other than zero) are added to :attr:`defined`, also when the value comes from
        the memo (a previous check, or a disjunct, computed it first)."""
        if expr in self.memo:
            result, needs = self.memo[expr]
            self.defined.extend(needs)
            return result
        outer, self.defined = self.defined, []
        try:
            result = self._compute(expr)
            needs = tuple(self.defined)
        finally:
            self.defined = outer
        self.memo[expr] = (result, needs)
        self.defined.extend(needs)
        return result

    def _compute(self, expr: sympy.Basic) -> _Number:
        if isinstance(expr, sympy.Symbol):
            return self._size(expr)
        if isinstance(expr, sympy.logic.boolalg.BooleanAtom):
            return bool(expr)
        if expr.is_Integer or expr.is_Rational:
            return fractions.Fraction(int(expr.p), int(expr.q))
        if expr.is_Float:
            return float(expr)
        if isinstance(expr, (sympy.And, sympy.Or)):
            return self._junction(expr)
        args = [self._interpret(a) for a in expr.args]
        for classes, method in _OPERATIONS:
            if isinstance(expr, classes):
                return method(self, expr, args)
        function = _opaque_function(expr)
        if function is not None:
            return self._unary(function, args[0])
        raise NotImplementedError(f"no check for {type(expr).__name__} ({expr})")

    def _size(self, symbol: sympy.Symbol) -> _Exact:
        leaf, axis, a, b = self.sources[symbol]
        key = ("size", leaf, axis)
        if key not in self.memo:
            value = self.inputs.get(leaf)
            if value is None:
                raise NotImplementedError(f"input {leaf!r} is not an input of the ONNX model")
            if axis is None:
                read = self.op("Reshape", [value, self.int_constant(1)])
                if value.dtype not in (None, ir.DataType.INT64):
                    read = self.op("Cast", [read], to=ir.DataType.INT64)
            else:
                read = self.op("Shape", [value], start=axis, end=axis + 1)
            self.memo[key] = _Exact(read)
        size = self.memo[key]
        if b:
            size = self._add(size, fractions.Fraction(-b))
        if a != 1:
            size = self._floordiv(size, fractions.Fraction(a))
        return size

    # numbers

    def _exact(self, number: _Number) -> _Exact | _Real:
        """A computed number (a constant made a node)."""
        if isinstance(number, (_Exact, _Real)):
            return number
        if isinstance(number, float):
            return _Real(self.constant(np.array([number], dtype=np.float64)))
        number = fractions.Fraction(number)
        return _Exact(self.int_constant(number.numerator), number.denominator)

    def _real(self, number: _Number) -> _Real:
        number = self._exact(number)
        if isinstance(number, _Real):
            return number
        real = self.op("Cast", [number.value], to=ir.DataType.DOUBLE)
        if number.scale != 1:
            scale = self.constant(np.array([number.scale], dtype=np.float64))
            real = self.op("Div", [real, scale])
        return _Real(real)

    def _scaled(self, number: _Exact, scale: int) -> ir.Value:
        """The numerator of ``number`` written with the multiple ``scale`` of its own."""
        if scale == number.scale:
            return number.value
        return self.op("Mul", [number.value, self.int_constant(scale // number.scale)])

    def _common(self, left: _Number, right: _Number) -> tuple[Any, Any, int | None]:
        """Both operands in one representation: ``(l, r, scale)``, numerators on a
        common scale, or ``(l, r, None)`` in float64."""
        left, right = self._exact(left), self._exact(right)
        if isinstance(left, _Real) or isinstance(right, _Real):
            return self._real(left).value, self._real(right).value, None
        scale = math.lcm(left.scale, right.scale)
        return self._scaled(left, scale), self._scaled(right, scale), scale

    def _add(self, left: _Number, right: _Number) -> _Number:
        if _constant(left) and _constant(right):
            return left + right
        if _constant(right) and right == 0:
            return left
        if _constant(left) and left == 0:
            return right
        a, b, scale = self._common(left, right)
        total = self.op("Add", [a, b])
        return _Real(total) if scale is None else _Exact(total, scale)

    def _mul(self, left: _Number, right: _Number) -> _Number:
        if _constant(left) and _constant(right):
            return left * right
        if _constant(left):
            left, right = right, left
        if _constant(right):
            if right == 1:
                return left
            if isinstance(left, _Exact) and isinstance(right, fractions.Fraction):
                value = left.value
                if right.numerator != 1:
                    value = self.op("Mul", [value, self.int_constant(right.numerator)])
                return _Exact(value, left.scale * right.denominator)
        left, right = self._exact(left), self._exact(right)
        if isinstance(left, _Exact) and isinstance(right, _Exact):
            return _Exact(self.op("Mul", [left.value, right.value]), left.scale * right.scale)
        return _Real(self.op("Mul", [self._real(left).value, self._real(right).value]))

    def _nonzero(self, divisor: _Number) -> None:
        """A division by ``divisor``: the check fails where it is zero (Python raises)."""
        if _constant(divisor):
            if divisor == 0:
                raise NotImplementedError("a division by zero")
            return
        divisor = self._exact(divisor)
        zero = self._exact(fractions.Fraction(0))
        if isinstance(divisor, _Real):
            zero = self._real(zero)
        self.defined.append(self.op("Not", [self.op("Equal", [divisor.value, zero.value])]))

    def _floordiv(self, left: _Number, right: _Number) -> _Number:
        if _constant(left) and _constant(right):
            return fractions.Fraction(math.floor(fractions.Fraction(left) / right))
        self._nonzero(right)
        a, b, scale = self._common(left, right)
        if scale is None:
            quotient = self.op("Floor", [self.op("Div", [a, b])])
            return _Exact(self.op("Cast", [quotient], to=ir.DataType.INT64))
        # (a/s) // (b/s) == a // b; Mod follows the divisor's sign, as Python's %
        safe = self._safe_divisor(b)
        remainder = self.op("Mod", [a, safe], fmod=0)
        return _Exact(self.op("Div", [self.op("Sub", [a, remainder]), safe]))

    def _safe_divisor(self, divisor: ir.Value) -> ir.Value:
        """``divisor``, or 1 where it is zero: the check already fails there, and
        onnxruntime's integer division by zero would stop the process."""
        zero = self.op("Equal", [divisor, self.int_constant(0)])
        return self.op("Where", [zero, self.int_constant(1), divisor])

    def _mod(self, left: _Number, right: _Number) -> _Number:
        if _constant(left) and _constant(right):
            return fractions.Fraction(left) % fractions.Fraction(right)
        self._nonzero(right)
        a, b, scale = self._common(left, right)
        if scale is None:
            # Python's float remainder has the divisor's sign: a - b * floor(a / b)
            floor = self.op("Floor", [self.op("Div", [a, b])])
            return _Real(self.op("Sub", [a, self.op("Mul", [b, floor])]))
        return _Exact(self.op("Mod", [a, self._safe_divisor(b)], fmod=0), scale)

    def _truediv(self, left: _Number, right: _Number) -> _Number:
        if _constant(right):
            if right == 0:
                raise NotImplementedError("a division by zero")
            if isinstance(right, fractions.Fraction):
                return self._mul(left, 1 / right)
        self._nonzero(right)
        return _Real(self.op("Div", [self._real(left).value, self._real(right).value]))

    def _power(self, base: _Number, exponent: _Number) -> _Number:
        if _constant(base) and _constant(exponent):
            return base**exponent
        if (
            _constant(exponent)
            and fractions.Fraction(exponent).denominator == 1
            and 0 <= exponent <= 16
        ):
            result: _Number = fractions.Fraction(1)
            for _ in range(int(exponent)):
                result = self._mul(result, base)
            return result
        return _Real(self.op("Pow", [self._real(base).value, self._real(exponent).value]))

    def _unary(self, function: str, number: _Number) -> _Number:
        """``math.sqrt(n)`` and its kind (torch's ``OpaqueUnaryFn_sqrt``), in float."""
        if _constant(number):
            return float(getattr(math, function)(number))
        value = self._real(number).value
        # onnxruntime has no float64 kernel of Tan, Cosh, Sinh and Log2: their
        # definitions instead (the checks compute in float64, as Python does)
        if function == "log2":
            ln2 = self.constant(np.array([math.log(2.0)], dtype=np.float64))
            return _Real(self.op("Div", [self.op("Log", [value]), ln2]))
        if function == "tan":
            return _Real(self.op("Div", [self.op("Sin", [value]), self.op("Cos", [value])]))
        if function in ("cosh", "sinh"):
            up, down = self.op("Exp", [value]), self.op("Exp", [self.op("Neg", [value])])
            half = self.constant(np.array([0.5], dtype=np.float64))
            both = self.op("Add" if function == "cosh" else "Sub", [up, down])
            return _Real(self.op("Mul", [both, half]))
        return _Real(self.op(_ONNX_UNARY[function], [value]))

    def _truncated(self, number: _Number) -> _Number:
        """``int(x)``: towards zero, the floor of a positive number and the ceiling
        of a negative one."""
        if _constant(number):
            return fractions.Fraction(math.trunc(number))
        number = self._exact(number)
        if isinstance(number, _Exact):
            floor = self._rounded(number, ceiling=False)
            ceiling = self._rounded(number, ceiling=True)
            a, b, scale = self._common(floor, ceiling)
            negative = self.op("Less", [number.value, self.int_constant(0)])
            return _Exact(self.op("Where", [negative, b, a]), scale)
        value = number.value
        zero = self._real(0).value
        rounded = self.op(
            "Where",
            [
                self.op("Less", [value, zero]),
                self.op("Ceil", [value]),
                self.op("Floor", [value]),
            ],
        )
        return _Exact(self.op("Cast", [rounded], to=ir.DataType.INT64))

    def _rounded(self, number: _Number, ceiling: bool) -> _Number:
        if _constant(number):
            return fractions.Fraction(math.ceil(number) if ceiling else math.floor(number))
        number = self._exact(number)
        if isinstance(number, _Exact):
            if not ceiling:
                return self._floordiv(number, fractions.Fraction(1))
            negative = self._mul(number, fractions.Fraction(-1))
            return self._mul(self._floordiv(negative, fractions.Fraction(1)), -1)
        rounded = self.op("Ceil" if ceiling else "Floor", [number.value])
        return _Exact(self.op("Cast", [rounded], to=ir.DataType.INT64))

    def _extremum(self, args: list, largest: bool) -> _Number:
        result = args[0]
        for other in args[1:]:
            if _constant(result) and _constant(other):
                result = max(result, other) if largest else min(result, other)
                continue
            a, b, scale = self._common(result, other)
            value = self.op("Max" if largest else "Min", [a, b])
            result = _Real(value) if scale is None else _Exact(value, scale)
        return result

    # booleans

    def _boolean(self, value: Any) -> ir.Value:
        return self._bool(value) if isinstance(value, bool) else value

    def _relation(self, expr: sympy.Basic, args: list) -> Any:
        left, right = args
        if _constant(left) and _constant(right):
            return bool(_PYTHON_RELATIONS[type(expr)](left, right))
        a, b, _ = self._common(left, right)
        op_type, swap, negate = _ONNX_RELATIONS[type(expr)]
        result = self.op(op_type, [b, a] if swap else [a, b])
        return self.op("Not", [result]) if negate else result

    def _junction(self, expr: sympy.Basic) -> Any:
        """``And``/``Or`` of operands that may divide by zero
        (:func:`~yobx.torch.tracing.constraints.defined_junctions.junction`): a
        disjunct that divides by zero counts as false (``body when guard`` is
        ``Or(Not(guard), body)``: where the guard does not hold, the body may divide by
        zero, a window count that is 0 outside the version that needs it, without
        breaking the check); a conjunction is false where one of its conditions is, and
        undefined where none is and one divides by zero. The traced graph's checks
        count them the same way (:mod:`yobx.torch.tracing.constraints.runtime_checks`)."""
        operands = []
        for arg in expr.args:
            outer, self.defined = self.defined, []
            try:
                operands.append((self._interpret(arg), self.defined))
            finally:
                self.defined = outer
        result, defined = junction(
            operands, isinstance(expr, sympy.Or), self._both, self._either, self._negate
        )
        if defined is not None:
            self.defined.append(defined)
        return result

    def _both(self, a: Any, b: Any) -> Any:
        """``a and b`` of two conditions, each a bool or a computed one."""
        return self._logical("And", a, b, absorbing=False)

    def _either(self, a: Any, b: Any) -> Any:
        """``a or b`` of two conditions, each a bool or a computed one."""
        return self._logical("Or", a, b, absorbing=True)

    def _logical(self, op_type: str, a: Any, b: Any, absorbing: bool) -> Any:
        if a is absorbing or b is absorbing:
            return absorbing
        if a is (not absorbing):
            return b
        if b is (not absorbing):
            return a
        return self.op(op_type, [a, b])

    def _negate(self, value: Any) -> Any:
        return not value if isinstance(value, bool) else self.op("Not", [value])

    def _not(self, expr: sympy.Basic, args: list) -> Any:
        (value,) = args
        return self._negate(value)


def _size_pair(condition: sympy.Basic, sources: dict, inputs: Mapping) -> SizePair | None:
    """The two input sizes ``condition`` says are equal, when it says only that (and
    both inputs have a known rank)."""
    if not isinstance(condition, sympy.Eq):
        return None
    sides = []
    for side in condition.args:
        source = sources.get(side) if isinstance(side, sympy.Symbol) else None
        if source is None or source[1] is None or source[2:] != (1, 0):
            return None
        value = inputs.get(source[0])
        if value is None or value.shape is None:
            return None
        sides.append((value, source[1]))
    return SizePair(sides[0], sides[1])


def _constant(number: Any) -> bool:
    return isinstance(number, (fractions.Fraction, float, int, bool))


def _fold(method):
    def apply(builder: _CheckGraph, expr: sympy.Basic, args: list) -> _Number:
        result = args[0]
        for other in args[1:]:
            result = method(builder, result, other)
        return result

    return apply


def _binary(method):
    def apply(builder: _CheckGraph, expr: sympy.Basic, args: list) -> _Number:
        return method(builder, *args)

    return apply


_PYTHON_RELATIONS = {
    sympy.Eq: lambda a, b: a == b,
    sympy.Ne: lambda a, b: a != b,
    sympy.Lt: lambda a, b: a < b,
    sympy.Le: lambda a, b: a <= b,
    sympy.Gt: lambda a, b: a > b,
    sympy.Ge: lambda a, b: a >= b,
}
#: relation -> (ONNX operator, swap the operands, negate the result)
_ONNX_RELATIONS = {
    sympy.Eq: ("Equal", False, False),
    sympy.Ne: ("Equal", False, True),
    sympy.Lt: ("Less", False, False),
    sympy.Le: ("LessOrEqual", False, False),
    sympy.Gt: ("Greater", False, False),
    sympy.Ge: ("GreaterOrEqual", False, False),
}

#: the functions of torch's ``OpaqueUnaryFn_<name>`` (``math.<name>`` of a symbolic
#: number) -> the ONNX operator; ``tan``, ``cosh``, ``sinh`` and ``log2`` are computed
#: from them, the inverse trigonometric functions have no float64 kernel in onnxruntime
_ONNX_UNARY = {
    "sqrt": "Sqrt",
    "exp": "Exp",
    "log": "Log",
    "cos": "Cos",
    "sin": "Sin",
    "tanh": "Tanh",
}
_COMPOSED_UNARY = ("tan", "cosh", "sinh", "log2")


def _opaque_function(expr: sympy.Basic) -> str | None:
    """``sqrt`` for ``OpaqueUnaryFn_sqrt(...)``, None for anything else."""
    name = type(expr).__name__
    if not name.startswith("OpaqueUnaryFn_") or len(expr.args) != 1:
        return None
    function = name[len("OpaqueUnaryFn_") :]
    return function if function in _ONNX_UNARY or function in _COMPOSED_UNARY else None


_OPERATIONS: tuple = (
    (sympy.Add, _fold(_CheckGraph._add)),
    (sympy.Mul, _fold(_CheckGraph._mul)),
    ((sympy.Min, torch_sympy.Min), lambda b, e, a: b._extremum(a, largest=False)),
    ((sympy.Max, torch_sympy.Max), lambda b, e, a: b._extremum(a, largest=True)),
    (torch_sympy.FloorDiv, _binary(_CheckGraph._floordiv)),  # CleanDiv too (a subclass)
    ((torch_sympy.Mod, torch_sympy.PythonMod, sympy.Mod), _binary(_CheckGraph._mod)),
    ((torch_sympy.IntTrueDiv, torch_sympy.FloatTrueDiv), _binary(_CheckGraph._truediv)),
    ((torch_sympy.PowByNatural, torch_sympy.FloatPow, sympy.Pow), _binary(_CheckGraph._power)),
    (torch_sympy.ToFloat, lambda b, e, a: b._real(a[0]) if not _constant(a[0]) else float(a[0])),
    (torch_sympy.TruncToInt, lambda b, e, a: b._truncated(a[0])),
    (torch_sympy.CeilToInt, lambda b, e, a: b._rounded(a[0], ceiling=True)),
    (torch_sympy.FloorToInt, lambda b, e, a: b._rounded(a[0], ceiling=False)),
    (tuple(_PYTHON_RELATIONS), _CheckGraph._relation),
    (sympy.Not, _CheckGraph._not),
)
