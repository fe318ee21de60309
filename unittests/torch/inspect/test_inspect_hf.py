"""record_run on a tiny Hugging Face Llama (random weights, no download)."""

import pytest
import torch

from yobx.torch.inspect import compare, record_run, tensor_digest

transformers = pytest.importorskip("transformers")

LEAVES = [
    "model.embed_tokens",
    "model.rotary_emb",
    "model.layers.0.input_layernorm",
    "model.layers.0.self_attn.q_proj",
    "model.layers.0.self_attn.k_proj",
    "model.layers.0.self_attn.v_proj",
    "model.layers.0.self_attn.o_proj",
    "model.layers.0.post_attention_layernorm",
    "model.layers.0.mlp.gate_proj",
    "model.layers.0.mlp.act_fn",
    "model.layers.0.mlp.up_proj",
    "model.layers.0.mlp.down_proj",
    "model.norm",
    "lm_head",
]


@pytest.fixture(scope="module")
def llama():
    config = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        vocab_size=100,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    input_ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    return model, input_ids


def test_eager_stage_of_tiny_llama(llama):
    model, input_ids = llama
    result = record_run(model, input_ids=input_ids, use_cache=False, stages=["eager"])
    assert [c.name for c in result.eager] == LEAVES
    shapes = {c.name: c.retval.shape for c in result.eager if c.name.endswith("_proj")}
    assert shapes["model.layers.0.self_attn.q_proj"] == (2, 7, 32)
    assert shapes["model.layers.0.self_attn.k_proj"] == (2, 7, 16)
    assert shapes["model.layers.0.mlp.gate_proj"] == (2, 7, 64)
    with torch.no_grad():
        embeddings = model.model.embed_tokens(input_ids)
        expected = model(input_ids=input_ids, use_cache=False).logits
    embed = result.eager["model.embed_tokens"][0]
    assert embed.params["input"].digest == tensor_digest(input_ids)
    assert embed.retval.digest == tensor_digest(embeddings)
    assert result.eager.outputs[0]["logits"].digest == tensor_digest(expected)
    rotary = result.eager["model.rotary_emb"][0].retval
    assert isinstance(rotary, tuple) and [r.shape for r in rotary] == [(1, 7, 16), (1, 7, 16)]
    assert result.eager.lm_head[0].params.input.shape == (2, 7, 32)
    with pytest.raises(KeyError, match="Did you mean 'lm_head'"):
        result.eager["lm_heads"]


def test_graph_from_torch_export_matches_eager(llama):
    model, input_ids = llama
    kwargs = {"input_ids": input_ids, "use_cache": False}
    gm = torch.export.export(model, (), kwargs).module()
    result = record_run(model, graph_module=gm, **kwargs)
    assert len(result.graph) > len(result.eager)
    comparison = compare(result.eager, result.graph)
    assert comparison.ok
    matched = {c.name for c in comparison.calls if c.call_a is not None}
    # Inlined leaf modules are matched through nn_module_stack.
    assert {"model.layers.0.self_attn.q_proj", "lm_head", "model.norm"} <= matched
    logits = result.graph.outputs[0]
    leaves = logits if isinstance(logits, (list, tuple)) else list(logits.values())
    assert leaves[0].digest == result.eager.outputs[0]["logits"].digest


def test_graph_from_custom_tracer(llama):
    model, input_ids = llama
    result = record_run(model, input_ids=input_ids, use_cache=False)
    assert result.graph.outputs[0] is not None
    comparison = result.compare("eager", "graph")
    assert comparison.ok
    matched = [c for c in comparison.calls if c.call_a is not None]
    assert len(matched) >= 10
