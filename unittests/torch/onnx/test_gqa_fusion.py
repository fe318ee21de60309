"""``yobx.torch.onnx.gqa_fusion``: under ``optimize="ort"``, the attention of a decode
step becomes onnxruntime's ``GroupQueryAttention``, exact against eager with padded
masks, and the step still serves prefill and chunked prefill."""

from __future__ import annotations

import collections
import json

import numpy as np
import onnx_ir as ir
import onnxruntime
import pytest
import torch

from yobx.torch.onnx.runtime_checks import is_check_node

transformers = pytest.importorskip("transformers")

HEADS, KV_HEADS, HEAD, LAYERS, VOCAB = 4, 2, 16, 2, 100


def _config():
    return transformers.LlamaConfig(
        hidden_size=HEADS * HEAD,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        pad_token_id=0,
    )


def _inputs(config, batch: int, seq: int, past: int, padding: int, seed: int) -> dict:
    """Random ids and cache; the last row left-padded by ``padding`` positions."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones((batch, past + seq), dtype=torch.int64)
    mask[-1, :padding] = 0
    shape = (batch, KV_HEADS, past, HEAD)
    keys = [torch.randn(shape, generator=generator) for _ in range(LAYERS)]
    values = [torch.randn(shape, generator=generator) for _ in range(LAYERS)]
    return {
        "input_ids": torch.randint(1, VOCAB, (batch, seq), generator=generator),
        "attention_mask": mask,
        "keys": keys,
        "values": values,
    }


def _cache(config, keys, values):
    cache = transformers.DynamicCache(config=config)
    for layer, (key, value) in enumerate(zip(keys, values)):
        if key.shape[2]:
            cache.update(key.clone(), value.clone(), layer)
    return cache


def _feeds(inputs: dict) -> dict:
    """The ONNX model's inputs: ids, mask and the cache interleaved per layer."""
    feeds = {
        "input_ids": inputs["input_ids"].numpy(),
        "attention_mask": inputs["attention_mask"].numpy(),
    }
    for layer in range(LAYERS):
        feeds[f"past_key_values.{layer}.key"] = inputs["keys"][layer].numpy()
        feeds[f"past_key_values.{layer}.value"] = inputs["values"][layer].numpy()
    return feeds


def _export(seed: int, mask: str, **options):
    """A tiny Llama (``seed``) and its decode step exported with ``optimize="ort"`` and
    ``options``, the mask's length declared ``mask``."""
    from yobx.torch.onnx import to_onnx
    from yobx.torch.tracing.inputs import cache_dynamic_shapes

    config = _config()
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    example = _inputs(config, 2, 3, 5, 0, 0)
    cache = _cache(config, example["keys"], example["values"])
    kwargs = {
        "input_ids": example["input_ids"],
        "attention_mask": example["attention_mask"],
        "cache": cache,
    }
    shapes = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: mask},
        "cache": cache_dynamic_shapes(cache, {0: "batch", 2: "past"}),
    }
    result = to_onnx(model, (), kwargs, dynamic_shapes=shapes, optimize="ort", **options)
    return config, model, result


@pytest.fixture(scope="module")
def exported():
    config, model, result = _export(0, "total")
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return config, model, result, session


def test_the_attention_of_each_version_is_fused(exported):
    _, _, result, _ = exported
    fusions = next(s for s in result.stages if s.name == "fuse").args["fusions"]
    assert fusions.get("group_query_attention", 0) >= LAYERS, fusions
    ops = collections.Counter(
        node.op_type for node in ir.traversal.RecursiveGraphIterator(result.model.graph)
    )
    assert ops["GroupQueryAttention"] >= LAYERS, ops


def test_the_operator_s_sizes_are_computed_once_for_all_layers(exported):
    # read on the inputs naming the dimensions, in the main graph: every layer's
    # operator (in any branch) reads the same lengths (gqa_sizes)
    _, _, result, _ = exported
    operators = [
        node
        for node in ir.traversal.RecursiveGraphIterator(result.model.graph)
        if node.op_type == "GroupQueryAttention"
    ]
    # one set for the version of one token (seq is 1 there), one for any number
    lengths = {(id(node.inputs[5]), id(node.inputs[6])) for node in operators}
    assert len(operators) >= 2 * LAYERS and len(lengths) == 2, len(lengths)
    assert all(node.inputs[5].graph is result.model.graph for node in operators)


@pytest.mark.parametrize(
    ("batch", "seq", "past", "padding"),
    [
        (2, 1, 6, 2),  # decode, the last row left-padded
        (3, 1, 9, 0),  # decode
        (1, 1, 4, 0),
        (2, 1, 0, 0),  # one token, empty cache
        (2, 5, 0, 2),  # prefill, left-padded
        (2, 3, 4, 1),  # chunked prefill, batch of two
    ],
)
def test_matches_eager_with_padded_masks(exported, batch, seq, past, padding):
    config, model, _, session = exported
    inputs = _inputs(config, batch, seq, past, padding, seed=batch * 100 + seq * 10 + past)
    with torch.no_grad():
        expected = model(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            past_key_values=_cache(config, inputs["keys"], inputs["values"]),
            use_cache=True,
        )
    feeds = _feeds(inputs)
    names = [output.name for output in session.get_outputs()]
    got = dict(zip(names, session.run(None, feeds)))
    # every position: padded query rows too (their attention is zeroed by the model's
    # own treatment of fully masked rows, kept around the fused operator)
    np.testing.assert_allclose(got["logits"], expected.logits.numpy(), atol=1e-4, rtol=1e-4)
    for layer in range(LAYERS):
        present = expected.past_key_values.layers[layer]
        np.testing.assert_allclose(got[f"present.{layer}.key"], present.keys.numpy(), atol=1e-5)
        np.testing.assert_allclose(got[f"present.{layer}.value"], present.values.numpy(), atol=1e-5)


def test_a_decode_step_runs_the_fused_operator(exported, tmp_path):
    config, _, result, _ = exported
    inputs = _inputs(config, 2, 1, 6, 2, seed=1)
    feeds = _feeds(inputs)
    options = onnxruntime.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    session.run(None, feeds)
    with open(session.end_profiling()) as stream:
        events = json.load(stream)
    ran = collections.Counter(
        event["args"].get("op_name") for event in events if event.get("cat") == "Node"
    )
    assert ran["GroupQueryAttention"] >= LAYERS, ran
    assert not ran["Softmax"], ran


class RepeatedCacheAttention(torch.nn.Module):
    """One attention layer written without transformers: the cache concatenated, then
    repeated per head of a group for any number of tokens (no one-token version), a
    float mask from the padding and causality."""

    def __init__(self, total_from_keys: bool = False):
        super().__init__()
        self.total_from_keys = total_from_keys
        self.q = torch.nn.Linear(HEADS * HEAD, HEADS * HEAD)
        self.kv = torch.nn.Linear(HEADS * HEAD, 2 * KV_HEADS * HEAD)

    def forward(self, x, attention_mask, past_key_values):
        batch, seq, _ = x.shape
        ((past_key, past_value),) = past_key_values  # the legacy form: a pair per layer
        q = self.q(x).view(batch, seq, HEADS, HEAD).transpose(1, 2)
        k, v = self.kv(x).view(batch, seq, 2, KV_HEADS, HEAD).unbind(2)
        key = torch.cat([past_key, k.transpose(1, 2)], dim=2)
        value = torch.cat([past_value, v.transpose(1, 2)], dim=2)
        # the length of the cache as transformers reads it, before the attention, or
        # from the concatenated keys (then the mask is computed from the present cache,
        # which the operator writes: not fused)
        total = key.shape[2] if self.total_from_keys else past_key.shape[2] + seq
        groups = HEADS // KV_HEADS
        keys = key[:, :, None].expand(batch, KV_HEADS, groups, total, HEAD)
        values = value[:, :, None].expand(batch, KV_HEADS, groups, total, HEAD)
        keys = keys.reshape(batch, HEADS, total, HEAD)
        values = values.reshape(batch, HEADS, total, HEAD)
        positions = torch.arange(seq)[:, None] + (total - seq)
        allowed = (torch.arange(total)[None, :] <= positions)[None, None]
        allowed = allowed & attention_mask.bool()[:, None, None, :]
        # the smallest float, as transformers' eager masks (a row of -inf is NaN in eager)
        bias = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=bias)
        return out.transpose(1, 2).reshape(batch, seq, HEADS * HEAD), key, value


def _layer_inputs(batch: int, seq: int, past: int, padding: int) -> tuple:
    mask = torch.ones((batch, past + seq), dtype=torch.int64)
    mask[-1, :padding] = 0
    cache = (torch.randn(batch, KV_HEADS, past, HEAD), torch.randn(batch, KV_HEADS, past, HEAD))
    return (torch.randn(batch, seq, HEADS * HEAD), mask, (cache,))


_LAYER_SHAPES = (
    {0: "batch", 1: "seq"},
    {0: "batch", 1: "total"},
    (({0: "batch", 2: "past"},) * 2,),
)
_LAYER_CASES = [(2, 1, 5, 2), (3, 1, 7, 0), (2, 4, 3, 1), (2, 3, 0, 1)]


def _check_layer(model, session) -> None:
    names = [i.name for i in session.get_inputs()]
    for batch, seq, past, padding in _LAYER_CASES:
        example = _layer_inputs(batch, seq, past, padding)
        with torch.no_grad():
            expected = model(*example)
        x, mask, ((key, value),) = example
        feeds = dict(zip(names, [t.numpy() for t in (x, mask, key, value)]))
        got = session.run(None, feeds)
        for mine, theirs in zip(got, expected):
            np.testing.assert_allclose(mine, theirs.numpy(), atol=1e-5, rtol=1e-5)


def test_the_if_form_chooses_the_operator_for_one_token(tmp_path):
    from yobx.torch.onnx import to_onnx

    torch.manual_seed(0)
    model = RepeatedCacheAttention().eval()
    example = _layer_inputs(2, 3, 4, 0)
    result = to_onnx(model, example, dynamic_shapes=_LAYER_SHAPES, optimize="ort")
    fusions = next(s for s in result.stages if s.name == "fuse").args["fusions"]
    assert fusions.get("group_query_attention") == 1, fusions
    (choice,) = [n for n in result.model.graph if n.op_type == "If" and not is_check_node(n)]
    assert choice.name.startswith("yobx_gqa")
    options = onnxruntime.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    _check_layer(model, session)
    with open(session.end_profiling()) as stream:
        events = json.load(stream)
    ran = collections.Counter(
        event["args"].get("op_name") for event in events if event.get("cat") == "Node"
    )
    # the two one-token cases ran the operator, the two prompts the model's own nodes
    assert ran["GroupQueryAttention"] == 2, ran
    assert ran["Softmax"] == 2, ran


def test_a_mask_computed_from_the_present_cache_is_not_fused():
    from yobx.torch.onnx import to_onnx

    torch.manual_seed(0)
    model = RepeatedCacheAttention(total_from_keys=True).eval()
    example = _layer_inputs(2, 3, 4, 0)
    result = to_onnx(model, example, dynamic_shapes=_LAYER_SHAPES, optimize="ort")
    fusions = next(s for s in result.stages if s.name == "fuse").args["fusions"]
    assert "group_query_attention" not in fusions, fusions
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    _check_layer(model, session)


def test_the_trees_of_the_versions_run_as_one_if(exported):
    # the stretches where the versions differ (how each layer reshapes its keys and
    # values, ...) are trees of nested If nodes with few distinct leaves: each runs as
    # one If (yobx.torch.onnx.if_trees); the values above are computed that way
    _, _, result, _ = exported
    fuse = next(s for s in result.stages if s.name == "fuse").args
    assert fuse["if_trees_collapsed"] >= 2 * LAYERS, fuse
    main = [n for n in result.model.graph if n.op_type == "If" and not is_check_node(n)]
    selectors = [node for node in main if node.name.startswith("yobx_path")]
    chosen = [node for node in main if node.name.startswith("yobx_leaves")]
    assert selectors and len(chosen) >= 2 * LAYERS, [node.name for node in main]
    for node in chosen:
        for attribute in ("then_branch", "else_branch"):
            # a leaf, or the next If of the chain between three leaves or more
            inner = [n for n in node.attributes[attribute].value if n.op_type == "If"]
            assert all(n.name.startswith("yobx_leaves") for n in inner), inner


def test_a_quantized_step_reads_its_fused_projection_packed():
    # quantize="int4": the queries', keys' and values' products are one MatMulNBits
    # (sibling_products), which the operator reads packed; exact against eager on the
    # dequantized weights, padded rows and prompts included
    from yobx.torch.onnx.quantize import computing_as

    config, model, result = _export(1, "past + seq", quantize="int4")
    operators = [
        node
        for node in ir.traversal.RecursiveGraphIterator(result.model.graph)
        if node.op_type == "GroupQueryAttention"
    ]
    packed = [node for node in operators if node.inputs[1] is None and node.inputs[2] is None]
    assert packed and all(n.inputs[0].producer().op_type == "MatMulNBits" for n in packed)
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [output.name for output in session.get_outputs()]
    for batch, seq, past, padding in [(2, 1, 6, 2), (3, 1, 9, 0), (2, 5, 0, 2)]:
        inputs = _inputs(config, batch, seq, past, padding, seed=batch + seq + past)
        got = dict(zip(names, session.run(None, _feeds(inputs))))
        with torch.no_grad(), computing_as(model, result.model):
            expected = model(
                input_ids=inputs["input_ids"],
                attention_mask=inputs["attention_mask"],
                past_key_values=_cache(config, inputs["keys"], inputs["values"]),
                use_cache=True,
            )
        np.testing.assert_allclose(got["logits"], expected.logits.numpy(), atol=1e-4, rtol=1e-4)
