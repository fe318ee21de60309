"""Scale: capture and export cost per node, from 2 to 32 layers and on a 7B-shaped model.

Llama-shaped models are built from a small transformers configuration (hidden 64,
random weights) with 2, 4, 8, 16 and 32 layers. For each, the script prints:

* the median capture time of ``CustomTracer`` and ``torch.export.export(strict=False)``,
  the nodes of each graph and the microseconds per node; then the flatness of each
  tool, its µs/node at 32 layers over its µs/node at 2 layers (target: within 1.5);
* ``to_onnx`` against ``torch.onnx.export(dynamo=True)`` at 2 and 8 layers (``--export
  -layers``): time, µs per captured node (yobx's node count, the same size measure
  for both exporters) and the ratio;
* a Llama-2-7B-shaped model built on the meta device (no weight allocated): capture
  time and µs/node with ``CustomTracer`` (cold, then warm) and, unless
  ``--no-export-7b``, ``torch.export.export(strict=False)`` (one run: a single capture
  takes seconds).

The tools alternate, call after call, so that the machine's slow phases weigh on all::

    python _scripts/bench_scale.py [--repeat 3] [--layers 2,4,8,16,32] [--export-layers 2,8]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import time
import warnings

import torch
import transformers

from yobx.torch.onnx import to_onnx
from yobx.torch.tracing import CustomTracer

#: Llama-2-7B: hidden, heads, kv heads, intermediate, vocabulary, layers
LLAMA_7B = (4096, 32, 32, 11008, 32000, 32)


def llama(layers: int, hidden: int = 64, meta: bool = False, sizes: tuple | None = None):
    """A LlamaForCausalLM with random weights (or on the meta device), its inputs and
    dynamic shapes (batch and sequence)."""
    if sizes is None:
        sizes = (hidden, 4, 2, 2 * hidden, 99, layers)
    hidden, heads, kv_heads, intermediate, vocab, layers = sizes
    config = transformers.LlamaConfig(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        num_hidden_layers=layers,
        max_position_embeddings=4096,
    )
    config._attn_implementation = "eager"
    config.use_cache = False
    with torch.device("meta") if meta else contextlib.nullcontext():
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(0)
    kwargs = {
        "input_ids": torch.randint(0, vocab, (2, 7), generator=generator),
        "attention_mask": torch.ones((2, 7), dtype=torch.int64),
    }
    dims = {0: "batch", 1: "seq"}
    return model, kwargs, {"input_ids": dims, "attention_mask": dims}


def _export_dims(dynamic_shapes):
    """torch.export wants Dim objects: a name shared by several inputs is one Dim."""
    cache: dict = {}
    return {
        name: {axis: cache.setdefault(dim, torch.export.Dim(dim)) for axis, dim in spec.items()}
        for name, spec in dynamic_shapes.items()
    }


def _median_times(functions: dict, repeat: int) -> dict:
    """Median time and last result per tool; the tools alternate (one warm-up each)."""
    results = {name: fn() for name, fn in functions.items()}
    times: dict = {name: [] for name in functions}
    for _ in range(repeat):
        for name, fn in functions.items():
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), results[name]) for name in functions}


def _capture_tools(model, kwargs, dynamic_shapes) -> dict:
    return {
        "yobx": lambda: CustomTracer().trace(
            model, concrete_args=kwargs, dynamic_shapes=dynamic_shapes
        ),
        "export": lambda: (
            torch.export.export(
                model, (), kwargs, dynamic_shapes=_export_dims(dynamic_shapes), strict=False
            ).graph
        ),
    }


def _torch_onnx(model, kwargs, dynamic_shapes):
    with contextlib.redirect_stdout(io.StringIO()):
        return torch.onnx.export(
            model, (), kwargs=kwargs, dynamic_shapes=dynamic_shapes, dynamo=True
        ).model_proto


def _export_tools(model, kwargs, dynamic_shapes) -> dict:
    return {
        "yobx": lambda: to_onnx(model, (), kwargs, dynamic_shapes=dynamic_shapes),
        "torch.onnx": lambda: _torch_onnx(model, kwargs, dynamic_shapes),
    }


def capture_table(layer_counts: list[int], repeat: int) -> None:
    print(
        f"{'layers':>6} {'yobx ms':>8} {'nodes':>6} {'µs/node':>8} | {'export ms':>9} "
        f"{'nodes':>6} {'µs/node':>8} | {'yobx/export':>11}"
    )
    per_node: dict[str, list[float]] = {"yobx": [], "export": []}
    for layers in layer_counts:
        model, kwargs, dynamic_shapes = llama(layers)
        measured = _median_times(_capture_tools(model, kwargs, dynamic_shapes), repeat)
        cells = []
        for tool in ("yobx", "export"):
            seconds, graph = measured[tool]
            nodes = len(graph.nodes)
            per_node[tool].append(seconds * 1e6 / nodes)
            cells.append(f"{seconds * 1e3:8.1f} {nodes:6d} {per_node[tool][-1]:8.1f}")
        ratio = measured["yobx"][0] / measured["export"][0]
        print(f"{layers:6d} {cells[0]} | {cells[1]:>26} | {ratio:11.3f}", flush=True)
    for tool, values in per_node.items():
        print(
            f"flatness {tool}: µs/node at {layer_counts[-1]} layers / at {layer_counts[0]} "
            f"layers = {values[-1] / values[0]:.2f} (target <= 1.5)"
        )


def export_table(layer_counts: list[int], repeat: int) -> None:
    print(
        f"\n{'layers':>6} {'nodes':>6} {'to_onnx ms':>10} {'µs/node':>8} | "
        f"{'torch.onnx ms':>13} {'µs/node':>8} | {'ratio':>6}"
    )
    for layers in layer_counts:
        model, kwargs, dynamic_shapes = llama(layers)
        nodes = len(
            CustomTracer().trace(model, concrete_args=kwargs, dynamic_shapes=dynamic_shapes).nodes
        )
        measured = _median_times(_export_tools(model, kwargs, dynamic_shapes), repeat)
        ours, theirs = measured["yobx"][0], measured["torch.onnx"][0]
        print(
            f"{layers:6d} {nodes:6d} {ours * 1e3:10.1f} {ours * 1e6 / nodes:8.1f} | "
            f"{theirs * 1e3:13.1f} {theirs * 1e6 / nodes:8.1f} | {ours / theirs:6.3f}",
            flush=True,
        )


def meta_7b(with_export: bool) -> None:
    start = time.perf_counter()
    model, kwargs, dynamic_shapes = llama(0, meta=True, sizes=LLAMA_7B)
    print(f"\nLlama-2-7B shapes on the meta device (built in {time.perf_counter() - start:.1f} s)")
    tools = _capture_tools(model, kwargs, dynamic_shapes)
    if not with_export:
        del tools["export"]
    for tool, capture in tools.items():
        # yobx's capture takes under a second: a second, warm one is comparable with
        # the µs/node of the table above (export runs once, cold)
        for when in ("cold: first capture of this model", "warm: second capture")[
            : 2 if tool == "yobx" else 1
        ]:
            start = time.perf_counter()
            try:
                graph = capture()
            except Exception as exc:
                message = str(exc).splitlines()[0][:100]
                print(f"  {tool:7s} fails: {type(exc).__name__}: {message}")
                break
            seconds = time.perf_counter() - start
            nodes = len(graph.nodes)
            print(
                f"  {tool:7s} capture {seconds:7.3f} s  {nodes:5d} nodes  "
                f"{seconds * 1e6 / nodes:8.1f} µs/node ({when})",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", default="2,4,8,16,32")
    parser.add_argument("--export-layers", default="2,8", help="empty: no export table")
    parser.add_argument("--no-7b", action="store_true", help="skip the 7B-shaped model")
    parser.add_argument("--no-export-7b", action="store_true", help="no torch.export on 7B")
    options = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    capture_table([int(n) for n in options.layers.split(",")], options.repeat)
    if options.export_layers:
        export_table([int(n) for n in options.export_layers.split(",")], options.repeat)
    if not options.no_7b:
        meta_7b(not options.no_export_7b)


if __name__ == "__main__":
    main()
