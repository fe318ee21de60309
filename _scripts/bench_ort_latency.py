"""Quality of the produced model: onnxruntime latency of yobx's ONNX against
torch.onnx.export(dynamo=True)'s, and of yobx's with ``optimize="ort"``.

Llama-, GPT2- and ViT-shaped transformers models of moderate size (hidden 512, 8
layers, random weights, built from configurations) are exported three ways with
dynamic shapes: ``to_onnx`` (default optimizer), ``torch.onnx.export(dynamo=True)``
(its default optimizer) and ``to_onnx(optimize="ort")`` (onnxscript's fusions for
onnxruntime). Each model is validated against eager PyTorch on the example inputs and
on inputs of other sizes (max absolute error), then run by onnxruntime on the CPU
(``intra_op_num_threads`` fixed, all graph optimizations on): after a warm-up, the
sessions alternate run after run and the script prints the median latency of each,
the ratio yobx / torch.onnx and the gain of "ort" over the default::

    python _scripts/bench_ort_latency.py [--runs 50] [--threads 1] [--models llama,gpt2,vit]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import time
import warnings

import onnxruntime
import torch
import transformers

from yobx.torch.onnx import to_onnx, validate

HIDDEN, LAYERS, HEADS = 512, 8, 8


def _token_model(model_class, config, vocab: int, batch: int, seq: int):
    torch.manual_seed(0)
    model = model_class(config).eval()
    generator = torch.Generator().manual_seed(0)

    def inputs(b: int, s: int) -> dict:
        return {
            "input_ids": torch.randint(0, vocab, (b, s), generator=generator),
            "attention_mask": torch.ones((b, s), dtype=torch.int64),
        }

    dims = {0: "batch", 1: "seq"}
    return model, inputs(batch, seq), {"input_ids": dims, "attention_mask": dims}, inputs


def llama(attention: str):
    config = transformers.LlamaConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS // 2,
        intermediate_size=4 * HIDDEN,
        vocab_size=1024,
        max_position_embeddings=1024,
    )
    config._attn_implementation = attention
    config.use_cache = False
    return _token_model(transformers.LlamaForCausalLM, config, 1024, 2, 128)


def gpt2(attention: str):
    config = transformers.GPT2Config(
        n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, vocab_size=1024, n_positions=1024
    )
    config._attn_implementation = attention
    config.use_cache = False
    return _token_model(transformers.GPT2LMHeadModel, config, 1024, 2, 128)


def vit(attention: str):
    config = transformers.ViTConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=4 * HIDDEN,
        image_size=224,
        patch_size=16,
    )
    config._attn_implementation = attention
    torch.manual_seed(0)
    model = transformers.ViTModel(config, add_pooling_layer=False).eval()
    generator = torch.Generator().manual_seed(0)

    def inputs(batch: int, _size: int) -> dict:
        # the image size is fixed by the position embeddings: only the batch varies
        return {"pixel_values": torch.randn((batch, 3, 224, 224), generator=generator)}

    return model, inputs(2, 0), {"pixel_values": {0: "batch"}}, inputs


MODELS = {"llama": llama, "gpt2": gpt2, "vit": vit}


def _torch_onnx(model, kwargs, dynamic_shapes):
    with contextlib.redirect_stdout(io.StringIO()):
        return torch.onnx.export(
            model, (), kwargs=kwargs, dynamic_shapes=dynamic_shapes, dynamo=True
        ).model_proto


def export_all(model, kwargs, dynamic_shapes) -> dict:
    """The three ONNX models (or the error of the exporter that failed)."""
    exporters = {
        "yobx": lambda: to_onnx(model, (), kwargs, dynamic_shapes=dynamic_shapes).model_proto,
        "torch.onnx": lambda: _torch_onnx(model, kwargs, dynamic_shapes),
        "yobx ort": lambda: (
            to_onnx(model, (), kwargs, dynamic_shapes=dynamic_shapes, optimize="ort").model_proto
        ),
    }
    protos = {}
    for name, export in exporters.items():
        try:
            protos[name] = export()
        except Exception as exc:
            protos[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:100]}"
    return protos


def _session(proto, threads: int) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def latencies(protos: dict, kwargs: dict, threads: int, warmup: int, runs: int) -> dict:
    """Median latency of each session; the sessions alternate, run after run."""
    sessions = {name: _session(p, threads) for name, p in protos.items() if not isinstance(p, str)}
    feeds = {}
    for name, session in sessions.items():
        feeds[name] = {i.name: kwargs[i.name].numpy() for i in session.get_inputs()}
        for _ in range(warmup):
            session.run(None, feeds[name])
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(runs):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds[name])
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="intra_op_num_threads")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--attention", default="sdpa", help="sdpa (transformers' default) or eager")
    options = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    tools = ("yobx", "torch.onnx", "yobx ort")
    print(
        f"hidden {HIDDEN}, {LAYERS} layers, onnxruntime {onnxruntime.__version__}, "
        f"{options.threads} intra-op thread(s), median of {options.runs} runs"
    )
    header = (
        f"{'model':6} | " + " | ".join(f"{t + ' ms':>13} {'max err':>8}" for t in tools)
    ) + f" | {'yobx/torch':>10} {'ort gain':>8}"
    print(header)
    print("-" * len(header))
    failures = []
    for name in options.models.split(","):
        model, kwargs, dynamic_shapes, make_inputs = MODELS[name](options.attention)
        protos = export_all(model, kwargs, dynamic_shapes)
        # the example, then other sizes of the dynamic dimensions
        cases = [kwargs, make_inputs(1, 33), make_inputs(3, 77)]
        errors = {}
        for tool, proto in protos.items():
            if isinstance(proto, str):
                failures.append(f"  {name} [{tool}] export: {proto}")
                continue
            try:
                report = validate(model, proto, cases)
            except Exception as exc:
                # a model onnxruntime cannot load is reported, not timed
                failures.append(f"  {name} [{tool}] onnxruntime: {str(exc).strip()[:160]}")
                protos[tool] = f"{type(exc).__name__}"
                continue
            errors[tool] = report.max_abs_error
            if not report.ok:
                failures.append(f"  {name} [{tool}]: {report.format().splitlines()[0][:120]}")
        measured = latencies(protos, kwargs, options.threads, options.warmup, options.runs)
        cells = []
        for tool in tools:
            ms = f"{measured[tool] * 1e3:13.2f}" if tool in measured else f"{'fails':>13}"
            err = f"{errors[tool]:8.1e}" if tool in errors else f"{'-':>8}"
            cells.append(f"{ms} {err}")
        ratio = gain = "-"
        if "yobx" in measured and "torch.onnx" in measured:
            ratio = f"{measured['yobx'] / measured['torch.onnx']:.2f}"
        if "yobx" in measured and "yobx ort" in measured:
            gain = f"{measured['yobx'] / measured['yobx ort']:.2f}x"
        print(f"{name:6} | " + " | ".join(cells) + f" | {ratio:>10} {gain:>8}", flush=True)
    print("ratio yobx/torch: latency of yobx's default model over torch.onnx's (target <= 1)")
    print('ort gain: latency of the default model over the optimize="ort" one')
    if failures:
        print("failures:")
        print("\n".join(failures))


if __name__ == "__main__":
    main()
