"""Benchmark: exporting Llama-shaped models of 0.1B, 1B and 7B parameters built on the
meta device (no weight allocated), with yobx and with torch.onnx's fake mode.

For each size, in a fresh process each (peak memory is the process's own):

* ``yobx``: ``with torch.device("meta")`` model, ``to_onnx`` with dynamic batch and
  sequence: capture time, total export time, peak RSS;
* ``torch.onnx``: the same meta-device model, ``torch.onnx.export(..., dynamo=True,
  optimize=False)``: export time, peak RSS (skipped with ``--no-torch-onnx``, or when
  it exceeds ``--timeout``). torch 2.13 has no ``torch.onnx.enable_fake_mode`` any more,
  and its optimizer fails on weights without data (``onnx_ir`` ``PassError`` in constant
  folding), so it runs unoptimized: its time is a lower bound;
* ``yobx+weights`` (sizes up to ``--weights-up-to``, 0.1B by default): the model with
  random weights saved as safetensors, exported from the meta device, then
  ``apply_weights`` and ``save`` streaming the weights into the external data file:
  export + save time, peak RSS, against the weights' size.

    python _scripts/bench_big_models.py [--sizes 0.1B,1B,7B] [--timeout 1200]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

#: Llama shapes: hidden, layers, heads, kv heads, intermediate, vocabulary
SIZES = {
    "0.1B": (768, 12, 12, 12, 2048, 32000),
    "1B": (2048, 16, 32, 8, 8192, 32000),
    "7B": (4096, 32, 32, 32, 11008, 32000),
}


def _config(size: str):
    import transformers

    hidden, layers, heads, kv_heads, intermediate, vocab = SIZES[size]
    config = transformers.LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=4096,
    )
    config._attn_implementation = "eager"
    config.use_cache = False
    return config


def _inputs(config):
    import torch

    ids = torch.randint(0, config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones((2, 5), dtype=torch.int64)
    dims = {0: "batch", 1: "seq"}
    return {"input_ids": ids, "attention_mask": mask}, {"input_ids": dims, "attention_mask": dims}


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child_yobx(size: str) -> dict:
    import torch
    import transformers

    from yobx.torch.onnx import to_onnx

    config = _config(size)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).eval()
    kwargs, dynamic_shapes = _inputs(config)
    start = time.perf_counter()
    result = to_onnx(model, (), kwargs, dynamic_shapes=dynamic_shapes)
    total = time.perf_counter() - start
    stages = {s.name: s.duration_s for s in result.stages}
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "capture": stages["capture"],
        "export": total,
        "peak": _peak_bytes(),
        "onnx_nodes": result.n_onnx_nodes,
        "dims": result.dynamic_dimensions,
    }


def child_torch_onnx(size: str) -> dict:
    import contextlib
    import io
    import logging
    import warnings

    import torch
    import transformers

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    config = _config(size)
    kwargs, dynamic_shapes = _inputs(config)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).eval()
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # optimize=True fails on weights without data (onnx_ir PassError)
        program = torch.onnx.export(
            model, (), kwargs=kwargs, dynamic_shapes=dynamic_shapes, dynamo=True, optimize=False
        )
    total = time.perf_counter() - start
    return {
        "export": total,
        "peak": _peak_bytes(),
        "onnx_nodes": len(program.model.graph),
    }


def child_yobx_weights(size: str) -> dict:
    import transformers

    from yobx.torch.onnx import to_onnx
    from yobx.torch.onnx.weights import empty_weights

    config = _config(size)
    kwargs, dynamic_shapes = _inputs(config)
    directory = tempfile.mkdtemp(prefix="yobx_bench_")
    weights_path = os.path.join(directory, "model.safetensors")
    # the checkpoint is written by another process, so that its memory is not counted
    writer = (
        "import sys, torch, transformers\n"
        "from safetensors.torch import save_file\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "from bench_big_models import _config\n"
        f"model = transformers.LlamaForCausalLM(_config({size!r}))\n"
        f"save_file(model.state_dict(), {weights_path!r})\n"
    )
    subprocess.run([sys.executable, "-c", writer], check=True)
    weight_bytes = os.path.getsize(weights_path)
    with empty_weights():
        model = transformers.LlamaForCausalLM(config).eval()
    start = time.perf_counter()
    result = to_onnx(model, (), kwargs, dynamic_shapes=dynamic_shapes)
    exported = time.perf_counter() - start
    result.apply_weights(weights_path)
    onnx_path = os.path.join(directory, "model.onnx")
    result.save(onnx_path, external_data=True)
    total = time.perf_counter() - start
    data_bytes = os.path.getsize(onnx_path + ".data")
    for name in os.listdir(directory):
        os.remove(os.path.join(directory, name))
    os.rmdir(directory)
    return {
        "export": exported,
        "export_save": total,
        "peak": _peak_bytes(),
        "weights": weight_bytes,
        "data": data_bytes,
    }


CHILDREN = {"yobx": child_yobx, "torch.onnx": child_torch_onnx, "yobx+weights": child_yobx_weights}


def _run_child(kind: str, size: str, timeout: float) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", kind, "--sizes", size]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return {"error": lines[-1][:160] if lines else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _gb(n: float) -> str:
    return f"{n / 2**30:.2f} GB"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per run")
    parser.add_argument("--no-torch-onnx", action="store_true")
    parser.add_argument("--weights-up-to", default="0.1B", help="largest size saved")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    sizes = options.sizes.split(",")
    if options.child:
        print(json.dumps(CHILDREN[options.child](sizes[0])))
        return 0
    order = list(SIZES)
    for size in sizes:
        print(f"== Llama-shaped {size} on the meta device", flush=True)
        ours = _run_child("yobx", size, options.timeout)
        if "error" in ours:
            print(f"  yobx          FAILED {ours['error']}")
        else:
            print(
                f"  yobx          {ours['params'] / 1e9:.2f}B params, capture "
                f"{ours['capture']:.1f} s, export {ours['export']:.1f} s, peak "
                f"{_gb(ours['peak'])}, {ours['onnx_nodes']} nodes, dims "
                f"{', '.join(ours['dims'])}",
                flush=True,
            )
        if not options.no_torch_onnx:
            theirs = _run_child("torch.onnx", size, options.timeout)
            if "error" in theirs:
                print(f"  torch.onnx    FAILED {theirs['error']}")
            else:
                ratio = ""
                if "error" not in ours:
                    ratio = f", yobx/torch.onnx time {ours['export'] / theirs['export']:.2f}"
                print(
                    f"  torch.onnx    export (unoptimized) {theirs['export']:.1f} s, peak "
                    f"{_gb(theirs['peak'])}, {theirs['onnx_nodes']} nodes{ratio}",
                    flush=True,
                )
        if order.index(size) <= order.index(options.weights_up_to):
            saved = _run_child("yobx+weights", size, options.timeout)
            if "error" in saved:
                print(f"  yobx+weights  FAILED {saved['error']}")
            else:
                print(
                    f"  yobx+weights  export {saved['export']:.1f} s, + apply_weights + "
                    f"save {saved['export_save']:.1f} s, peak {_gb(saved['peak'])} for "
                    f"{_gb(saved['weights'])} of weights "
                    f"({saved['peak'] / saved['weights']:.2f}x)",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
