"""Interrupts a trace at many points and checks that nothing is left behind.

A ``KeyboardInterrupt`` is raised at the n-th Python call inside
``CustomTracer.trace`` (see ``unittests/torch/tracing/interrupt_sweep.py``), for points
spread over the whole trace and over the exits (``__exit__``, restorations); after
each, the patched attributes, dispatch and function modes, dispatch keys, grad mode,
torch.fx's state, the tracing lock and the user's module must be as before::

    python _scripts/sweep_interrupts.py --regular 1000 --exits 300
    python _scripts/sweep_interrupts.py --every 1          # every call (hours)

Prints the points that left something, and a summary; exits with 1 if any did.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch

from unittests.torch.tracing import interrupt_sweep


def main(argv: list[str] | None = None) -> int:
    """Runs the sweep; returns the number of failing points (as the exit code, capped)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regular", type=int, default=500, help="points spread evenly")
    parser.add_argument("--exits", type=int, default=200, help="points in exits")
    parser.add_argument("--every", type=int, default=0, help="every n-th call instead")
    parser.add_argument("--check-shape-rules", action="store_true", default=True)
    args = parser.parse_args(argv)
    if args.check_shape_rules:
        # as the test suite: fake mode entered for every operation
        os.environ.setdefault("YOBX_CHECK_SHAPE_RULES", "1")
    warnings.filterwarnings("ignore")
    model, inputs, dynamic_shapes = interrupt_sweep.example()

    def trace():
        return interrupt_sweep.trace(model, inputs, dynamic_shapes)

    trace()
    recorder = interrupt_sweep.Interrupter(record=True)
    assert interrupt_sweep.run_interrupted(trace, recorder) is None
    codes = recorder.codes
    if args.every:
        points = list(range(1, len(codes) + 1, args.every))
    else:
        points = interrupt_sweep.choose_points(codes, args.regular, args.exits)
    print(f"{len(codes)} Python calls in one trace, {len(points)} interrupt points", flush=True)
    start = time.perf_counter()
    failures = completed = wrapped = 0
    for count, at in enumerate(points, 1):
        before = interrupt_sweep.snapshot(model)
        interrupter = interrupt_sweep.Interrupter(at)
        error = interrupt_sweep.run_interrupted(trace, interrupter)
        problems = interrupt_sweep.leftovers(before, model)
        if error is None:
            completed += 1
        elif not isinstance(error, KeyboardInterrupt):
            wrapped += 1
        if problems or not (error is None or interrupt_sweep.is_interrupt(error)):
            failures += 1
            print(f"call {at} ({interrupter.where}): {error!r:.200} {problems}", flush=True)
        if count % 100 == 0:
            print(f"  {count}/{len(points)} in {time.perf_counter() - start:.0f}s", flush=True)
    x = torch.randn(6, 4)
    reference = interrupt_sweep.SweepModel()
    reference.load_state_dict(model.state_dict())
    torch.testing.assert_close(trace()(x), reference(x))
    print(
        f"{len(points)} points in {time.perf_counter() - start:.0f}s: {failures} left something, "
        f"{completed} completed (interrupt swallowed by a finalizer), {wrapped} surfaced "
        f"wrapped by torch (RuntimeError/TraceError naming the interrupt)"
    )
    return min(failures, 1)


if __name__ == "__main__":
    sys.exit(main())
