"""``optimize="ort"`` on the decode step of several decoder families, against eager.

Each family (tiny configuration: 4 heads, 2 key-value heads, head 16, 2 layers) is
exported with a ``DynamicCache`` and dynamic batch, sequence and past, with
``optimize="ort"``; then onnxruntime runs a decode step with a left-padded row, a
decode step at batch 3, a left-padded prefill and a chunked prefill at batch 2, and the
logits are compared with eager. onnxruntime's profile says which attention ran: the
fused ``GroupQueryAttention`` (:mod:`yobx.torch.onnx.gqa_fusion`, one token) or the
model's own ``Softmax`` (prompts, and families whose attention is not fused, such as
Gemma 2's soft-capped scores)::

    python _scripts/check_ort_decode_families.py [--time RUNS] [FAMILY ...]

A line per family: the attentions fused (and how many of them rotate the queries and
keys themselves), the operators that ran, the largest absolute
difference with eager over the four cases. With ``--time``, the family is also exported
with the default optimizer, and both models run a decode step (batch 1, one token, a
past of 128) and a prefill (batch 1, 32 tokens) alternately, one thread, ``RUNS``
times after a warm-up: the line ends with the medians' ratio ``optimize="ort"`` /
default for each (issue #32 asks for ``optimize="ort"`` never slower than the default).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import onnx_ir as ir
import onnxruntime
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HEADS, KV_HEADS, HEAD, LAYERS, VOCAB = 4, 2, 16, 2, 100
#: StableLm and Phi rotate part of each head, Cohere interleaves the halves: the
#: operator must leave their rotation to the model (``rotating 0``); Olmo2 normalizes
#: the queries and keys before rotating them (yobx.torch.onnx.gqa_rotary)
FAMILIES = (
    "Llama",
    "Qwen2",
    "Qwen3",
    "Mistral",
    "Phi3",
    "Gemma",
    "Gemma2",
    "Granite",
    "StableLm",
    "Phi",
    "Cohere",
    "Olmo2",
    "Starcoder2",
)
#: batch, new tokens, past tokens, left padding of the last row
CASES = ((2, 1, 6, 2), (3, 1, 9, 0), (2, 5, 0, 2), (2, 3, 4, 1))


def config_for(family: str) -> transformers.PretrainedConfig:
    """The family's configuration, tiny."""
    return getattr(transformers, f"{family}Config")(
        hidden_size=HEADS * HEAD,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD,
        vocab_size=VOCAB,
        pad_token_id=0,
    )


def case_inputs(batch: int, seq: int, past: int, padding: int, seed: int) -> dict:
    """Random ids and cache, the last row left-padded by ``padding`` positions."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones((batch, past + seq), dtype=torch.int64)
    mask[-1, :padding] = 0
    shape = (batch, KV_HEADS, past, HEAD)
    return {
        "input_ids": torch.randint(1, VOCAB, (batch, seq), generator=generator),
        "attention_mask": mask,
        "keys": [torch.randn(shape, generator=generator) for _ in range(LAYERS)],
        "values": [torch.randn(shape, generator=generator) for _ in range(LAYERS)],
    }


def make_cache(config: transformers.PretrainedConfig, keys: list, values: list) -> object:
    """A ``DynamicCache`` holding ``keys`` and ``values`` (none when they are empty)."""
    cache = transformers.DynamicCache(config=config)
    for layer, (key, value) in enumerate(zip(keys, values)):
        if key.shape[2]:
            cache.update(key.clone(), value.clone(), layer)
    return cache


def feeds_of(inputs: dict) -> dict:
    """The ONNX model's inputs: ids, mask and the cache interleaved per layer."""
    feeds = {
        "input_ids": inputs["input_ids"].numpy(),
        "attention_mask": inputs["attention_mask"].numpy(),
    }
    for layer in range(LAYERS):
        feeds[f"past_key_values.{layer}.key"] = inputs["keys"][layer].numpy()
        feeds[f"past_key_values.{layer}.value"] = inputs["values"][layer].numpy()
    return feeds


def ort_over_default(model: torch.nn.Module, kwargs: dict, shapes: dict, ort, runs: int) -> str:
    """``optimize="ort"`` / default, median latencies of a decode step and a prefill
    (sessions alternating, one thread)."""
    from yobx.torch.onnx import to_onnx

    default = to_onnx(model, (), kwargs, dynamic_shapes=shapes).model_proto
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = [
        onnxruntime.InferenceSession(
            p.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        for p in (ort, default)
    ]
    ratios = []
    for label, case in (("decode", (1, 1, 128, 0)), ("prefill", (1, 32, 0, 0))):
        feeds = feeds_of(case_inputs(*case, seed=1))
        times: list[list[float]] = [[], []]
        for index in range(runs + 3):
            for session, spent in zip(sessions, times):
                start = time.perf_counter()
                session.run(None, feeds)
                if index >= 3:
                    spent.append(time.perf_counter() - start)
        medians = [statistics.median(spent) for spent in times]
        ratios.append(f"{label} {medians[0] / medians[1]:.2f}")
    return "  ort/default " + " ".join(ratios)


def check_family(family: str, profile_dir: str, runs: int = 0) -> str:
    """The report line of one family (timed against the default optimizer when
    ``runs``)."""
    from yobx.torch.onnx import to_onnx
    from yobx.torch.tracing.inputs import cache_dynamic_shapes

    config = config_for(family)
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config).eval()
    example = case_inputs(2, 3, 5, 0, 0)
    cache = make_cache(config, example["keys"], example["values"])
    kwargs = {
        "input_ids": example["input_ids"],
        "attention_mask": example["attention_mask"],
        "cache": cache,
    }
    shapes = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "cache": cache_dynamic_shapes(cache, {0: "batch", 2: "past"}),
    }
    result = to_onnx(model, (), kwargs, dynamic_shapes=shapes, optimize="ort")
    fusions = next(s for s in result.stages if s.name == "fuse").args["fusions"]
    options = onnxruntime.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(profile_dir, family)
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [output.name for output in session.get_outputs()]
    worst = 0.0
    for case in CASES:
        inputs = case_inputs(*case, seed=sum(case))
        with torch.no_grad():
            expected = model(
                input_ids=inputs["input_ids"],
                attention_mask=inputs["attention_mask"],
                past_key_values=make_cache(config, inputs["keys"], inputs["values"]),
                use_cache=True,
            )
        got = dict(zip(names, session.run(None, feeds_of(inputs))))
        worst = max(worst, float(np.abs(got["logits"] - expected.logits.numpy()).max()))
    with open(session.end_profiling()) as stream:
        events = json.load(stream)
    ran = collections.Counter(e["args"].get("op_name") for e in events if e.get("cat") == "Node")
    timed = ""
    if runs:
        # a cache of its own for the second export (a capture runs the model on it)
        fresh = {**kwargs, "cache": make_cache(config, example["keys"], example["values"])}
        timed = ort_over_default(model, fresh, shapes, result.model_proto, runs)
    # the attentions rotating their queries and keys themselves (.gqa_rotary)
    rotating = sum(
        node.op_type == "GroupQueryAttention" and node.attributes.get_int("do_rotary", 0) == 1
        for node in ir.traversal.RecursiveGraphIterator(result.model.graph)
    )
    return (
        f"{family:10s} fused {fusions.get('group_query_attention', 0):3d} "
        f"(rotating {rotating:3d})  "
        f"ran GroupQueryAttention {ran['GroupQueryAttention']:3d} Softmax {ran['Softmax']:3d}  "
        f"max error {worst:.2e}{timed}"
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", default=list(FAMILIES))
    parser.add_argument(
        "--time", type=int, default=0, metavar="RUNS", help="time against the default"
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as profile_dir:
        for family in args.families:
            try:
                print(check_family(family, profile_dir, args.time), flush=True)
            except Exception as exc:  # a report line per family, whatever fails
                print(f"{family:10s} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
