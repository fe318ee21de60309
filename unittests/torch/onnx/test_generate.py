"""An export for generation generates what the model generates: one ONNX graph of a
decode step with its cache serves the prefill (empty cache) and the decode (one
token), and greedy decoding with it in onnxruntime gives ``model.generate``'s tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from yobx.models.huggingface import hf_generation_model
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.generate import GenerationError, generate


@pytest.fixture(scope="module")
def exported():
    model, args, kwargs, dynamic_shapes = hf_generation_model("LlamaForCausalLM")
    result = to_onnx(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    return model, result


def _expected(model, ids, mask, new_tokens):
    with torch.no_grad():
        return model.generate(
            ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False
        ).numpy()


def test_inputs_and_outputs_follow_the_hugging_face_convention(exported):
    _, result = exported
    assert result.input_names == [
        "input_ids",
        "attention_mask",
        "position_ids",
        "past_key_values.0.key",
        "past_key_values.0.value",
        "past_key_values.1.key",
        "past_key_values.1.value",
    ]
    # in the order of the output's pytree flattening (yobx's or transformers' exporters')
    assert result.output_names[0] == "logits"
    assert sorted(result.output_names[1:5]) == [
        f"present.{layer}.{kind}" for layer in (0, 1) for kind in ("key", "value")
    ]
    shapes = {v.name: [str(d) for d in v.shape] for v in result.model.graph.outputs}
    assert shapes["present.0.key"][2] == "past+seq"
    # nothing refuses a prefill (past = 0) or a decode step (seq = 1)
    checked = {c.expression.split(" when ")[0] for c in result.runtime_checks}
    assert not checked & {"past >= 1", "seq >= 2", "seq != 1", "total >= 2"}, checked


@pytest.mark.parametrize(("batch", "seq"), [(2, 4), (1, 1), (3, 2)])
def test_greedy_generation_gives_the_model_s_tokens(exported, batch, seq):
    model, result = exported
    ids = torch.randint(3, 99, (batch, seq), generator=torch.Generator().manual_seed(seq))
    mask = torch.ones_like(ids)
    eos = model.generation_config.eos_token_id
    expected = _expected(model, ids, mask, 10)
    got = generate(result, ids, 10, eos_token_id=eos)
    np.testing.assert_array_equal(expected, got)


def test_left_padded_prompts_give_the_model_s_tokens(exported):
    # positions start after the padding: generate computes them from the mask, as
    # transformers' generate does, and the exported step takes them as an input
    model, result = exported
    ids = torch.tensor([[0, 0, 17, 42, 5], [23, 8, 61, 9, 30]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    expected = _expected(model, ids, mask, 8)
    got = generate(result, ids, 8, attention_mask=mask, eos_token_id=None)
    np.testing.assert_array_equal(expected, got)


def _llama_with_heads_of_16():
    """A tiny Llama (sdpa attention) whose heads of 16 onnxruntime's kernel rotates
    itself, with the generation step's inputs (``position_ids`` among them)."""
    import transformers

    from yobx.torch.tracing.inputs import cache_dynamic_shapes

    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    cache = transformers.DynamicCache(config=config)
    for layer in range(2):
        cache.update(torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16), layer)
    kwargs = {
        "input_ids": torch.randint(3, 99, (2, 3)),
        "attention_mask": torch.ones((2, 8), dtype=torch.int64),
        "position_ids": torch.arange(5, 8)[None].expand(2, 3).contiguous(),
        "cache": cache,
    }
    shapes = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "seq"},
        "cache": cache_dynamic_shapes(cache, {0: "batch", 2: "past"}),
    }
    return model, (), kwargs, shapes


@pytest.mark.parametrize("family", ["hf-tiny", "heads-of-16"])
def test_the_step_fused_for_onnxruntime_generates_the_model_s_tokens(family):
    """``optimize="ort"``: one token runs GroupQueryAttention (transformers' eager
    attention for ``hf-tiny``, sdpa otherwise). With heads of 16 it rotates the queries
    and keys itself with each row's positions (left padding shifts them)."""
    import onnx_ir as ir

    if family == "hf-tiny":
        model, args, kwargs, dynamic_shapes = hf_generation_model("LlamaForCausalLM")
    else:
        model, args, kwargs, dynamic_shapes = _llama_with_heads_of_16()
    result = to_onnx(model, args, kwargs, dynamic_shapes=dynamic_shapes, optimize="ort")
    fused = [
        n
        for n in ir.traversal.RecursiveGraphIterator(result.model.graph)
        if n.op_type == "GroupQueryAttention"
    ]
    assert fused
    rotates = {n.attributes.get_int("do_rotary", 0) for n in fused}
    assert rotates == {int(family == "heads-of-16")}, rotates
    ids = torch.tensor([[0, 0, 17, 42, 5], [23, 8, 61, 9, 30], [0, 0, 0, 0, 77]])
    mask = (ids != 0).long()
    expected = _expected(model, ids, mask, 8)
    got = generate(result, ids, 8, attention_mask=mask, eos_token_id=None)
    np.testing.assert_array_equal(expected, got)


def test_a_model_without_a_cache_is_refused_with_what_to_do():
    model, _, kwargs, dynamic_shapes = _no_cache_model()
    result = to_onnx(model, (), kwargs, dynamic_shapes=dynamic_shapes)
    with pytest.raises(GenerationError, match="export the step with its cache"):
        generate(result, kwargs["input_ids"], 3)


def _no_cache_model():
    from yobx.models.huggingface import hf_model

    return hf_model("LlamaForCausalLM")


def test_an_architecture_without_a_cache_is_refused():
    with pytest.raises(ValueError, match="takes no past_key_values"):
        hf_generation_model("ViTModel")


def test_the_example_is_one_consistent_step():
    # the eager check of the example runs on a copy: a step appends to its cache, and
    # the example would then hold a mask shorter than the cache and the new tokens
    _, _, kwargs, dynamic_shapes = hf_generation_model("LlamaForCausalLM", batch=2, seq=3, past=5)
    cache = kwargs["cache"]
    assert [tuple(layer.keys.shape) for layer in cache.layers] == [(2, 2, 5, 8)] * 2
    assert kwargs["attention_mask"].shape == (2, 8) and kwargs["input_ids"].shape == (2, 3)
    assert kwargs["position_ids"].tolist() == [[5, 6, 7], [5, 6, 7]]
    # one entry per tensor of the cache, in the structure of its pytree flattening
    entries = pytree.tree_leaves(dynamic_shapes["cache"], is_leaf=lambda x: isinstance(x, dict))
    assert entries == [{0: "batch", 2: "past"}] * 4


def test_a_sliding_window_cache_generates_until_its_window_is_full():
    # Cohere2's sliding-window layers count the positions they saw
    # (`cumulative_length`, which their masks read): the keys' length until the
    # window is full, then unknown; the step is exact until then and refuses after
    import transformers

    from yobx.models.huggingface import tiny_config

    config = tiny_config("Cohere2ForCausalLM")
    config.sliding_window = 12
    config.use_cache = True
    torch.manual_seed(0)
    model = transformers.Cohere2ForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    assert any(layer.is_sliding for layer in transformers.DynamicCache(config=config).layers)
    generator = torch.Generator().manual_seed(0)
    cache = transformers.DynamicCache(config=config)
    for layer in range(config.num_hidden_layers):
        keys, values = (torch.randn(2, 2, 3, 8, generator=generator) for _ in "kv")
        cache.update(keys, values, layer)
    kwargs = {
        "input_ids": torch.randint(3, 99, (2, 2), generator=generator),
        "attention_mask": torch.ones(2, 5, dtype=torch.int64),
        "cache": cache,
    }
    from yobx.torch.tracing.inputs import cache_dynamic_shapes

    shapes = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "cache": cache_dynamic_shapes(cache, {0: "batch", 2: "past"}),
    }
    result = to_onnx(model, (), kwargs, dynamic_shapes=shapes)
    ids = torch.randint(3, 99, (2, 4), generator=generator)
    # 4 + 6 tokens: the cache holds at most 9 when the last one is chosen
    got = generate(result, ids, 6, eos_token_id=None)
    assert (got == _expected(model, ids, torch.ones_like(ids), 6)).all()
    with pytest.raises(Exception, match=r"yobx check failed: torch._check\(past < 11\)"):
        generate(result, ids, 10, eos_token_id=None)
