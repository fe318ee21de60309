"""Coverage of real architectures: CustomTracer against torch.export, dynamic shapes.

For each case of :mod:`yobx.models.architectures` (tiny configurations, random weights):

- export: ``torch.export.export(model, args, kwargs, dynamic_shapes=<every name mapped
  to Dim.DYNAMIC>, strict=False)``, then ``ep.module()`` against eager on the example
  and at the case's other sizes;
- yobx: ``CustomTracer().trace(model, concrete_args=<inputs by name>,
  dynamic_shapes=<string names>)``, then ``GraphModule(tracer.traced_model, graph)``
  against eager on the same inputs.

The details list, per architecture, yobx's remaining constraints, its versions with
their conditions (``cstr`` and ``vers`` columns: how many) and why decisions stayed
constraints. Statuses: ``ok``; ``refused`` (yobx raised TraceError); ``fail`` (the capture raised
anything else); ``wrong`` (a result differs from eager); ``outside`` (the captured
program refused another size through its runtime checks: ConstraintViolationError for
yobx, an input guard for export; the sizes are outside the constraints, not wrong);
``error`` (the captured program raised something else at another size). For every
refusal, ``--specialize`` (default on) traces again with
``CustomTracer(specialize_undecidable=True)`` and lists every decision the tracer could
not prove, with its location: the full list of facts to adopt, not only the first::

    python _scripts/coverage_architectures.py [--only NAME ...] [--family FAMILY]
        [--json out.json] [--no-export] [--no-specialize]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import sys
import time
import traceback
import warnings
from typing import Any

import torch
import torch.utils._pytree as pytree

from yobx.models.architectures import ARCHITECTURES, FAMILIES, build
from yobx.models.architectures.base import named_axes
from yobx.torch.tracing import ConstraintViolationError, CustomTracer, register_cache_flattening

ATOL = RTOL = 1e-4
#: adopted facts printed per case
MAX_FACTS = 12


@dataclasses.dataclass
class ToolResult:
    """The outcome of one capture tool on one case."""

    status: str = "-"
    seconds: float = 0.0
    error: str = ""
    location: str = ""
    max_abs_error: float = 0.0
    constraints: list[str] | None = None
    #: yobx's versions (each with its conditions) and why decisions stayed constraints
    versions: list[str] = dataclasses.field(default_factory=list)
    guards: list[str] = dataclasses.field(default_factory=list)
    specialized: list[str] = dataclasses.field(default_factory=list)
    specialized_status: str = ""
    stress: list[str] = dataclasses.field(default_factory=list)


# inputs and outputs


def clone(value: Any) -> Any:
    """Deep copy of the tensors of nested inputs (a DynamicCache is rebuilt: models
    append to it)."""
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, value)


def export_dims(dynamic_shapes: Any, kwargs: dict) -> dict:
    """The same dynamic shapes with every string name replaced by Dim.DYNAMIC, and
    None for inputs without dynamic dimensions (torch.export wants every name)."""
    dims = pytree.tree_map(
        lambda v: torch.export.Dim.DYNAMIC if isinstance(v, str) else v, dynamic_shapes
    )
    return {name: dims.get(name) for name in kwargs}


def max_difference(expected: Any, got: Any) -> float:
    """Largest absolute difference beyond tolerance (inf when structures differ)."""
    flat_expected, flat_got = pytree.tree_leaves(expected), pytree.tree_leaves(got)
    if len(flat_expected) != len(flat_got):
        return float("inf")
    worst = 0.0
    for e, g in zip(flat_expected, flat_got):
        if isinstance(e, torch.Tensor):
            if not isinstance(g, torch.Tensor) or e.shape != g.shape:
                return float("inf")
            if e.numel() == 0:
                continue
            diff = (e.double() - g.double()).abs()
            if not torch.all(diff <= ATOL + RTOL * e.double().abs()):
                worst = max(worst, float(diff.max()))
        elif e != g:
            return float("inf")
    return worst


def _label(case, sizes: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sizes.items() if case.sizes.get(k) != v)


def input_sets(case) -> list[tuple[str, dict]]:
    """The example and the other inputs, as (label, kwargs by name)."""
    sets = [("example", case.kwargs)]
    for sizes, (args, kwargs) in zip(case.other_sizes, case.other_inputs):
        assert not args, "architecture cases pass every input by keyword"
        sets.append((_label(case, sizes), kwargs))
    return sets


def stress_sets(case) -> list[tuple[str, dict]]:
    """Inputs at the stress sizes (eager runs, torch.export refuses them)."""
    return [(_label(case, sizes), case.inputs_at(sizes)) for sizes in case.stress_sizes]


# errors


_INTERNAL = (os.sep + "torch" + os.sep, os.sep + "yobx" + os.sep + "torch" + os.sep)
_LOCATION = re.compile(r"([\w./\\-]+\.py)(?::|\", line |, line )(\d+)")


def first_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0][:400]


def error_location(error: BaseException) -> str:
    """The file:line the message names, else the innermost frame of model code."""
    match = _LOCATION.search(str(error))
    if match:
        return f"{_short(match.group(1))}:{match.group(2)}"
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if not any(part in frame.filename for part in _INTERNAL):
            return f"{_short(frame.filename)}:{frame.lineno}"
    return f"{_short(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


def _short(path: str) -> str:
    for marker in ("site-packages" + os.sep, "wt-arch" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


# the two tools


def run_once(run, kwargs: dict, reference: Any) -> tuple[str, str, str, float]:
    """Runs a captured program once: (status, first error line, location, max error)."""
    try:
        # torch.fx prints the generated code of a failing GraphModule to stderr
        with contextlib.redirect_stderr(io.StringIO()):
            got = run(clone(kwargs))
    except ConstraintViolationError as e:
        return "outside", first_line(e), "", 0.0
    except Exception as e:
        outside = "Expected input" in str(e) or "Guard failed" in str(e)
        return "outside" if outside else "error", first_line(e), error_location(e), 0.0
    diff = max_difference(reference, got)
    if diff:
        return "wrong", f"max abs error {diff:.3g}", "", diff
    return "ok", "", "", 0.0


def compare(result: ToolResult, run, case, expected: list) -> None:
    """Runs a captured program on every input set and sets the status; then on the
    stress sizes, where refusing is fine and only a wrong result is a bug."""
    for (label, kwargs), reference in zip(input_sets(case), expected):
        status, error, location, diff = run_once(run, kwargs, reference)
        if status != "ok":
            result.status, result.error = status, f"[{label}] {error}"
            result.location, result.max_abs_error = location, diff
            return
    result.status = "ok"
    for (label, kwargs), reference in zip(stress_sets(case), expected[len(input_sets(case)) :]):
        status, error, _, _ = run_once(run, kwargs, reference)
        result.stress.append(f"[{label}] {status}" + (f": {error[:160]}" if error else ""))


def run_export(case, expected: list) -> ToolResult:
    result = ToolResult()
    start = time.perf_counter()
    try:
        # torch.export prints the partial graph of a failed export to stderr
        with contextlib.redirect_stderr(io.StringIO()):
            ep = torch.export.export(
                case.model,
                case.args,
                clone(case.kwargs),
                dynamic_shapes=export_dims(case.dynamic_shapes, case.kwargs),
                strict=False,
            )
    except Exception as e:
        result.seconds = time.perf_counter() - start
        result.status, result.error, result.location = "fail", first_line(e), error_location(e)
        return result
    result.seconds = time.perf_counter() - start
    result.constraints = export_facts(ep, case)
    module = ep.module()
    compare(result, lambda kw: module(**kw), case, expected)
    return result


_GUARD_INPUT = re.compile(r"L((?:\[[^\]]+\])+)\.size\(\)\[(\d+)\]")


def export_facts(ep, case) -> list[str]:
    """The guards torch.export adopted (``ep._guards_code``) in the case's dimension
    names, the runtime assertions in its graph and the ranges it inferred."""
    axes = named_axes(case.kwargs, case.dynamic_shapes)

    def rename(match: re.Match) -> str:
        return axes.get(match.group(1), {}).get(int(match.group(2)), match.group(0))

    guards = [_GUARD_INPUT.sub(rename, g) for g in getattr(ep, "_guards_code", None) or []]
    asserts = [
        str(n.args[1]) for n in ep.graph.nodes if n.target is torch.ops.aten._assert_scalar.default
    ]
    ranges = [f"{s} in {r}" for s, r in ep.range_constraints.items() if str(r) != "VR[2, int_oo]"]
    return guards + asserts + ranges


def trace_yobx(case, specialize: bool = False):
    tracer = CustomTracer(specialize_undecidable=specialize)
    graph = tracer.trace(
        case.model, concrete_args=clone(case.kwargs), dynamic_shapes=case.dynamic_shapes
    )
    return tracer, torch.fx.GraphModule(tracer.traced_model, graph)


def run_yobx(case, expected: list, specialize: bool) -> ToolResult:
    result = ToolResult()
    start = time.perf_counter()
    try:
        tracer, gm = trace_yobx(case)
    except Exception as e:
        result.seconds = time.perf_counter() - start
        refused = isinstance(e, torch.fx.proxy.TraceError)
        result.status = "refused" if refused else "fail"
        result.error, result.location = first_line(e), error_location(e)
        if specialize:
            # a fresh model: a refused trace may leave transformers' state behind
            list_undecidable(result, build(case.name), expected)
        return result
    result.seconds = time.perf_counter() - start
    constraints = getattr(tracer, "constraints", None)
    result.constraints = None if constraints is None else [str(c) for c in constraints]
    result.versions = [str(v) for v in tracer.versions] + list(tracer.version_notes)
    result.guards = [
        str(g) for g in tracer.guards if g.reason not in ("bounds", "constant argument")
    ]
    compare(result, lambda kw: gm(**kw), case, expected)
    return result


def list_undecidable(result: ToolResult, case, expected: list) -> None:
    """Traces again adopting every undecidable decision; lists them (deduplicated)."""
    try:
        tracer, gm = trace_yobx(case, specialize=True)
    except Exception as e:
        result.specialized_status = f"fails too: {first_line(e)} @ {error_location(e)}"
        return
    seen = []
    for g in tracer.guards:
        if g.reason == "specialized" and str(g) not in seen:
            seen.append(str(g))
    result.specialized = seen
    check = ToolResult()
    compare(check, lambda kw: gm(**kw), case, expected)
    result.specialized_status = check.status + (f" {check.error}" if check.error else "")
    # without runtime checks, a stress size breaking an adopted fact may be computed wrong
    result.specialized_status += "".join(f"; stress {s}" for s in check.stress)


# one case


def run_case(name: str, do_export: bool, specialize: bool) -> dict:
    record: dict[str, Any] = {"name": name, "family": FAMILIES[name]}
    start = time.perf_counter()
    try:
        case = build(name)
        with torch.no_grad():
            sets = input_sets(case) + stress_sets(case)
            expected = [case.model(**clone(kw)) for _, kw in sets]
    except Exception as e:
        record.update(eager="fail", error=first_line(e), location=error_location(e))
        return record
    record["eager"] = "ok"
    record["build_seconds"] = time.perf_counter() - start
    record["parameters"] = sum(p.numel() for p in case.model.parameters())
    if do_export:
        with torch.no_grad():
            record["export"] = dataclasses.asdict(run_export(build(name), expected))
    with torch.no_grad():
        record["yobx"] = dataclasses.asdict(run_yobx(build(name), expected, specialize))
    return record


# report


def _stress_summary(result: dict) -> str:
    statuses = [s.split("] ", 1)[1].split(":")[0] for s in result.get("stress", [])]
    return "/".join(statuses) or "-"


HEADER = (
    f"{'case':26s} {'family':15s} eager {'export':8s} {'s':>6s} {'stress':15s} "
    f"{'yobx':8s} {'s':>6s} {'stress':15s} cstr vers"
)


def print_row(record: dict) -> None:
    export, yobx = record.get("export") or {}, record.get("yobx") or {}
    n = yobx.get("constraints")
    print(
        f"{record['name']:26s} {record['family']:15s} {record.get('eager', ''):5s} "
        f"{export.get('status', '-'):8s} {export.get('seconds', 0):6.2f} "
        f"{_stress_summary(export):15s} "
        f"{yobx.get('status', '-'):8s} {yobx.get('seconds', 0):6.2f} "
        f"{_stress_summary(yobx):15s} {'-' if n is None else len(n):>4} "
        f"{sum(v.startswith('version ') for v in yobx.get('versions', [])):>4}",
        flush=True,
    )


def print_details(records: list[dict]) -> None:
    print("\n=== details ===")
    for record in records:
        print(f"\n## {record['name']} ({record['family']})")
        if record.get("eager") != "ok":
            print(f"  eager fails: {record.get('error')} @ {record.get('location')}")
            continue
        for tool in ("export", "yobx"):
            r = record.get(tool)
            if not r:
                continue
            print(f"  {tool}: {r['status']} in {r['seconds']:.2f}s")
            if r["error"]:
                print(f"    {r['error']}" + (f"  @ {r['location']}" if r["location"] else ""))
            if r["constraints"] is not None:
                facts = r["constraints"]
                label = "constraints" if tool == "yobx" else "adopted facts"
                print(f"    {label} ({len(facts)}):")
                for c in facts[:MAX_FACTS]:
                    print(f"      {c[:240]}")
                if len(facts) > MAX_FACTS:
                    print(f"      ... and {len(facts) - MAX_FACTS} more")
            if r.get("versions"):
                print("    versions (chosen from the input sizes) and notes:")
                for v in r["versions"]:
                    print(f"      {v[:240]}")
            for s in r["stress"]:
                print(f"    stress {s}")
            for g in r["guards"]:
                print(f"    guard: {g}")
            if r["specialized_status"]:
                print(f"    with specialize_undecidable=True: {r['specialized_status']}")
            for g in r["specialized"]:
                print(f"      undecidable: {g}")


def print_summary(records: list[dict]) -> None:
    print("\n=== counts ===")
    for tool in ("export", "yobx"):
        counts: dict[str, int] = {}
        for record in records:
            status = (record.get(tool) or {}).get("status", "eager-fail")
            counts[status] = counts.get(status, 0) + 1
        print(f"{tool:7s} " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))


def select(only: list[str] | None, family: str | None) -> list[str]:
    names = list(ARCHITECTURES)
    if only:
        unknown = [n for n in only if n not in ARCHITECTURES]
        if unknown:
            raise SystemExit(f"unknown cases {unknown}; known: {names}")
        names = [n for n in names if n in only]
    if family:
        names = [n for n in names if FAMILIES[n] == family]
        if not names:
            raise SystemExit(f"no case in family {family!r}; {sorted(set(FAMILIES.values()))}")
    return names


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", help="case names")
    parser.add_argument("--family", help="one family (vision, audio, text, ...)")
    parser.add_argument("--json", help="write the records to this file")
    parser.add_argument("--no-export", action="store_true", help="skip torch.export")
    parser.add_argument(
        "--no-specialize", action="store_true", help="do not list undecidable decisions"
    )
    options = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    # fake tensors log every failing meta kernel with its stack
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    register_cache_flattening()  # torch.export and the tracer flatten DynamicCache alike
    names = select(options.only, options.family)
    start = time.perf_counter()
    print(HEADER)
    records = []
    for name in names:
        record = run_case(name, not options.no_export, not options.no_specialize)
        records.append(record)
        print_row(record)
    print_details(records)
    print_summary(records)
    print(f"total time {time.perf_counter() - start:.1f}s for {len(records)} cases")
    if options.json:
        with open(options.json, "w") as f:
            json.dump(records, f, indent=1, default=str)
    return records


if __name__ == "__main__":
    main(sys.argv[1:])
