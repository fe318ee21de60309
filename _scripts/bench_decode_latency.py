"""onnxruntime latency of an LLM's prefill and decode step, for several exports of the
same Llama-style checkpoint.

A ``LlamaForCausalLM`` built from a configuration (hidden 512, 8 layers, 8 heads, 4
key-value heads, float32, random weights, ``torch.manual_seed(0)``) is saved with a
tiny word-level tokenizer into a temporary directory, then exported as a decode step
taking a cache (``input_ids``, ``attention_mask``, ``past_key_values.<layer>.key|value``;
``logits`` and ``present.<layer>.key|value`` out) by each variant:

* ``yobx``: ``to_onnx`` with a ``DynamicCache`` and dynamic batch, sequence and past,
  the mask's length declared ``"past + seq"`` (as ``hf:`` and the transformers backend
  declare it);
* ``yobx-ort``: the same with ``optimize="ort"`` (onnxruntime's fused operators);
* ``yobx-int4``: the same with ``quantize="int4"`` (``MatMulNBits``, blocks of 32);
* ``yobx-int4-l4``: the same with ``quantize_accuracy_level=4`` (int8 activations, as
  the builder's int4 graph computes);
* ``yobx-in-out`` (not run by default): ``yobx`` with every weight stored ``[in, out]``,
  also those read in versions nested two deep, which the export keeps behind their
  ``Transpose`` (measured: the decode step is faster with the ``Transpose``);
* ``yobx-ort-attention`` (not run by default): ``yobx-ort`` with onnxscript's attention
  fusions too (``MultiHeadAttention``), which ``optimize="ort"`` leaves out of a step
  with a cache (:mod:`yobx.torch.onnx.ort_fusions`): what that choice is worth;
* ``yobx-nested`` and ``yobx-ort-nested`` (not run by default): ``yobx`` and
  ``yobx-ort`` without the passes making the versions' nested ``If`` nodes fewer
  (:mod:`yobx.torch.onnx.filler_slots`, :mod:`yobx.torch.onnx.if_trees`): what they
  are worth;
* ``yobx-unchecked`` (not run by default): ``yobx`` with ``runtime_checks=False``, the
  model then not checking its constraints: what the checks cost;
* ``yobx-total`` (not run by default): ``yobx`` with the mask's length a dimension of
  its own (``"total"``, as torch.onnx declares it), whose versions for a mask longer or
  shorter than the cache and the new tokens the model then chooses between: what
  declaring ``"past + seq"`` is worth;
* ``torch.onnx``: ``torch.onnx.export(dynamo=True)`` with ``torch.export.Dim`` shapes;
* ``builder`` and ``builder-int4``: onnxruntime-genai's model builder run offline on
  the saved checkpoint (``-p fp32`` and ``-p int4``, ``-e cpu``), its ``model.onnx`` run
  by a plain ``onnxruntime.InferenceSession`` (not the genai runtime).

A variant whose export fails is reported and skipped. Each model's structure is
printed (nodes of the top-level graph and counting the subgraphs of ``If`` nodes,
``MatMulNBits`` nodes and the ``MatMul`` nodes left reading a weight). The logits of
each variant are compared with eager PyTorch on the same random cache (the prefill and
the decode step at batch 1: max absolute error, and the share of positions whose
argmax agrees). Then, for each case (prefill: batch 1, 128 tokens, no past; decode:
one token at batch 1 with 128 past tokens and at batch 4 with 512), every session gets
the same random inputs, is warmed up, and the sessions alternate run after run
(``intra_op_num_threads`` fixed, all graph optimizations on): the script prints the
median latency of each and its ratio to ``builder`` and to ``torch.onnx``. Each variant
is timed in ``--sessions`` sessions (3 by default), its median over all of them: two
sessions of one model can differ by 15% run after run, whatever the model::

    python _scripts/bench_decode_latency.py [--runs 30] [--sessions 3] [--threads 1] \\
        [--hidden 512] [--layers 8] [--variants yobx,yobx-ort,yobx-int4,torch.onnx,...]

A quick check of the script itself::

    python _scripts/bench_decode_latency.py --hidden 128 --layers 2 --runs 5
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VOCAB = 1024
#: name, batch, new tokens, past tokens
CASES = (
    ("prefill b1 s128", 1, 128, 0),
    ("decode b1 p128", 1, 1, 128),
    ("decode b4 p512", 4, 1, 512),
)
#: the cases compared with eager PyTorch before timing
CHECKED = ("prefill b1 s128", "decode b1 p128")
VARIANTS = (
    "yobx",
    "yobx-ort",
    "yobx-int4",
    "yobx-int4-l4",
    "yobx-ort-int4-l4",
    "torch.onnx",
    "builder",
    "builder-int4",
)
#: variants run only when asked for
OPTIONAL_VARIANTS = (
    "yobx-in-out",
    "yobx-ort-attention",
    "yobx-nested",
    "yobx-ort-nested",
    "yobx-unchecked",
    "yobx-total",
)
#: the names a cache's tensors get: yobx's and the builder's, torch.onnx's
_CACHE_NAMES = (
    re.compile(r"^past_key_values\.(?P<layer>\d+)\.(?P<kind>key|value)$"),
    re.compile(r"^cache_(?P<kind>key|value)_cache_(?P<layer>\d+)$"),
)
_NUMPY_TYPES = {
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(float)": np.float32,
}


@dataclass
class Variant:
    """An exported model: what onnxruntime loads (bytes or a file) and its graph."""

    name: str
    source: bytes | str
    proto: onnx.ModelProto
    export_seconds: float
    note: str = ""
    session: Any = None
    #: the sessions timed (``--sessions`` of them): two sessions of the same model can
    #: differ by 15% run after run (where onnxruntime placed the weights), so each
    #: variant's median is over several
    timed: list = field(default_factory=list)
    times: dict[str, list[float]] = field(default_factory=dict)


def llama_config(hidden: int, layers: int) -> transformers.LlamaConfig:
    """The configuration: heads of 64 (at least two), half as many key-value heads."""
    heads = max(2, hidden // 64)
    return transformers.LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        intermediate_size=4 * hidden,
        vocab_size=VOCAB,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        use_cache=True,
    )


def save_checkpoint(model: torch.nn.Module, directory: str) -> None:
    """Saves the model and a tiny word-level tokenizer (built offline: the model
    builder reads one beside the checkpoint)."""
    import tokenizers

    model.save_pretrained(directory)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<unk>",
    ).save_pretrained(directory)


def _cache(config: transformers.LlamaConfig, keys: list, values: list) -> Any:
    """A ``DynamicCache`` holding the given keys and values (numpy), one per layer."""
    cache = transformers.DynamicCache(config=config)
    for layer, (key, value) in enumerate(zip(keys, values)):
        if key.shape[2]:
            cache.update(torch.from_numpy(key.copy()), torch.from_numpy(value.copy()), layer)
    return cache


def case_inputs(config: transformers.LlamaConfig, batch: int, seq: int, past: int) -> dict:
    """Random inputs of a case, numpy: ``input_ids``, an all-ones ``attention_mask``,
    and the cache's ``keys`` and ``values`` (``(batch, kv_heads, past, head_dim)``)."""
    generator = np.random.default_rng(batch * 1000 + seq * 10 + past)
    head_dim = config.hidden_size // config.num_attention_heads
    shape = (batch, config.num_key_value_heads, past, head_dim)
    layers = config.num_hidden_layers
    return {
        "input_ids": generator.integers(3, VOCAB, (batch, seq), dtype=np.int64),
        "attention_mask": np.ones((batch, past + seq), dtype=np.int64),
        "keys": [generator.standard_normal(shape, dtype=np.float32) for _ in range(layers)],
        "values": [generator.standard_normal(shape, dtype=np.float32) for _ in range(layers)],
        "past": past,
    }


def example_kwargs(config: transformers.LlamaConfig) -> dict:
    """The export's example: batch 2, 3 new tokens, 5 past ones."""
    inputs = case_inputs(config, 2, 3, 5)
    return {
        "input_ids": torch.from_numpy(inputs["input_ids"]),
        "attention_mask": torch.from_numpy(inputs["attention_mask"]),
        "cache": _cache(config, inputs["keys"], inputs["values"]),
    }


def dynamic_shapes(cache: Any, mask: str = "past + seq") -> dict:
    """yobx's dynamic shapes: names for batch, seq and past, and the mask's length:
    ``"past + seq"`` as generation passes it (what ``hf:`` and yobx's transformers
    backend declare), or ``"total"``, a dimension of its own (a mask longer or
    shorter than the cache and the new tokens gets versions), as torch.onnx needs it
    (a ``Dim`` cannot be a sum of two)."""
    from yobx.torch.tracing.inputs import cache_dynamic_shapes

    return {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: mask},
        "cache": cache_dynamic_shapes(cache, {0: "batch", 2: "past"}),
    }


def _as_dims(shapes: Any, dims: dict) -> Any:
    """The dynamic shapes with each name replaced by a ``torch.export.Dim``."""
    if isinstance(shapes, dict):
        return {key: _as_dims(value, dims) for key, value in shapes.items()}
    if isinstance(shapes, (list, tuple)):
        return type(shapes)(_as_dims(value, dims) for value in shapes)
    if isinstance(shapes, str):
        return dims.setdefault(shapes, torch.export.Dim(shapes))
    return shapes


def export_yobx(
    model: torch.nn.Module, kwargs: dict, **options: Any
) -> tuple[onnx.ModelProto, str]:
    """``to_onnx`` of the step, with ``options`` (``optimize``, ``quantize``...); also
    returns how many versions the model chooses between, and why it holds the example's
    side only when the versions did not export."""
    from yobx.torch.onnx import to_onnx

    kwargs = copy.deepcopy(kwargs)
    shapes = dynamic_shapes(kwargs["cache"], options.pop("mask", "past + seq"))
    result = to_onnx(model, (), kwargs, dynamic_shapes=shapes, **options)
    note = f"{len(result.versions)} versions"
    if result.version_fallback:
        note += f"; {result.version_fallback}"
    return result.model_proto, note


def export_in_out(model: torch.nn.Module, kwargs: dict) -> tuple[onnx.ModelProto, str]:
    """``yobx`` with every weight stored ``[in, out]``, also those read inside versions
    nested in versions, which the export leaves behind their ``Transpose``
    (``store_weights_transposed(max_depth=1)``): what that choice is worth."""
    import functools

    import yobx.torch.onnx.export as export_module

    default = export_module.store_weights_transposed
    export_module.store_weights_transposed = functools.partial(default, max_depth=None)
    try:
        return export_yobx(model, kwargs)
    finally:
        export_module.store_weights_transposed = default


def export_ort_attention(model: torch.nn.Module, kwargs: dict) -> tuple[onnx.ModelProto, str]:
    """``yobx-ort`` with the attention fusions applied to the step with a cache too
    (as ``onnxscript``'s ``optimize_for_ort`` does): what leaving them out is worth."""
    import yobx.torch.onnx.optimize as optimize_module

    default = optimize_module.takes_a_cache
    optimize_module.takes_a_cache = lambda model: False
    try:
        return export_yobx(model, kwargs, optimize="ort")
    finally:
        optimize_module.takes_a_cache = default


def export_nested(model: torch.nn.Module, kwargs: dict, **options: Any) -> tuple:
    """``yobx`` (or ``yobx-ort`` with ``optimize="ort"``) without the passes that make
    the versions' nested ``If`` nodes fewer (outputs filled on opposite sides merged,
    trees of ``If`` nodes run as one): what they are worth."""
    import yobx.torch.onnx.optimize as optimize_module

    saved = optimize_module.merge_filler_slots, optimize_module.collapse_branch_trees
    optimize_module.merge_filler_slots = lambda model: 0
    optimize_module.collapse_branch_trees = lambda model: 0
    try:
        return export_yobx(model, kwargs, **options)
    finally:
        optimize_module.merge_filler_slots, optimize_module.collapse_branch_trees = saved


def export_torch_onnx(model: torch.nn.Module, kwargs: dict) -> onnx.ModelProto:
    """``torch.onnx.export(dynamo=True)`` of the step, the same shapes as Dims."""
    kwargs = copy.deepcopy(kwargs)
    shapes = _as_dims(dynamic_shapes(kwargs["cache"], "total"), {})
    with contextlib.redirect_stdout(io.StringIO()):
        program = torch.onnx.export(model, (), kwargs=kwargs, dynamic_shapes=shapes, dynamo=True)
    return program.model_proto


def export_builder(checkpoint: str, output: str, precision: str) -> str:
    """Runs onnxruntime-genai's model builder on the checkpoint; returns the path of
    its ``model.onnx``.

    :raises RuntimeError: the builder failed (with its last line of output)
    """
    command = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        checkpoint,
        "-o",
        output,
        "-p",
        precision,
        "-e",
        "cpu",
        "-c",
        os.path.join(output, "cache_dir"),
    ]
    if precision == "int4":
        command += ["--extra_options", "block_size=32"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    path = os.path.join(output, "model.onnx")
    if done.returncode or not os.path.exists(path):
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        raise RuntimeError(lines[-1] if lines else f"exit code {done.returncode}")
    return path


def export_all(
    names: list[str], model: torch.nn.Module, kwargs: dict, checkpoint: str, workdir: str
) -> tuple[dict[str, Variant], list[str]]:
    """The variants asked for, and a line per variant that failed."""
    exporters = {
        "yobx": lambda: export_yobx(model, kwargs),
        "yobx-ort": lambda: export_yobx(model, kwargs, optimize="ort"),
        "yobx-int4": lambda: export_yobx(model, kwargs, quantize="int4", quantize_block_size=32),
        "yobx-int4-l4": lambda: export_yobx(
            model, kwargs, quantize="int4", quantize_block_size=32, quantize_accuracy_level=4
        ),
        "yobx-ort-int4-l4": lambda: export_yobx(
            model,
            kwargs,
            optimize="ort",
            quantize="int4",
            quantize_block_size=32,
            quantize_accuracy_level=4,
        ),
        "yobx-in-out": lambda: export_in_out(model, kwargs),
        "yobx-ort-attention": lambda: export_ort_attention(model, kwargs),
        "yobx-nested": lambda: export_nested(model, kwargs),
        "yobx-ort-nested": lambda: export_nested(model, kwargs, optimize="ort"),
        "yobx-unchecked": lambda: export_yobx(model, kwargs, runtime_checks=False),
        "yobx-total": lambda: export_yobx(model, kwargs, mask="total"),
        "torch.onnx": lambda: export_torch_onnx(model, kwargs),
        "builder": lambda: export_builder(checkpoint, os.path.join(workdir, "fp32"), "fp32"),
        "builder-int4": lambda: export_builder(checkpoint, os.path.join(workdir, "int4"), "int4"),
    }
    variants, failures = {}, []
    for name in names:
        if name.startswith("builder") and not _has_genai():
            failures.append(f"{name}: skipped, onnxruntime_genai does not import")
            continue
        start = time.perf_counter()
        try:
            exported = exporters[name]()
        except Exception as exc:
            failures.append(f"{name}: export failed: {_error_line(exc)}")
            print(f"  {name:13} export failed: {_error_line(exc)}", flush=True)
            continue
        seconds = time.perf_counter() - start
        note = ""
        if isinstance(exported, tuple):
            exported, note = exported
        if isinstance(exported, str):
            proto = onnx.load(exported, load_external_data=False)
            variants[name] = Variant(name, exported, proto, seconds)
        else:
            variants[name] = Variant(name, exported.SerializeToString(), exported, seconds)
        variants[name].note = note
        print(f"  {name:13} exported in {seconds:6.1f} s {note}", flush=True)
    return variants, failures


def _error_line(exc: Exception, width: int = 220) -> str:
    """The first line of an error; for onnxruntime's, the failing node's name (yobx's
    runtime checks say there what failed), site-packages' paths shortened."""
    text = str(exc).strip()
    match = re.search(r"Name:'([^']*)'", text)
    line = match[1] if match else (text.splitlines() or [""])[0]
    line = re.sub(r"/\S*/site-packages/", "", line)
    return f"{type(exc).__name__}: {line[:width]}"


def _has_genai() -> bool:
    """Whether onnxruntime_genai (and its model builder) imports."""
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return False
    return True


def _graphs(graph: onnx.GraphProto):
    """The graph and, recursively, the subgraphs of its nodes (``If`` branches...)."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    yield from _graphs(subgraph)


def structure(proto: onnx.ModelProto) -> dict:
    """Node counts: top-level, all graphs, ``MatMulNBits``, ``MatMul`` reading an
    initializer, and the ``accuracy_level`` values of the ``MatMulNBits`` nodes."""
    graphs = list(_graphs(proto.graph))
    initializers = {init.name for graph in graphs for init in graph.initializer}
    nodes = [node for graph in graphs for node in graph.node]
    levels = set()
    for node in nodes:
        if node.op_type == "MatMulNBits":
            level = [a.i for a in node.attribute if a.name == "accuracy_level"]
            levels.add(level[0] if level else 0)
    return {
        "top": len(proto.graph.node),
        "all": len(nodes),
        "ifs": sum(node.op_type == "If" for node in nodes),
        "nbits": sum(node.op_type == "MatMulNBits" for node in nodes),
        "matmul_w": sum(
            node.op_type == "MatMul" and any(i in initializers for i in node.input)
            for node in nodes
        ),
        "levels": sorted(levels),
    }


def print_structures(variants: dict[str, Variant]) -> None:
    """One line per variant: its export time and node counts."""
    print(
        f"\n{'variant':13} {'export s':>8} {'nodes':>6} {'+If sub':>7} {'If':>3} "
        f"{'MatMulNBits':>11} {'MatMul(w)':>9}  accuracy_level"
    )
    for variant in variants.values():
        counts = structure(variant.proto)
        levels = ",".join(map(str, counts["levels"])) or "-"
        print(
            f"{variant.name:13} {variant.export_seconds:8.1f} {counts['top']:6d} "
            f"{counts['all']:7d} {counts['ifs']:3d} {counts['nbits']:11d} "
            f"{counts['matmul_w']:9d}  {levels}"
        )


def make_session(variant: Variant, threads: int) -> onnxruntime.InferenceSession:
    """A CPU session: ``threads`` intra-op threads, all graph optimizations."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    # failures are reported with the results, not logged
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(variant.source, options, providers=["CPUExecutionProvider"])


def make_feeds(session: onnxruntime.InferenceSession, inputs: dict) -> dict:
    """The session's inputs, by name, from a case's inputs; ``position_ids`` (where a
    model takes them) are derived from the mask.

    :raises ValueError: an input the script does not know how to feed
    """
    from yobx.torch.onnx.generate import mask_positions

    feeds = {}
    for value in session.get_inputs():
        dtype = _NUMPY_TYPES.get(value.type, np.float32)
        if value.name in ("input_ids", "attention_mask"):
            feeds[value.name] = inputs[value.name].astype(dtype)
        elif value.name == "position_ids":
            positions = mask_positions(inputs["attention_mask"])[:, inputs["past"] :]
            feeds[value.name] = positions.astype(dtype)
        else:
            match = next((m for p in _CACHE_NAMES if (m := p.match(value.name))), None)
            if match is None:
                raise ValueError(f"unexpected input {value.name!r} {value.shape}")
            tensors = inputs["keys" if match["kind"] == "key" else "values"]
            feeds[value.name] = tensors[int(match["layer"])].astype(dtype)
    return feeds


def eager_logits(model: torch.nn.Module, config: Any, inputs: dict) -> np.ndarray:
    """The logits of eager PyTorch on a case's inputs (a fresh cache)."""
    with torch.no_grad():
        output = model(
            input_ids=torch.from_numpy(inputs["input_ids"]),
            attention_mask=torch.from_numpy(inputs["attention_mask"]),
            cache=_cache(config, inputs["keys"], inputs["values"]),
        )
    return output.logits.float().numpy()


def check_against_eager(
    model: torch.nn.Module, config: Any, variants: dict[str, Variant], failures: list[str]
) -> None:
    """Prints, for the checked cases, each variant's max absolute error on the logits
    and the share of positions whose argmax agrees with eager PyTorch."""
    cases = [case for case in CASES if case[0] in CHECKED]
    print(f"\n{'variant':13} " + " ".join(f"{c[0] + ' err':>20} {'argmax':>7}" for c in cases))
    expected = {}
    for name, batch, seq, past in cases:
        inputs = case_inputs(config, batch, seq, past)
        expected[name] = (inputs, eager_logits(model, config, inputs))
    for variant in variants.values():
        cells = []
        for name, *_ in cases:
            inputs, logits = expected[name]
            try:
                got = variant.session.run(None, make_feeds(variant.session, inputs))[0]
            except Exception as exc:
                failures.append(f"{variant.name} [{name}] check: {_error_line(exc)}")
                cells.append(f"{'fails':>20} {'-':>7}")
                continue
            error = float(np.abs(got.astype(np.float32) - logits).max())
            agree = float((got.argmax(-1) == logits.argmax(-1)).mean())
            cells.append(f"{error:20.2e} {agree:7.0%}")
        print(f"{variant.name:13} " + " ".join(cells), flush=True)


def time_case(
    variants: dict[str, Variant], case: tuple, config: Any, warmup: int, runs: int
) -> tuple[dict[str, float], list[str]]:
    """Median latency (seconds) of each variant on a case, over all its timed sessions;
    the sessions alternate run after run. Also returns a line per variant that failed
    to run."""
    name, batch, seq, past = case
    inputs = case_inputs(config, batch, seq, past)
    feeds, failures = {}, []
    for variant in variants.values():
        try:
            feeds[variant.name] = make_feeds(variant.session, inputs)
            for session in variant.timed or [variant.session]:
                for _ in range(warmup):
                    session.run(None, feeds[variant.name])
        except Exception as exc:
            feeds.pop(variant.name, None)
            failures.append(f"{variant.name} [{name}] run: {_error_line(exc)}")
    times: dict[str, list[float]] = {key: [] for key in feeds}
    for _ in range(runs):
        for key, feed in feeds.items():
            for session in variants[key].timed or [variants[key].session]:
                start = time.perf_counter()
                session.run(None, feed)
                times[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in times.items()}, failures


def print_latencies(case: str, medians: dict[str, float], names: list[str]) -> None:
    """The rows of a case: median ms, ratio to builder and to torch.onnx."""
    for name in names:
        if name not in medians:
            print(f"{case:16} {name:13} {'fails':>9} {'-':>9} {'-':>11}")
            continue
        ms = medians[name] * 1e3
        ratios = [
            f"{medians[name] / medians[base]:.2f}" if base in medians else "-"
            for base in ("builder", "torch.onnx")
        ]
        print(f"{case:16} {name:13} {ms:9.3f} {ratios[0]:>9} {ratios[1]:>11}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="intra_op_num_threads")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--sessions", type=int, default=3, help="sessions timed per variant (medians over all)"
    )
    options = parser.parse_args()
    names = options.variants.split(",")
    known = (*VARIANTS, *OPTIONAL_VARIANTS)
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error(f"unknown variants {unknown}: choose among {','.join(known)}")
    warnings.filterwarnings("ignore")
    for logger in ("torch.onnx", "onnxscript", "onnx_ir", "torch.export", "torch._dynamo"):
        logging.getLogger(logger).setLevel(logging.ERROR)
    onnxruntime.set_default_logger_severity(4)

    config = llama_config(options.hidden, options.layers)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    print(
        f"Llama hidden {config.hidden_size}, {config.num_hidden_layers} layers, "
        f"{config.num_attention_heads} heads ({config.num_key_value_heads} kv), "
        f"vocab {VOCAB}, float32; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, onnxruntime {onnxruntime.__version__}, "
        f"{options.threads} intra-op thread(s), median of {options.runs} runs of "
        f"{options.sessions} session(s) each",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as workdir:
        checkpoint = os.path.join(workdir, "checkpoint")
        save_checkpoint(model, checkpoint)
        variants, failures = export_all(names, model, example_kwargs(config), checkpoint, workdir)
        for variant in list(variants.values()):
            try:
                variant.session = make_session(variant, options.threads)
                variant.timed = [variant.session] + [
                    make_session(variant, options.threads) for _ in range(options.sessions - 1)
                ]
            except Exception as exc:
                failures.append(f"{variant.name}: onnxruntime: {_error_line(exc)}")
                del variants[variant.name]
        print_structures(variants)
        check_against_eager(model, config, variants, failures)
        print(f"\n{'case':16} {'variant':13} {'median ms':>9} {'/builder':>9} {'/torch.onnx':>11}")
        for case in CASES:
            medians, failed = time_case(variants, case, config, options.warmup, options.runs)
            failures.extend(failed)
            print_latencies(case[0], medians, [n for n in names if n in variants])
    if failures:
        print("\nfailures:")
        for line in failures:
            print(f"  {line}")


if __name__ == "__main__":
    main()
