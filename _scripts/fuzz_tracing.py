"""Differential fuzzing of CustomTracer with random shape-dependent programs.

Generates ``--count`` programs from seeds ``--seed``, ``--seed + 1``..., traces each with
string dimension names, compares the graph with eager at three sizes and at sizes of 1
and 0, and prints the counts per outcome (correct / refused / narrowed / wrong /
edge_raised / eager_failed), per refusal category and per narrowing constraint, the
programs whose graph raised at sizes 1 or 0, every ``wrong`` program in full, and with
``--show-refused`` the smallest reproducer of each refusal category (shrunk with
``--shrink``; compared with ``torch.export.export(dynamic_shapes=Dim.DYNAMIC)`` with
``--export``)::

    python _scripts/fuzz_tracing.py --count 2000 --seed 0 --show-refused --shrink --export
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

os.environ.setdefault("YOBX_CHECK_SHAPE_RULES", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from unittests.torch.tracing.program_generator import (
    generate_program,
    shrink_program,
)
from unittests.torch.tracing.program_harness import OUTCOMES, run_program
from unittests.torch.tracing.test_tracing_fuzz import ALLOWED_REFUSALS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500, help="number of programs")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--sizes", type=int, default=3, help="size sets compared with eager")
    parser.add_argument("--show-refused", action="store_true", help="print reproducers")
    parser.add_argument("--shrink", action="store_true", help="shrink the reproducers")
    parser.add_argument("--export", action="store_true", help="run torch.export on them")
    args = parser.parse_args(argv)

    begin = time.perf_counter()
    outcomes = collections.Counter()
    refusals: dict[str, list] = collections.defaultdict(list)
    narrowings: dict[str, list] = collections.defaultdict(list)
    wrong, edges = [], []
    checked = skipped = 0
    for seed in range(args.seed, args.seed + args.count):
        outcome = run_program(generate_program(seed, other_sizes=args.sizes - 1), args.sizes)
        outcomes[outcome.kind] += 1
        checked, skipped = checked + outcome.checked, skipped + outcome.skipped
        if outcome.kind == "refused":
            refusals[outcome.category].append(outcome)
        elif outcome.kind == "narrowed":
            narrowings[outcome.category].append(outcome)
        elif outcome.kind == "wrong":
            wrong.append(outcome)
        elif outcome.kind == "edge_raised":
            edges.append(outcome)
    elapsed = time.perf_counter() - begin

    print(
        f"{args.count} programs (seeds {args.seed}..{args.seed + args.count - 1}) in {elapsed:.1f}s"
    )
    for kind in OUTCOMES:
        print(f"  {kind:13s} {outcomes[kind]:6d}")
    print(f"size sets compared with eager: {checked}, skipped (eager raised): {skipped}")
    title = "refusal categories (reason@operator or idiom, kinds of fact)"
    _print_groups(title, refusals, fact=True)
    _print_groups("narrowing constraints", narrowings)
    if edges:
        print("\nraised at sizes 0 or 1 (outside the default range, eager runs there):")
        for outcome in edges:
            print(f"  seed {outcome.program.seed:4d}  {outcome.message}")
    for outcome in wrong:
        print(f"\n==== WRONG (seed {outcome.program.seed})\n{outcome.report()}")
    if args.show_refused:
        for category, group in sorted(refusals.items(), key=lambda kv: -len(kv[1])):
            _print_reproducer(category, group, args)
    return 1 if wrong else 0


def _print_groups(title: str, groups: dict[str, list], fact: bool = False) -> None:
    if not groups:
        return
    print(f"\n{title}:")
    for name, group in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        facts = collections.Counter(o.fact for o in group)
        suffix = f"  [{', '.join(f'{k}: {v}' for k, v in facts.most_common())}]" if fact else ""
        if fact and name not in ALLOWED_REFUSALS:
            suffix += "  NOT IN THE TEST'S ALLOW-LIST"
        print(f"  {len(group):6d}  {name}{suffix}")


def _print_reproducer(category: str, group: list, args) -> None:
    smallest = min(group, key=lambda o: (len(o.program.source), o.program.seed))
    program = smallest.program
    if args.shrink:
        program = shrink_program(program, lambda p: run_program(p, args.sizes).category == category)
    outcome = run_program(program, args.sizes)
    print(f"\n==== {category} ({len(group)} programs), smallest: seed {program.seed}")
    print(f"# {outcome.message}")
    print(program.describe())
    if args.export:
        exported = run_program(program, args.sizes, tool="export")
        print(f"# torch.export (Dim.DYNAMIC): {exported.kind} {exported.message}")
        for constraint in exported.constraints:
            print(f"#   range constraint {constraint}")


if __name__ == "__main__":
    sys.exit(main())
