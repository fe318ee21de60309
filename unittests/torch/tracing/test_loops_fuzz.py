"""Differential test: random loops over a dynamic size (:mod:`.loop_programs`), traced
and compared with eager at six sizes, zero steps included. Refusals are allowed (they
are counted by ``python _scripts/fuzz_loops.py``), wrong values and crashes are not,
and most programs must become scans."""

from __future__ import annotations

import pytest

from .loop_programs import loop_outcomes, traced_outcome

PROGRAMS_PER_BATCH = 15


@pytest.mark.parametrize("seed", [0, 1])
def test_random_loops_match_eager(seed):
    outcomes = loop_outcomes(seed, PROGRAMS_PER_BATCH, traced_outcome)
    failed = [f"{k} {d}\n{s}" for k, d, s in outcomes if k in ("wrong", "crash")]
    assert not failed, "\n\n".join(failed)
    assert sum(k == "correct" for k, _, _ in outcomes) >= PROGRAMS_PER_BATCH // 3
