"""Random traced programs exported to ONNX and compared with eager in onnxruntime.

``python _scripts/fuzz_onnx.py --count 200`` prints the outcome counts
(correct / narrowed / refused / eager_failed / unstable / wrong / crash; unstable: onnxruntime
differs only where eager in float32 differs as much from eager in float64), the most frequent
refusals and narrowings (a size eager runs that the ONNX model refuses, naming the
check), and the seed of each wrong or crashed program as it happens; ``--show-wrong``
prints every wrong program. A crash is an exception out of the comparison itself
(onnxruntime refusing to load the exported model): the run goes on to the next seed.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time

# the program generator and harness live with the tests
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from unittests.torch.onnx.onnx_program_harness import run_onnx_program
from unittests.torch.tracing.program_generator import generate_program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--count", type=int, default=100, help="number of programs")
    parser.add_argument("--show-wrong", action="store_true", help="print wrong programs")
    options = parser.parse_args()
    counts: collections.Counter = collections.Counter()
    refusals: collections.Counter = collections.Counter()
    narrowings: collections.Counter = collections.Counter()
    start = time.perf_counter()
    for seed in range(options.start, options.start + options.count):
        try:
            outcome = run_onnx_program(generate_program(seed))
        except Exception as e:
            counts["crash"] += 1
            print(f"seed {seed}: crash: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        counts[outcome.kind] += 1
        if outcome.kind == "wrong":
            print(f"seed {seed}: wrong: {outcome.message[:300]}", flush=True)
        if outcome.kind == "refused":
            # file names and numbers differ between programs: the kind of refusal stays
            refusals[re.sub(r"/\S+:\d+|\d+", "#", outcome.message)[:140]] += 1
        if outcome.kind == "narrowed":
            narrowings[re.sub(r"/\S+:\d+", "#", outcome.message)[:140]] += 1
        if outcome.kind == "wrong" and options.show_wrong:
            print(outcome.report(), end="\n\n")
    elapsed = time.perf_counter() - start
    print(
        f"{options.count} programs in {elapsed:.1f} s: "
        + ", ".join(
            f"{kind} {counts[kind]}"
            for kind in (
                "correct",
                "narrowed",
                "refused",
                "eager_failed",
                "unstable",
                "wrong",
                "crash",
            )
        )
    )
    for message, count in refusals.most_common():
        print(f"  {count:4d}  {message}")
    if narrowings:
        print("narrowings:")
    for message, count in narrowings.most_common():
        print(f"  {count:4d}  {message}")


if __name__ == "__main__":
    main()
