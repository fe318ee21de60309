"""Differential fuzzing of loops over a dynamic size: the tracer's scans against eager.

The programs and their comparisons with eager are those of
``unittests/torch/tracing/loop_programs.py``: one to three states carried through a
loop over the input's first dimension ``n`` (``range(n)``, ``range(1, n)``,
``range(n - 1)``, ``reversed(range(n))``, ``x.unbind(0)``), traced from ``n = 4`` and
compared with eager at ``n`` = 4, 0, 1, 2, 3 and 6, on the outputs and on the input
after the call. Outcomes: ``correct``, ``refused`` (a clear error while tracing),
``wrong`` and ``crash`` (both printed in full, with the program). With ``--onnx``, each
program is also exported with :func:`yobx.torch.onnx.to_onnx` and run in onnxruntime
at the same sizes::

    python _scripts/fuzz_loops.py [--count 200] [--seed 0] [--onnx]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from unittests.torch.tracing.loop_programs import exported_outcome, loop_program, traced_outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200, help="number of programs")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--onnx", action="store_true", help="also export to ONNX")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rng = random.Random(args.seed)
    paths = {"trace": traced_outcome, **({"onnx": exported_outcome} if args.onnx else {})}
    counts = {p: dict.fromkeys(("correct", "refused", "wrong", "crash"), 0) for p in paths}
    for index in range(args.count):
        cls, source = loop_program(rng)
        torch.manual_seed(index)
        for path, check in paths.items():
            kind, detail = check(cls())
            counts[path][kind] += 1
            if kind in ("wrong", "crash"):
                print(f"{kind.upper()} ({path}, program {index}) {detail}\n{source}", flush=True)
    for path, count in counts.items():
        summary = ", ".join(f"{k} {v}" for k, v in count.items())
        print(f"{args.count} programs, {path}: {summary}")
    failed = any(c["wrong"] or c["crash"] for c in counts.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
