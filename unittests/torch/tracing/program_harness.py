"""Differential runs of generated programs: traced graph against eager at several sizes.

:func:`run_program` traces a :class:`~program_generator.Program` with
:class:`yobx.torch.tracing.CustomTracer` (string dimension names) and runs the graph and
the module at the example sizes and at other sizes, comparing outputs and the inputs
after the call (programs may write into their inputs). The outcome is one of:

- ``correct``: traced, and equal to eager wherever the graph accepted the inputs;
- ``refused``: tracing raised; the category is ``<reason>@<operator>`` when an operator
  needed something (``unprovable-op-requirement@pad``), else ``<reason>@<idiom>`` (the
  idiom of the generated line the error names: ``undecidable-condition@branch_on_dim``);
- ``narrowed``: the graph raised :class:`ConstraintViolationError` at a size eager runs
  at: it holds for fewer sizes than the program;
- ``wrong``: outputs or inputs after the call differ from eager, or the graph raised
  another error at a size eager runs at (the worst outcome: silent wrongness);
- ``edge_raised``: the graph raised another error than a constraint at a size of 1 or 0
  (:func:`edge_sizes`), where eager runs: dimensions declared without a minimum take
  those sizes, which their default range (from 2, as torch.export's) leaves unchecked.
  A refusal without its reason, not a wrong value (different values there are
  ``wrong``);
- ``eager_failed``: the program does not run in eager at the example.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
import re
import traceback
import warnings
from collections.abc import Callable

import torch
from torch.fx.proxy import TraceError

from yobx.torch.tracing import (
    ConstraintViolationError,
    CustomTracer,
    DataDependentError,
    SpecializationError,
)

from .program_generator import Program

OUTCOMES = ("correct", "refused", "narrowed", "wrong", "edge_raised", "eager_failed")

#: message fragments of the tracer's refusals -> refusal reason
_REASONS = (
    ("cannot decide", "undecidable-condition"),
    ("which is not provable from the declared", "unprovable-op-requirement"),
    ("a Python int is needed", "python-int-needed"),
    ("len() of a tensor whose first dimension", "len-of-dynamic-dimension"),
    ("the truth value of a traced tensor", "data-dependent-bool"),
    ("failed on fake tensors", "fake-tensor-failure"),
    ("shape rule of", "shape-rule-mismatch"),
)


@dataclasses.dataclass
class Outcome:
    """What happened to one program.

    :param kind: one of :data:`OUTCOMES`
    :param program: the program
    :param category: ``refused``: ``<reason>@<operator or idiom>``; ``narrowed``: the
        constraint the graph refused; ``wrong``: what differed
    :param message: first line of the error, or the description of the difference
    :param fact: ``refused``: the kind of fact the tracer could not prove (``range``,
        ``relation``, ``divisibility``, ``value``, ``other``) or ``op`` for an operator
        failure
    :param constraints: the constraints the tracer reported (``tracer.constraints``)
    :param checked: size sets compared with eager
    :param skipped: size sets where eager raised (not compared)
    """

    kind: str
    program: Program
    category: str = ""
    message: str = ""
    fact: str = ""
    constraints: tuple[str, ...] = ()
    checked: int = 0
    skipped: int = 0

    def report(self) -> str:
        """A full description: outcome, error or difference, the program."""
        head = f"{self.kind}: {self.category}"
        constraints = "".join(f"\n#   constraint: {c}" for c in self.constraints)
        return f"# {head}\n# {self.message}{constraints}\n{self.program.describe()}"


def run_program(program: Program, sizes: int = 3, tool: str = "tracer") -> Outcome:
    """Traces ``program`` and compares the graph with eager at ``sizes`` size sets.

    :param program: the program
    :param sizes: the example then ``sizes - 1`` other size sets
    :param tool: ``"tracer"`` (CustomTracer) or ``"export"`` (torch.export.export with
        ``Dim.DYNAMIC``, as a reference; its input checks count as narrowing)
    """
    module = program.module()
    example = program.example_inputs()
    with warnings.catch_warnings(), _quiet_fake_tensor_log():
        warnings.simplefilter("ignore")
        try:
            module(**_clone(example))
        except Exception as e:
            return Outcome("eager_failed", program, type(e).__name__, _first_line(e))
        try:
            run, constraints = _capture(tool, program, module, example)
        except Exception as e:
            reason, fact = classify_refusal(e)
            where = _operator_of(e) or _idiom_of(e, program)
            return Outcome("refused", program, f"{reason}@{where}", _first_line(e), fact)
        return _compare_at_sizes(program, module, run, constraints, sizes, tool)


def _capture(tool: str, program: Program, module, example) -> tuple[Callable, tuple]:
    """Returns the captured program as a callable and the constraints it reported."""
    if tool == "tracer":
        tracer = CustomTracer()
        graph = tracer.trace(
            module, concrete_args=_clone(example), dynamic_shapes=program.dynamic_shapes
        )
        # ``tracer.constraints`` is the API of adopted facts (absent before it lands)
        return (
            torch.fx.GraphModule(tracer.traced_model, graph),
            tuple(getattr(tracer, "constraints", ())),
        )
    dim = torch.export.Dim.DYNAMIC
    dynamic_shapes = {
        name: None if axes is None else {a: dim for a in axes}
        for name, axes in program.dynamic_shapes.items()
    }
    exported = torch.export.export(
        module, (), kwargs=_clone(example), dynamic_shapes=dynamic_shapes, strict=False
    )
    constraints = tuple(
        f"{s}: {r}" for s, r in exported.range_constraints.items() if not r.is_singleton()
    )
    return exported.module(), constraints


def _compare_at_sizes(program, module, run, constraints, sizes, tool) -> Outcome:
    checked = skipped = 0
    narrowed: list[tuple[str, str]] = []
    texts = tuple(str(c) for c in constraints)
    regular = program.size_sets[:sizes]
    edge_raised: list[tuple[dict, str]] = []
    for index, dims in enumerate([*regular, *edge_sizes(program)]):
        inputs = program.make_inputs(dims)
        eager_inputs, graph_inputs = _clone(inputs), _clone(inputs)
        try:
            expected = module(**eager_inputs)
        except Exception:
            skipped += 1
            continue
        edge = index >= len(regular)
        try:
            got = run(**graph_inputs)
        except ConstraintViolationError as e:
            if edge:
                skipped += 1  # refused with its reason: allowed outside the default range
                continue
            if index == 0 or constraint_holds(e.expression, dims):
                return _wrong(
                    program, "graph refused inputs inside its constraints", e, dims, texts
                )
            narrowed.append((e.expression, _first_line(e)))
            continue
        except Exception as e:
            if tool == "export" and index > 0:
                narrowed.append(("export input check", _first_line(e)))
                continue
            if edge:
                edge_raised.append((dims, f"{type(e).__name__}: {_first_line(e)}"))
                continue
            return _wrong(program, f"graph raised {type(e).__name__}", e, dims, texts)
        checked += 1
        difference = (
            _difference(expected, got, "output")
            or _difference(eager_inputs, graph_inputs, "input after the call")
            or _unchecked_constraint(constraints, dims)
        )
        if difference:
            return _wrong(program, difference, None, dims, texts, checked, skipped)
    if edge_raised:
        dims, message = edge_raised[0]
        category = message.split(":")[0]
        message = f"at sizes {dims}: {message}"
        return Outcome("edge_raised", program, category, message, "", texts, checked, skipped)
    if narrowed:
        expression, message = narrowed[0]
        return Outcome("narrowed", program, expression, message, "", texts, checked, skipped)
    return Outcome("correct", program, "", "", "", texts, checked, skipped)


def edge_sizes(program: Program) -> list[dict[str, int]]:
    """Sizes of 1 and 0, which the programs are not generated for (eager may refuse
    them: the size set is then skipped) but dimensions declared without a minimum take:
    a decode step's one new token, an empty cache. The graph must compute them right or
    refuse them naming a constraint. Every dimension at 1, then at 0, then the first
    one alone at 0."""
    names = list(program.example_dims)
    if not names:
        return []
    first = {**program.example_dims, names[0]: 0}
    return [dict.fromkeys(names, 1), dict.fromkeys(names, 0), first]


def _unchecked_constraint(constraints, dims: dict[str, int]) -> str | None:
    """A constraint the sizes break although the graph ran (its runtime check is missing)."""
    for constraint in constraints:
        expression = getattr(constraint, "expression", None)
        # a constraint of one version applies to the inputs that version is chosen for
        when = getattr(constraint, "when", "")
        if when and constraint_holds(when, dims) is not True:
            continue
        if expression is not None and constraint_holds(expression, dims) is False:
            return f"graph ran outside its constraint `{expression}` without raising"
    return None


#: sympy's functions as they appear in rendered constraints
_CONSTRAINT_FUNCTIONS = {"Mod": operator.mod, "Min": min, "Max": max, "Abs": abs}


def constraint_holds(expression: str, dims: dict[str, int]) -> bool | None:
    """Evaluates a constraint written in the user's dimension names (None if it cannot)."""
    try:
        value = eval(expression, {"__builtins__": {}}, {**_CONSTRAINT_FUNCTIONS, **dims})
    except Exception:
        return None
    return bool(value) if isinstance(value, (bool, int)) else None


def _wrong(program, what, error, dims, constraints, checked=0, skipped=0) -> Outcome:
    message = f"at sizes {dims}: {what}"
    if error is not None:
        message += f": {_first_line(error)}"
    return Outcome("wrong", program, what.split(":")[0], message, "", constraints, checked, skipped)


def _difference(expected, got, where: str) -> str | None:
    """Describes how ``got`` differs from ``expected`` (None when they are the same)."""
    if isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            return f"{where}: keys {sorted(expected)} != {got!r}"
        for key in expected:
            found = _difference(expected[key], got[key], f"{where} {key!r}")
            if found:
                return found
        return None
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            return f"{where}: {len(expected)} values expected, got {type(got).__name__}"
        for i, (a, b) in enumerate(zip(expected, got)):
            found = _difference(a, b, f"{where} {i}")
            if found:
                return found
        return None
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{where}: a tensor expected, got {type(got).__name__} {got!r}"
        if got.shape != expected.shape or got.dtype != expected.dtype:
            return (
                f"{where}: shape/dtype {tuple(got.shape)} {got.dtype} instead of "
                f"{tuple(expected.shape)} {expected.dtype}"
            )
        tolerance = {} if expected.dtype.is_floating_point else {"atol": 0, "rtol": 0}
        if expected.dtype == torch.float32:
            tolerance = {"atol": 1e-5, "rtol": 1e-5}
        try:
            torch.testing.assert_close(got, expected, equal_nan=True, **tolerance)
        except AssertionError as e:
            return f"{where}: values differ ({' '.join(str(e).split())[:300]})"
        return None
    if type(got) is not type(expected) or got != expected:
        return f"{where}: {got!r} ({type(got).__name__}) instead of {expected!r}"
    return None


def classify_refusal(error: BaseException) -> tuple[str, str]:
    """Returns (reason, kind of fact) of a refusal, from the error's message."""
    text = str(error)
    if not isinstance(error, TraceError):
        return f"crash-{type(error).__name__}", "op"
    # the tracer's own refusals say what they are
    if isinstance(error, SpecializationError):
        return "specialization", "value"
    if isinstance(error, DataDependentError):
        return "data-dependent", "op"
    reason = next((r for fragment, r in _REASONS if fragment in text), "other-trace-error")
    if reason == "fake-tensor-failure":
        match = re.search(r"failed on fake tensors with (\w+)", text)
        return f"{reason}-{match.group(1) if match else 'error'}", "op"
    if reason == "python-int-needed" or reason.startswith("len-"):
        return reason, "value"
    if reason in ("undecidable-condition", "unprovable-op-requirement"):
        match = re.search(r"`([^`]+)`", text)
        return reason, fact_kind(match.group(1)) if match else "other"
    return reason, "op"


def fact_kind(expression: str) -> str:
    """The kind of constraint a fact would be (as :class:`yobx.torch.tracing.Constraint`)."""
    match = re.fullmatch(r"(.+?) (==|!=|<=|>=|<|>) (.+)", expression.strip())
    if match is None:
        return "other"
    left, op, right = match.groups()
    names = set(re.findall(r"[A-Za-z_]\w*", expression)) - {"Mod", "Min", "Max"}
    constant = left if left.isdigit() else right if right.isdigit() else None
    modular = "Mod(" in expression or "%" in expression or "//" in expression
    if modular and (constant == "0" or (op == "==" and constant is None and len(names) == 1)):
        return "divisibility"
    if constant is not None and len(names) == 1 and "Mod(" not in expression:
        if op == "==" and (right if constant == left else left) in names:
            return "value"
        if op != "!=" and "Min(" not in expression and "Max(" not in expression:
            return "range"
    if len(names) == 1 and re.search(r"(Min|Max)\(\d+, ", expression):
        return "range"
    if op == "==" and constant is None:
        return "relation"
    return "other"


def _operator_of(error: BaseException) -> str | None:
    """The operator an operator's refusal names (``method 'split' requires ...``)."""
    match = re.search(r"\d: (.+?) (requires `|failed on fake tensors)", str(error))
    if not isinstance(error, TraceError) or match is None:
        return None
    return re.findall(r"\w+", match.group(1))[-1]


def _idiom_of(error: BaseException, program: Program) -> str:
    """The idiom of the generated line the error names (or its deepest frame there)."""
    pattern = re.escape(program.filename) + r":(\d+)"
    match = re.search(pattern, str(error))
    line = int(match.group(1)) if match else None
    if line is None:
        frames = [f for f in traceback.extract_tb(error.__traceback__)]
        lines = [f.lineno for f in frames if f.filename == program.filename]
        line = lines[-1] if lines else None
    return program.line_idioms.get(line, "unknown")


@contextlib.contextmanager
def _quiet_fake_tensor_log():
    """FakeTensorMode logs every kernel failure with a traceback before the tracer's error."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def _clone(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
