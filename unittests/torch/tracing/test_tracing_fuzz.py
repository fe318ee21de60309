"""Differential fuzzing: random shape-dependent programs traced and compared with eager.

Each batch generates programs from fixed seeds (:mod:`.program_generator`), traces them
with string dimension names and compares the graph with eager at three sizes
(:mod:`.program_harness`). A batch fails on any ``wrong`` outcome (the graph computes
something else than eager on inputs it accepts) and on any refusal whose category is not
in :data:`ALLOWED_REFUSALS`, where each category says why it is refused today.
``python _scripts/fuzz_tracing.py --count 2000 --show-refused --shrink`` runs thousands
of programs and prints the smallest reproducer of each category.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch

from yobx.torch.tracing import Constraint, ConstraintViolationError

from . import program_harness
from .program_generator import generate_program
from .program_harness import edge_sizes, run_program

PROGRAMS_PER_BATCH = 25
BATCHES = 8

# Facts torch.export adopts from the example (range, relation, divisibility) are
# adopted as constraints too, and checked when the graph runs. What stays refused is a
# dimension declared dynamic that the program makes a constant: a SpecializationError
# naming the line (torch.export refuses these as well, "Constraints violated").
ALLOWED_REFUSALS: dict[str, str] = {
    # pieces iterated over right away are a loop (a scan), joined whole by stack/cat
    # they need no count; indexed, unpacked or given to anything else, they do
    "specialization@unbind": "unbind returns one tensor per index: the count is the dimension",
    "specialization@split_int": "split(k) on a dimension k does not divide: a size-dependent count",
    "specialization@split": "split(k) makes as many pieces as the dimension allows",
    "specialization@chunk": "chunk(k) on a short dimension: the count is the dimension",
    "specialization@permute": (
        "contiguous() of a tensor that a size-1 dimension of the example makes contiguous: "
        "torch returns the tensor itself there and a copy at other sizes"
    ),
}


def _seeds(batch: int) -> range:
    return range(batch * PROGRAMS_PER_BATCH, (batch + 1) * PROGRAMS_PER_BATCH)


@pytest.mark.parametrize("batch", range(BATCHES))
def test_random_programs_match_eager(batch):
    outcomes = [run_program(generate_program(seed)) for seed in _seeds(batch)]
    wrong = [o for o in outcomes if o.kind == "wrong"]
    assert not wrong, "the traced graph differs from eager:\n\n" + "\n\n".join(
        o.report() for o in wrong
    )
    unknown = {}
    for outcome in outcomes:
        if outcome.kind == "refused" and outcome.category not in ALLOWED_REFUSALS:
            unknown.setdefault(outcome.category, outcome)
    assert not unknown, "refusals of undocumented categories:\n\n" + "\n\n".join(
        o.report() for o in unknown.values()
    )
    # the generator only keeps statements eager runs at every size
    assert not [o for o in outcomes if o.kind == "eager_failed"]
    # a batch where nothing traces would check nothing
    correct = [o for o in outcomes if o.kind == "correct"]
    assert len(correct) >= 3, [o.category for o in outcomes]
    # every size set was compared, or skipped because eager raised (or, at sizes 1
    # and 0, because the graph refused them naming a constraint)
    assert all(o.checked + o.skipped == 3 + len(edge_sizes(o.program)) for o in correct)


def test_allowed_refusals_have_a_reason():
    for category, reason in ALLOWED_REFUSALS.items():
        assert "@" in category, category
        assert reason.strip() and "\n" not in reason, category


def test_programs_are_reproducible_and_show_their_lines():
    program = generate_program(7)
    assert generate_program(7).source == program.source
    source = inspect.getsource(program.module_class)
    assert "def forward" in source and source in program.source
    module = program.module()
    for dims in program.size_sets:
        module(**program.make_inputs(dims))


@functools.cache
def _first_correct_program():
    for seed in range(50):
        program = generate_program(seed)
        if run_program(program).kind == "correct":
            return program
    raise AssertionError("no program of seeds 0..49 traces")


def _break_graph(monkeypatch, change, constraints=None):
    """Makes every captured graph return ``change(outputs, inputs, dims)`` and report
    ``constraints`` (when given) instead of the tracer's."""
    capture = program_harness._capture

    def broken_capture(tool, program, module, example):
        run, reported = capture(tool, program, module, example)

        def broken_run(**inputs):
            dims = _dims_of(program, inputs)
            return change(run(**inputs), inputs, dims)

        return broken_run, reported if constraints is None else constraints

    monkeypatch.setattr(program_harness, "_capture", broken_capture)


def _dims_of(program, inputs) -> dict[str, int]:
    """The size of each dimension name in ``inputs`` (the size sets of the program, and
    the sizes 0 and 1 the harness tries too)."""
    dims = {}
    for input_name, axes in program.dynamic_shapes.items():
        for axis, name in (axes or {}).items():
            dims[name] = int(inputs[input_name].shape[axis])
    return dims


def test_harness_reports_wrong_outputs(monkeypatch):
    program = _first_correct_program()

    def shift(outputs, inputs, dims):
        return torch.utils._pytree.tree_map(
            lambda t: t + 1e-3 if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
            outputs,
        )

    _break_graph(monkeypatch, shift)
    outcome = run_program(program)
    assert outcome.kind == "wrong" and "output" in outcome.message, outcome.report()


def test_harness_reports_writes_into_inputs(monkeypatch):
    program = _first_correct_program()

    def write(outputs, inputs, dims):
        next(iter(inputs.values())).add_(1)
        return outputs

    _break_graph(monkeypatch, write)
    outcome = run_program(program)
    assert outcome.kind == "wrong" and "input after the call" in outcome.message, outcome.report()


def _example_value(program) -> tuple[str, int]:
    """A dimension and its example value (the other size sets give it other values)."""
    return sorted(program.example_dims.items())[0]


def _refusing_other_sizes(expression: str, name: str, value: int):
    """A graph change raising ConstraintViolationError(expression) when ``name != value``."""

    def refuse(outputs, inputs, dims):
        if dims[name] != value:
            raise ConstraintViolationError(expression, dims)
        return outputs

    return refuse


def test_harness_reports_narrowing(monkeypatch):
    program = _first_correct_program()
    name, value = _example_value(program)
    constraint = Constraint(f"{name} == {value}", "value", "", (name,))
    _break_graph(
        monkeypatch, _refusing_other_sizes(constraint.expression, name, value), (constraint,)
    )
    outcome = run_program(program)
    assert outcome.kind == "narrowed", outcome.report()
    assert outcome.category == constraint.expression and outcome.checked == 1


def test_harness_reports_constraints_not_checked_when_the_graph_runs(monkeypatch):
    program = _first_correct_program()
    name, value = _example_value(program)
    constraint = Constraint(f"{name} == {value}", "value", "", (name,))
    _break_graph(monkeypatch, lambda outputs, inputs, dims: outputs, (constraint,))
    outcome = run_program(program)
    assert outcome.kind == "wrong" and "outside its constraint" in outcome.message


def test_harness_reports_refusals_inside_the_constraints(monkeypatch):
    program = _first_correct_program()
    name, value = _example_value(program)
    constraint = Constraint(f"{name} >= 2", "range", "", (name,))
    _break_graph(
        monkeypatch, _refusing_other_sizes(constraint.expression, name, value), (constraint,)
    )
    outcome = run_program(program)
    assert outcome.kind == "wrong" and "inside its constraints" in outcome.message
