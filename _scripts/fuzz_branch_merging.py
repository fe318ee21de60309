"""Random ONNX models with ``If`` nodes whose branches share parts, merged as the export
merges them (:mod:`yobx.torch.onnx.branch_merging`, :mod:`yobx.torch.onnx.filler_slots`,
:mod:`yobx.torch.onnx.if_trees`, :mod:`yobx.torch.onnx.branch_sinking`) and compared
with the model before the merge in onnxruntime, for every pair of conditions and two
sizes.

``python _scripts/fuzz_branch_merging.py --count 2000`` prints how many programs kept
their outputs, how many the merge changed (wrong), how many failed to run after it, how
many merged at least one node, how many ran a tree of ``If`` nodes as one and how many
moved a node into the only branch reading it, and how many moved a node both sides
compute alike out of its ``If``; ``--show`` prints each failing seed's model.
``--hoist-only`` runs only that last rewrite
(:func:`~yobx.torch.onnx.optimize.hoist_branch_twins`) on the branches as generated,
not merged, which share many nodes.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

# the program generator lives with the tests
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from unittests.torch.onnx.branch_program_generator import (
    check_merge,
    generate_branch_program,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--count", type=int, default=500, help="number of programs")
    parser.add_argument("--show", action="store_true", help="print failing programs")
    parser.add_argument(
        "--hoist-only", action="store_true", help="only hoist_branch_twins, no merge"
    )
    options = parser.parse_args()
    import onnx

    counts: collections.Counter = collections.Counter()
    merged = collapsed = sunk = hoisted = 0
    start = time.perf_counter()
    for seed in range(options.start, options.start + options.count):
        try:
            outcome = check_merge(seed, hoist_only=options.hoist_only)
        except Exception as e:
            counts["failed"] += 1
            print(f"seed {seed}: failed: {type(e).__name__}: {str(e)[:300]}")
            if options.show:
                print(onnx.printer.to_text(generate_branch_program(seed)))
            continue
        merged += outcome.merged > 0
        collapsed += outcome.collapsed > 0
        sunk += outcome.sunk > 0
        hoisted += outcome.hoisted > 0
        if outcome.wrong:
            counts["wrong"] += 1
            print(f"seed {seed}: wrong: {outcome.wrong}")
            if options.show:
                print(onnx.printer.to_text(generate_branch_program(seed)))
        else:
            counts["kept"] += 1
    elapsed = time.perf_counter() - start
    print(
        f"{options.count} programs in {elapsed:.0f} s: kept {counts['kept']}, "
        f"wrong {counts['wrong']}, failed {counts['failed']}; merged something in {merged}, "
        f"collapsed a tree in {collapsed}, moved nodes into a branch in {sunk}, "
        f"out of an If in {hoisted}"
    )


if __name__ == "__main__":
    main()
