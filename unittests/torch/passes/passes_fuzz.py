"""Differential check of the rewrite passes on random programs.

Each program (:mod:`passes_fuzz_programs`) is captured by each tool, the capture is run
as it is (*baseline*), then cleaned by the default passes and run again. Both runs are
compared with eager PyTorch on the outputs, on the inputs after the call and on the
buffers after the call, at every size of :data:`SIZES`, calling stateful modules twice.

Outcome per program and tool:

* ``correct``: the passes rewrote everything and the result behaves like eager;
* ``refused``: a pass left nodes in place (with a reason) and the result behaves like
  eager;
* ``wrong``: the result differs from eager although the baseline did not: a pass bug;
* ``pass_error``: a pass raised;
* ``capture_failed``: the tool could not capture the program, for a listed reason;
* ``capture_unexpected``: the tool failed for a reason not listed;
* ``capture_wrong``: the baseline already differs from eager (the tool's own bug);
* ``skipped``: the tool cannot be checked on this program, for a listed reason.
"""

from __future__ import annotations

import copy
import re
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from passes_fuzz_programs import SIZES, Program, generate

from yobx.torch.passes import WRITE_BACK_KEY, run_default_passes
from yobx.torch.passes.aliasing import writes

TOOLS = ("tracer", "tracer_default", "symbolic_trace", "export")

#: Capture failures which are limits of the tools, not of the passes.
ALLOWED_CAPTURE_FAILURES = {
    "symbolic_trace": (
        r"'Proxy' object does not support item assignment",
        r"Proxy object cannot be iterated",
        r"symbolically traced variables cannot be used as inputs to control flow",
        r"only integer tensors of a single element can be converted to an index",
        r"'Attribute' object does not support item assignment",
        r"descriptor '\w+' for 'torch._C.TensorBase' objects doesn't apply to a '\w+'",
    ),
    "export": (
        # torch.export refuses some writes into views of its inputs
        r"cannot mutate tensors with frozen storage",
        r"Cannot (?:set|access) .*(?:storage|data)",
        r"as_strided",
        r"Could not guard on data-dependent expression",
        # functionalization refuses writes into expanded tensors which eager accepts
        r"more than one element of the written-to tensor refers to a single memory location",
    ),
    "tracer": (
        # unbind of a dynamic dimension: one output per index (SpecializationError)
        r"makes dimension '\w+' always \d+",
        # torch's meta function of lerp_ cannot broadcast symbolic sizes
        r"failed on fake tensors with RuntimeError: .*SymIntArrayRef expected to contain only",
        # x[mask] = tensor: the number of selected elements is data-dependent
        r"Could not guard on data-dependent expression",
    ),
}
ALLOWED_CAPTURE_FAILURES["tracer_default"] = ALLOWED_CAPTURE_FAILURES["tracer"]


@dataclass
class Outcome:
    """The result of one tool on one program."""

    tool: str
    kind: str
    detail: str = ""


def _same(expected: Any, got: Any) -> str:
    """Empty when equal (structure, values, NaNs), else a description of the difference."""
    flat_e, spec_e = pytree.tree_flatten(expected)
    flat_g, spec_g = pytree.tree_flatten(got)
    if spec_e != spec_g:
        return f"structure {spec_e} != {spec_g}"
    for i, (e, g) in enumerate(zip(flat_e, flat_g)):
        if isinstance(e, torch.Tensor):
            if not isinstance(g, torch.Tensor) or e.shape != g.shape or e.dtype != g.dtype:
                return f"leaf {i}: {_summary(e)} != {_summary(g)}"
            if not torch.equal(torch.nan_to_num(e, 7.5), torch.nan_to_num(g, 7.5)):
                return f"leaf {i}: values differ by {(e - g).abs().max().item()}"
        elif e != g:
            return f"leaf {i}: {e!r} != {g!r}"
    return ""


def _summary(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{tuple(value.shape)}"
    return type(value).__name__


def _compare_at(program: Program, make_runner, rows: int) -> str:
    """Compares a captured module with eager at one size, calls repeated: empty when
    equal, else ``"raises: ..."`` or ``"differs: ..."``."""
    initial = dict(program.build().named_buffers())
    eager = program.build()
    try:
        runner = make_runner()
    except Exception as e:
        return f"raises: {type(e).__name__}: {str(e)[:300]}"
    for call in range(program.calls()):
        expected = program.run_eager(eager, rows)
        try:
            got = runner(rows)
        except Exception as e:
            return f"raises: call {call + 1}: {type(e).__name__}: {str(e)[:300]}"
        for what, e, g in zip(("outputs", "inputs", "buffers"), expected, got):
            if what == "buffers":
                # a graph keeps the buffers it uses: the others keep their value
                g = {k: g.get(k, initial[k]) for k in sorted(e)}
                e = {k: e[k] for k in sorted(e)}
            difference = _same(e, g)
            if difference:
                return f"differs: call {call + 1} {what}: {difference}"
    return ""


def _compare(program: Program, make_runner) -> dict[int, str]:
    return {rows: _compare_at(program, make_runner, rows) for rows in SIZES}


def _graph_runner(program: Program, gm: torch.nn.Module):
    def make():
        module = copy.deepcopy(gm)
        # a graph module keeps the buffers its graph uses: give it every buffer of a
        # fresh model, so that buffers sharing storage keep sharing it; the versions of
        # a capture (graph modules inside it) read the same buffers
        fresh = dict(program.build().named_buffers())
        for path, _ in list(module.named_buffers(remove_duplicate=False)):
            original = re.sub(r"^((version|choice)_\d+\.)+", "", path)
            owner, _, name = path.rpartition(".")
            if original != path and original in fresh:
                module.get_submodule(owner).register_buffer(name, fresh[original])
        for name, tensor in fresh.items():
            module.register_buffer(name, tensor)

        def run(rows):
            args = program.inputs(rows)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = module(*args)
            return out, args, {k: v.clone() for k, v in module.named_buffers()}

        return run

    return make


def _capture(tool: str, program: Program) -> Any:
    model = program.build()
    args = program.inputs(SIZES[0])
    if tool == "symbolic_trace":
        return torch.fx.symbolic_trace(model)
    if tool == "export":
        # AUTO: a program whose code fixes the number of rows is captured static
        dims = ({0: torch.export.Dim.AUTO}, None)
        return torch.export.export(model, args, dynamic_shapes=dims)
    from yobx.torch.tracing import CustomTracer

    tracer = CustomTracer()
    graph = tracer.trace(
        model,
        concrete_args={"x": args[0], "y": args[1]},
        dynamic_shapes={"x": {0: "rows"}},
        remove_inplace=tool == "tracer_default",
    )
    # the tracer marks the examples sharing storage itself (yobx_storage)
    return torch.fx.GraphModule(tracer.traced_model, graph)


def _exported_runner(program: Program, ep: Any):
    def make():
        module = ep.module()
        module = copy.deepcopy(module)

        def run(rows):
            args = program.inputs(rows)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = module(*args)
            return out, args, {k: v.clone() for k, v in module.named_buffers()}

        return run

    return make


def _allowed(tool: str, error: BaseException) -> bool:
    text = f"{type(error).__name__}: {error}"
    return any(re.search(p, text) for p in ALLOWED_CAPTURE_FAILURES.get(tool, ()))


def _runner(program: Program, tool: str, captured: Any):
    if tool == "export":
        return _exported_runner(program, captured)
    return _graph_runner(program, captured)


def _judge(program: Program, tool: str, after: dict[int, str], refused: list[str]) -> Outcome:
    """Classifies the runs after the passes, capturing again without them if needed."""
    if not any(after.values()):
        return Outcome(tool, "refused", refused[0]) if refused else Outcome(tool, "correct")
    # something differs: was the capture itself already different from eager?
    baseline_tool = "tracer" if tool == "tracer_default" else tool
    baseline = _compare(program, _runner(program, baseline_tool, _capture(baseline_tool, program)))
    for rows in SIZES:
        if not baseline[rows] and after[rows]:
            return Outcome(tool, "wrong", f"rows={rows} {after[rows]}")
    if baseline[SIZES[0]] or any(v.startswith("differs") for v in baseline.values()):
        first = next(f"rows={r} {v}" for r, v in baseline.items() if v)
        return Outcome(tool, "capture_wrong", first)
    # a static capture (torch.export specializing the rows) runs at the example only
    return Outcome(tool, "refused", refused[0]) if refused else Outcome(tool, "correct")


def check_tool(program: Program, tool: str) -> Outcome:
    """Captures one program with one tool, cleans it and compares it with eager."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            captured = _capture(tool, program)
    except Exception as e:
        kind = "capture_failed" if _allowed(tool, e) else "capture_unexpected"
        return Outcome(tool, kind, f"{type(e).__name__}: {str(e)[:300]}")
    if tool == "tracer_default":
        # the tracer ran the default passes itself
        graph = captured.graph
        refused = [n.name for n in graph.nodes if writes(n) and not n.meta.get(WRITE_BACK_KEY)]
        refused = [f"left in place: {refused}"] if refused else []
    else:
        try:
            refused = _run_passes(tool, captured)
        except Exception:
            return Outcome(tool, "pass_error", traceback.format_exc()[-2000:])
    return _judge(program, tool, _compare(program, _runner(program, tool, captured)), refused)


def _run_passes(tool: str, captured: Any) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if tool == "export":
            results = run_default_passes(
                captured.graph_module.graph, mutations="outputs", exported_program=captured
            )
        else:
            results = run_default_passes(captured.graph)
    captured_graph = captured.graph_module.graph if tool == "export" else captured.graph
    captured_graph.lint()
    return [r.reason for result in results.values() for r in result.refused]


def check_program(seed: int, tools: tuple[str, ...] = TOOLS) -> tuple[Program, list[Outcome]]:
    """Generates program ``seed`` and checks it with every tool."""
    program = generate(seed)
    return program, [check_tool(program, tool) for tool in tools]


def summarize(outcomes: list[Outcome]) -> dict[str, Counter]:
    """Counts outcomes per tool."""
    counts: dict[str, Counter] = {}
    for outcome in outcomes:
        counts.setdefault(outcome.tool, Counter())[outcome.kind] += 1
    return counts
