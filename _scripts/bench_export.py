"""Benchmark: yobx.torch.to_onnx against torch.onnx.export(dynamo=True).

Exports every test model with both exporters (dynamic shapes), validates both with
onnxruntime against eager PyTorch on the example inputs, and prints per model:
success, max absolute error, median export time and the ratio yobx / torch.onnx.
The two exporters alternate, export after export, so that the machine's slow phases
weigh on both. Garbage is collected before each timed export: a full collection
(a few hundred ms in a process holding torch, transformers and onnxscript) otherwise
lands on whichever export happens to cross the collector's threshold, often one of a
tiny model's after a large model's export.

    python _scripts/bench_export.py [--repeat 3] [--models tiny-llm,hf:BertModel] [--times]

To compare with an older commit under the same method, run this script on its code:
``git worktree add /tmp/ref <commit> && cd /tmp/ref && PYTHONPATH=$PWD python
<this checkout>/_scripts/bench_export.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import logging
import statistics
import sys
import time
import warnings

import torch

from yobx.models import load_model
from yobx.torch.onnx import to_onnx, validate

MODELS = [
    "tiny-llm",
    "tiny-cnn",
    "tiny-lstm",
    "tiny-gru",
    "transformer-encoder",
    "hf:LlamaForCausalLM",
    "hf:GPT2LMHeadModel",
    "hf:BertModel",
]


def _yobx(model, args, kwargs, dynamic_shapes):
    return to_onnx(model, args, kwargs, dynamic_shapes=dynamic_shapes).model_proto


def _torch_onnx(model, args, kwargs, dynamic_shapes):
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, dynamo=True
        )
    return program.model_proto


def _measure(name: str, repeat: int, show_times: bool = False) -> dict[str, dict]:
    """Exports ``name`` ``repeat`` times with each exporter, alternating them.

    Alternating keeps a slow phase of the machine from penalizing one exporter only.
    """
    exporters = {"yobx": _yobx, "torch.onnx": _torch_onnx}
    state = {who: {"times": [], "proto": None, "error": None} for who in exporters}
    for _ in range(repeat):
        for who, exporter in exporters.items():
            current = state[who]
            if current["error"] is not None:
                continue
            model, args, kwargs, dynamic_shapes = load_model(name)
            gc.collect()
            start = time.perf_counter()
            try:
                current["proto"] = exporter(model, args, kwargs, dynamic_shapes)
            except Exception as exc:
                message = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ""
                current["error"] = f"{type(exc).__name__}: {message}"
                continue
            current["times"].append(time.perf_counter() - start)
    if show_times:
        times = {who: [round(t, 3) for t in current["times"]] for who, current in state.items()}
        print(f"{name}: seconds per export {times}", flush=True)
    return {who: _validated(name, current) for who, current in state.items()}


def _validated(name: str, current: dict) -> dict:
    result = {"ok": False, "error": current["error"], "time": None, "max_abs": None}
    if current["error"] is not None:
        return result
    result["time"] = statistics.median(current["times"])
    model, args, kwargs, _ = load_model(name)
    report = validate(model, current["proto"], [(args, kwargs)])
    result["ok"] = report.ok
    result["max_abs"] = report.max_abs_error
    if not report.ok:
        result["error"] = report.format().splitlines()[0][:120]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="exports per model")
    parser.add_argument("--models", default=",".join(MODELS), help="comma separated")
    parser.add_argument(
        "--times", action="store_true", help="print every export's time, not only the median"
    )
    options = parser.parse_args(argv)
    # torch.onnx logs a warning per missing torchvision operator at every export
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    names = options.models.split(",")
    # Warm up both exporters once (imports, registries) so medians compare steady states.
    warm = load_model("tiny-cnn")
    with contextlib.suppress(Exception):
        _yobx(*warm)
    with contextlib.suppress(Exception):
        _torch_onnx(*load_model("tiny-cnn"))

    columns = f"{'err':>9} {'time s':>7}"
    header = f"{'model':<22} {'yobx':>6} {columns} | {'torch':>6} {columns} | {'ratio':>6}"
    print(header)
    print("-" * len(header))
    all_ok = True
    ratios = []
    failures = []
    for name in names:
        measured = _measure(name, options.repeat, options.times)
        ours, theirs = measured["yobx"], measured["torch.onnx"]

        def cell(r):
            status = "ok" if r["ok"] else "FAIL"
            err = f"{r['max_abs']:.2e}" if r["max_abs"] is not None else "-"
            t = f"{r['time']:.2f}" if r["time"] is not None else "-"
            return f"{status:>6} {err:>9} {t:>7}"

        ratio = "-"
        if ours["time"] is not None and theirs["time"] is not None:
            value = ours["time"] / theirs["time"]
            ratios.append(value)
            ratio = f"{value:.2f}"
        print(f"{name:<22} {cell(ours)} | {cell(theirs)} | {ratio:>6}", flush=True)
        all_ok &= ours["ok"]
        for who, r in (("yobx", ours), ("torch.onnx", theirs)):
            if r["error"]:
                failures.append(f"  {name} [{who}]: {r['error']}")
    if ratios:
        print(
            f"ratio yobx / torch.onnx: median {statistics.median(ratios):.2f}, "
            f"max {max(ratios):.2f} (target <= 0.10 for every model, issue 16)"
        )
    if failures:
        print("failures:")
        print("\n".join(failures))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
