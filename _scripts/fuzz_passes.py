"""Differential fuzzer of the rewrite passes: random programs against eager PyTorch.

Each program is captured by CustomTracer (with and without its default passes),
torch.fx.symbolic_trace and torch.export, cleaned by ``yobx.torch.passes`` and compared
with eager on outputs, inputs and buffers after each call, at three sizes, stateful
modules called twice. Usage::

    python _scripts/fuzz_passes.py --count 2000
    python _scripts/fuzz_passes.py --start 120 --count 1 --show   # one program, verbose

Exits with 1 when a pass changed what a program computes (``wrong``), raised
(``pass_error``), or a capture failed for a reason not listed (``capture_unexpected``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "unittests", "torch", "passes"))

import warnings

from passes_fuzz import TOOLS, check_program, summarize

warnings.filterwarnings("ignore")

FAILURES = ("wrong", "pass_error", "capture_unexpected")


def main(argv: list[str] | None = None) -> int:
    """Runs the fuzzer, prints the counts per tool and the failing programs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--show", action="store_true", help="print every program and outcome")
    parser.add_argument("--kinds", nargs="*", default=[], help="also print these outcomes")
    args = parser.parse_args(argv)
    outcomes, failing = [], []
    begin = time.perf_counter()
    for seed in range(args.start, args.start + args.count):
        program, results = check_program(seed, tuple(args.tools))
        outcomes.extend(results)
        bad = [r for r in results if r.kind in FAILURES]
        if bad or args.show or any(r.kind in args.kinds for r in results):
            print(f"--- program {seed} ---\n{program.source()}")
            print(f"    y = {program.aliased or 'linspace'}")
            for r in results:
                print(f"    {r.tool}: {r.kind} {r.detail[:600]}")
        if bad:
            failing.append(seed)
        if (seed - args.start + 1) % 100 == 0:
            print(
                f"[fuzz] {seed - args.start + 1} programs, {time.perf_counter() - begin:.0f}s",
                flush=True,
            )
    counts = summarize(outcomes)
    kinds = sorted({k for c in counts.values() for k in c})
    print(f"{'tool':<16}" + "".join(f"{k:>20}" for k in kinds))
    for tool in args.tools:
        print(f"{tool:<16}" + "".join(f"{counts.get(tool, {}).get(k, 0):>20}" for k in kinds))
    print(f"{args.count} programs in {time.perf_counter() - begin:.0f}s; failing: {failing}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
