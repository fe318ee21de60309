"""Capture time: CustomTracer vs torch.fx.symbolic_trace vs torch.export.export(strict=False).

Prints, per model, the median capture time of each tool (after one warm-up; the tools
alternate call after call so that the machine's slow phases weigh on all of them) and
the ratios yobx/export and yobx/fx measured in the same run::

    python _scripts/bench_tracing.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
import warnings

import torch

from yobx.models import load_model
from yobx.models.architectures import build
from yobx.torch.tracing import CustomTracer

#: the demo models of ``yobx.models`` (the same ones as ``bench_export.py``), and two
#: architecture cases of ``yobx.models.architectures`` (``arch:<name>``): a vision
#: transformer and an encoder-decoder
MODELS = (
    "hf:LlamaForCausalLM",
    "hf:GPT2LMHeadModel",
    "hf:BertModel",
    "transformer-encoder",
    "tiny-cnn",
    "arch:vit",
    "arch:t5",
)


def models(names=MODELS):
    """Yields (name, model, example kwargs, dynamic shapes) for every benchmarked model."""
    for name in names:
        if name.startswith("arch:"):
            case = build(name[len("arch:") :])
            model, args, kwargs, dynamic_shapes = (
                case.model,
                case.args,
                case.kwargs,
                case.dynamic_shapes,
            )
        else:
            model, args, kwargs, dynamic_shapes = load_model(name)
        names = list(inspect.signature(model.forward).parameters)
        kwargs = {**dict(zip(names, args)), **kwargs}
        yield name, model, kwargs, dynamic_shapes


def _as_dims(dynamic_shapes, kwargs):
    """torch.export's dynamic shapes: every named dimension ``Dim.DYNAMIC`` (torch
    infers the relations and ranges), every input without a spec ``None``."""

    def convert(spec):
        if isinstance(spec, str):
            return torch.export.Dim.DYNAMIC
        if isinstance(spec, dict):
            return {k: convert(v) for k, v in spec.items()}
        if isinstance(spec, (list, tuple)):
            return type(spec)(convert(v) for v in spec)
        return spec

    return {k: convert(dynamic_shapes.get(k)) for k in kwargs}


def _median_times(functions: dict, repeat: int) -> dict:
    """Median time per tool; the tools alternate, call after call (one warm-up each).

    Alternating keeps a slow phase of the machine from penalizing one tool only. A tool
    that cannot capture the model is reported, not timed.
    """
    times: dict = {}
    for name, fn in functions.items():
        try:
            fn()
            times[name] = []
        except Exception as e:
            times[name] = f"fails: {type(e).__name__}"
    for _ in range(repeat):
        for name, fn in functions.items():
            if isinstance(times[name], list):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) if isinstance(v, list) else v for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(
        f"{'model':22s} {'yobx (s)':>10s} {'fx (s)':>10s} {'export (s)':>11s} "
        f"{'yobx/export':>12s} {'yobx/fx':>8s}"
    )
    for name, model, kwargs, dyn in models(args.models.split(",")):
        measured = _median_times(
            {
                "yobx": lambda model=model, kwargs=kwargs, dyn=dyn: CustomTracer().trace(
                    model, concrete_args=kwargs, dynamic_shapes=dyn
                ),
                "fx": lambda model=model: torch.fx.symbolic_trace(model),
                "export": lambda model=model, kwargs=kwargs, dyn=dyn: torch.export.export(
                    model, (), kwargs, dynamic_shapes=_as_dims(dyn, kwargs), strict=False
                ),
            },
            args.repeat,
        )
        yobx, fx, export = measured["yobx"], measured["fx"], measured["export"]

        def cell(v):
            return f"{v:10.4f}" if isinstance(v, float) else f"{v[:10]:>10s}"

        ratio_export = (
            f"{yobx / export:12.3f}"
            if isinstance(yobx, float) and isinstance(export, float)
            else f"{'-':>12s}"
        )
        ratio_fx = (
            f"{yobx / fx:8.2f}"
            if isinstance(yobx, float) and isinstance(fx, float)
            else f"{'-':>8s}"
        )
        print(
            f"{name:22s} {cell(yobx)} {cell(fx)} {cell(export):>11s} {ratio_export} {ratio_fx}",
            flush=True,
        )


if __name__ == "__main__":
    main()
