"""Capture time: CustomTracer vs torch.fx.symbolic_trace vs torch.export.export(strict=False).

Prints the warm capture time of two small models (under 20 nodes) against the 5 ms
target, then, per model, the median capture time of each tool (after one warm-up; the
tools alternate call after call so that the machine's slow phases weigh on all of them)
and the ratios yobx/export and yobx/fx measured in the same run.

The small models go first, in a process that holds no large model yet: after the
large ones (about a million live objects), the small captures of every tool, fx's
included, vary up to twofold from run to run with the state of the process's heap::

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
#: transformer and an encoder-decoder. ``+sdpa``: the model with transformers' default
#: attention (torch's scaled_dot_product_attention) instead of the eager one
MODELS = (
    "hf:LlamaForCausalLM",
    "hf:LlamaForCausalLM+sdpa",
    "hf:GPT2LMHeadModel",
    "hf:BertModel",
    "transformer-encoder",
    "tiny-cnn",
    "arch:vit",
    "arch:t5",
)


class SmallAttention(torch.nn.Module):
    """A small attention pattern: one projection to q, k, v, scores, softmax, output."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / 4.0
        return self.out(scores.softmax(-1) @ v)


#: small models (under 20 nodes once traced): name -> (model, kwargs, dynamic shapes)
SMALL_MODELS = {
    "small-attention": lambda: (
        SmallAttention(),
        {"x": torch.randn(2, 5, 16)},
        {"x": {0: "batch", 1: "seq"}},
    ),
    "small-mlp": lambda: (
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)),
        {"input": torch.randn(2, 16)},
        {"input": {0: "batch"}},
    ),
}

#: a small model's warm capture (seconds) the tracer aims at
SMALL_TARGET = 0.005


def models(names=MODELS):
    """Yields (name, model, example kwargs, dynamic shapes) for every benchmarked model."""
    for name in names:
        source, _, attention = name.partition("+")
        if source.startswith("arch:"):
            case = build(source[len("arch:") :])
            model, args, kwargs, dynamic_shapes = (
                case.model,
                case.args,
                case.kwargs,
                case.dynamic_shapes,
            )
        else:
            model, args, kwargs, dynamic_shapes = load_model(source)
        if attention:
            for module in model.modules():
                if getattr(module, "config", None) is not None:
                    module.config._attn_implementation = attention
        parameters = list(inspect.signature(model.forward).parameters)
        kwargs = {**dict(zip(parameters, args)), **kwargs}
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
    if args.models == ",".join(MODELS):
        _small_models(args.repeat)
        print()
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


def _small_models(repeat: int) -> None:
    """Warm capture of the small models, against :data:`SMALL_TARGET`."""
    print(f"small models (target: under 20 nodes in at most {SMALL_TARGET * 1e3:.0f} ms warm)")
    print(f"{'model':22s} {'nodes':>6s} {'yobx (ms)':>10s} {'fx (ms)':>8s} {'target':>7s}")
    for name, make in SMALL_MODELS.items():
        model, kwargs, dyn = make()
        nodes = len(CustomTracer().trace(model, concrete_args=kwargs, dynamic_shapes=dyn).nodes)
        measured = _median_times(
            {
                "yobx": lambda model=model, kwargs=kwargs, dyn=dyn: CustomTracer().trace(
                    model, concrete_args=kwargs, dynamic_shapes=dyn
                ),
                "fx": lambda model=model: torch.fx.symbolic_trace(model),
            },
            max(repeat, 20),
        )
        yobx = measured["yobx"]
        verdict = "met" if nodes < 20 and yobx <= SMALL_TARGET else "NOT met"
        print(
            f"{name:22s} {nodes:6d} {yobx * 1e3:10.2f} {measured['fx'] * 1e3:8.2f} {verdict:>7s}",
            flush=True,
        )


if __name__ == "__main__":
    main()
