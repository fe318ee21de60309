"""Capture time: CustomTracer vs torch.fx.symbolic_trace vs torch.export.export(strict=False).

Prints, per model, the median capture time of each tool (after one warm-up) and the ratios
yobx/export and yobx/fx measured in the same run::

    python _scripts/bench_tracing.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from yobx.torch.tracing import CustomTracer


def _text(model_cls, config):
    model = model_cls(config).eval()
    kwargs = {
        "input_ids": torch.randint(0, 100, (2, 7)),
        "attention_mask": torch.ones(2, 7, dtype=torch.int64),
    }
    seq = torch.export.Dim("seq", max=512)
    dyn = {"input_ids": {0: "batch", 1: seq}, "attention_mask": {0: "batch", 1: seq}}
    return model, kwargs, dyn


def models():
    """Yields (name, model, example kwargs, dynamic shapes with names or Dims)."""
    import transformers

    yield (
        "llama",
        *_text(
            transformers.LlamaForCausalLM,
            transformers.LlamaConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=64,
                vocab_size=100,
            ),
        ),
    )
    yield (
        "gpt2",
        *_text(
            transformers.GPT2LMHeadModel,
            transformers.GPT2Config(
                n_embd=32,
                n_layer=2,
                n_head=4,
                vocab_size=100,
                n_positions=64,
                bos_token_id=0,
                eos_token_id=0,
            ),
        ),
    )
    yield (
        "bert",
        *_text(
            transformers.BertModel,
            transformers.BertConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                vocab_size=100,
            ),
        ),
    )
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    yield (
        "transformer_encoder",
        encoder,
        {"src": torch.randn(2, 7, 32)},
        {"src": {0: "batch", 1: "seq"}},
    )
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 8 * 8, 10),
    ).eval()
    yield "cnn", cnn, {"input": torch.randn(2, 3, 16, 16)}, {"input": {0: "batch"}}


def _as_dims(dynamic_shapes):
    """torch.export wants Dim objects: same names give the same Dim."""
    cache = {}

    def convert(spec):
        if isinstance(spec, str):
            return cache.setdefault(spec, torch.export.Dim(spec))
        if isinstance(spec, dict):
            return {k: convert(v) for k, v in spec.items()}
        return spec

    return {k: convert(v) for k, v in dynamic_shapes.items()}


def _median_time(fn, repeat: int) -> float | None:
    try:
        fn()
    except Exception as e:  # a tool that cannot capture the model is reported, not timed
        return f"fails: {type(e).__name__}"
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(
        f"{'model':22s} {'yobx (s)':>10s} {'fx (s)':>10s} {'export (s)':>11s} "
        f"{'yobx/export':>12s} {'yobx/fx':>8s}"
    )
    for name, model, kwargs, dyn in models():
        yobx = _median_time(
            lambda model=model, kwargs=kwargs, dyn=dyn: CustomTracer().trace(
                model, concrete_args=kwargs, dynamic_shapes=dyn
            ),
            args.repeat,
        )
        fx = _median_time(lambda model=model: torch.fx.symbolic_trace(model), args.repeat)
        export = _median_time(
            lambda model=model, kwargs=kwargs, dyn=dyn: torch.export.export(
                model, (), kwargs, dynamic_shapes=_as_dims(dyn), strict=False
            ),
            args.repeat,
        )

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
