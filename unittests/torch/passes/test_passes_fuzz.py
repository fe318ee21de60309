"""Differential fuzzing of the rewrite passes (see passes_fuzz.py): random programs with
views of every kind, in-place ops, item assignment, input and buffer mutation and
aliased inputs, captured by CustomTracer, torch.fx.symbolic_trace and torch.export,
cleaned by the default passes and compared with eager on outputs, inputs and buffers.

``_scripts/fuzz_passes.py --count 2000`` runs more programs.
"""

from __future__ import annotations

import warnings

import pytest
from passes_fuzz import check_program, summarize

FAILURES = ("wrong", "pass_error", "capture_unexpected")


def _run(seeds: range, tools: tuple[str, ...]) -> dict:
    outcomes, failures = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in seeds:
            program, results = check_program(seed, tools)
            outcomes.extend(results)
            failures.extend(
                f"program {seed} ({r.tool}: {r.kind}) {r.detail[:800]}\n{program.source()}"
                f"\n    y = {program.aliased or 'linspace'}"
                for r in results
                if r.kind in FAILURES
            )
    counts = summarize(outcomes)
    assert not failures, "\n\n".join(failures)
    return counts


def _checked(counts, tool) -> int:
    """Programs on which the passes ran and their result was compared with eager."""
    return counts[tool]["correct"] + counts[tool]["refused"]


@pytest.mark.parametrize("start", [0, 60])
def test_fuzz_tracer_and_symbolic_trace(start):
    counts = _run(range(start, start + 60), ("tracer", "symbolic_trace"))
    # most programs must be checked, not skipped: a capture failure is only allowed for
    # the listed reasons, and each program counts
    assert _checked(counts, "tracer") >= 40, counts
    assert counts["tracer"]["correct"] >= 25, counts
    assert _checked(counts, "symbolic_trace") >= 15, counts


def test_fuzz_export():
    counts = _run(range(1000, 1025), ("export",))
    assert _checked(counts, "export") >= 22, counts
    assert counts["export"]["correct"] >= 10, counts


def test_fuzz_tracer_default_passes():
    counts = _run(range(2000, 2025), ("tracer_default",))
    assert _checked(counts, "tracer_default") >= 10, counts
