"""yobx as a backend of ``transformers.exporters``: ``export`` and
``export_for_generation`` through ``YobxExporter``, the exported model run by
transformers' ONNX runner, compared with eager at other sizes, its greedy tokens with
``model.generate``, and saved then loaded with ``ExportedModel``."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.exporters")

from transformers.exporters import ExportedModel  # noqa: E402

from yobx.integrations.transformers import (  # noqa: E402
    YobxExportConfig,
    YobxExporter,
    greedy_generate,
)
from yobx.models.huggingface import tiny_config  # noqa: E402


def _model(architecture: str, **overrides):
    config = tiny_config(architecture)
    config.use_cache = True
    for name, value in overrides.items():
        setattr(config, name, value)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return getattr(transformers, architecture)(config).eval()


def _prompt(vocab: int, batch: int, seq: int, padded: bool = True):
    generator = torch.Generator().manual_seed(batch * 10 + seq)
    ids = torch.randint(3, vocab, (batch, seq), generator=generator)
    mask = torch.ones((batch, seq), dtype=torch.int64)
    if padded and batch > 1:
        mask[0, :2] = 0  # left padding, as generate pads
    return ids, mask


@pytest.mark.parametrize(
    ("architecture", "output"),
    [("BertModel", "last_hidden_state"), ("LlamaForCausalLM", "logits")],
)
def test_export_runs_at_other_sizes_like_the_model(architecture, output):
    model = _model(architecture, use_cache=False)
    ids, mask = _prompt(model.config.vocab_size, 2, 5, padded=False)
    exported = YobxExporter().export(model, {"input_ids": ids, "attention_mask": mask}, {})
    assert list(exported.components) == ["model"]
    names = [value.name for value in exported.program.graph.inputs]
    assert names == ["input_ids", "attention_mask"]
    for batch, seq in [(2, 5), (3, 9), (1, 2)]:
        ids, mask = _prompt(model.config.vocab_size, batch, seq)
        with torch.no_grad():
            expected = getattr(model(input_ids=ids, attention_mask=mask), output)
        got = getattr(exported(input_ids=ids, attention_mask=mask), output)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def llama_for_generation():
    model = _model("LlamaForCausalLM")
    ids, mask = _prompt(model.config.vocab_size, 2, 5)
    exported = YobxExporter().export_for_generation(
        model, {"input_ids": ids, "attention_mask": mask}, YobxExportConfig()
    )
    return model, exported


def test_generation_components_take_the_runner_s_names(llama_for_generation):
    _, exported = llama_for_generation
    assert list(exported.components) == ["prefill", "decode"]
    decode = exported.components["decode"].program.graph
    assert [v.name for v in decode.inputs] == [
        "input_ids",
        "attention_mask",
        "position_ids",
        "cache.layers.0.keys",
        "cache.layers.0.values",
        "cache.layers.1.keys",
        "cache.layers.1.values",
    ]
    assert [v.name for v in decode.outputs][:3] == ["logits", "present.0.key", "present.0.value"]
    # one graph for one token and for several: the sequence stays dynamic
    assert decode.inputs[0].shape[1] == "seq"
    assert decode.inputs[3].shape[2] == "past"
    # the mask spans the cache and the new tokens, as generation passes it: the graph
    # has no version for a longer or a shorter one
    assert str(decode.inputs[1].shape[1]) == "past+seq"
    assert str(exported.components["prefill"].program.graph.inputs[1].shape[1]) == "seq"


def test_the_decode_step_runs_several_tokens_on_a_cache(llama_for_generation):
    model, exported = llama_for_generation
    ids, mask = _prompt(model.config.vocab_size, 2, 4, padded=False)
    with torch.no_grad():
        prefill = model(input_ids=ids, attention_mask=mask)
    new = torch.randint(3, model.config.vocab_size, (2, 3))
    inputs = {
        "input_ids": new,
        "attention_mask": torch.ones((2, 7), dtype=torch.int64),
        "position_ids": torch.arange(4, 7).repeat(2, 1),
    }
    got = exported.runners["decode"](cache=copy.deepcopy(prefill.past_key_values), **inputs)
    with torch.no_grad():
        expected = model(cache=prefill.past_key_values, **inputs)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-4, rtol=1e-4)
    key = got.past_key_values.layers[1].keys
    torch.testing.assert_close(key, expected.past_key_values.layers[1].keys)


def _assert_generates_the_model_s_tokens(model, exported):
    """Greedy tokens from the exported components equal ``model.generate``'s, batch 1
    and 2 (left-padded), 8 new tokens."""
    generation = model.generation_config
    for batch in (1, 2):
        ids, mask = _prompt(model.config.vocab_size, batch, 6)
        expected = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False
        )
        # generate stops a row at the configuration's end token and pads it after
        # (min_new_tokens would ban that token, which the greedy loop picks)
        got = greedy_generate(
            exported,
            ids,
            mask,
            max_new_tokens=8,
            eos_token_id=generation.eos_token_id,
            pad_token_id=generation.pad_token_id,
        )
        assert torch.equal(got, expected), (type(model).__name__, batch)


# Qwen2 and Gemma generate through to_onnx in unittests/torch/onnx/test_generate.py;
# GPT-2 with sdpa attention decides `q_length == 1` and reshapes by -1 (eager fails at
# seq == 0, the nearest size of the single-token side)
# Cohere2's sliding-window layers keep their count of positions seen as an int, which
# transformers' flattening holds as a constant of the example: it follows the keys
# Mamba's state-space layers write their conv and recurrent states into the cache in
# place, and take no attention mask (a None between the cache tensors it writes and
# reads); RWKV keeps its state in a list of tensors of its own (`state`, returned and
# taken back), and its time shift writes into a padded copy of its input; OpenAI GPT
# takes the cache generate passes and ignores it: the sequence runs again
@pytest.mark.parametrize(
    ("architecture", "attention"),
    [
        ("LlamaForCausalLM", "eager"),
        ("GPT2LMHeadModel", "sdpa"),
        ("Cohere2ForCausalLM", "sdpa"),
        ("MambaForCausalLM", "eager"),
        ("RwkvForCausalLM", "eager"),
        ("OpenAIGPTLMHeadModel", "eager"),
    ],
)
def test_greedy_tokens_are_the_model_s(architecture, attention, llama_for_generation):
    if architecture == "LlamaForCausalLM":
        model, exported = llama_for_generation
    else:
        model = _model(architecture, _attn_implementation=attention)
        ids, mask = _prompt(model.config.vocab_size, 2, 5)
        exported = YobxExporter().export_for_generation(
            model, {"input_ids": ids, "attention_mask": mask}, YobxExportConfig()
        )
    _assert_generates_the_model_s_tokens(model, exported)


def test_saved_and_loaded_it_generates_the_same(llama_for_generation, tmp_path):
    model, exported = llama_for_generation
    exported.save_pretrained(tmp_path)
    assert {"prefill.onnx", "decode.onnx", "export.json", "config.json"} <= {
        p.name for p in tmp_path.iterdir()
    }
    loaded = ExportedModel.from_pretrained(tmp_path)
    assert loaded.export_format == "yobx"
    ids, mask = _prompt(model.config.vocab_size, 2, 6)
    expected = greedy_generate(exported, ids, mask, max_new_tokens=5)
    assert torch.equal(greedy_generate(loaded, ids, mask, max_new_tokens=5), expected)


def test_a_model_without_a_cache_generates_by_running_the_sequence_again():
    model = _model("LlamaForCausalLM", use_cache=False)
    ids, mask = _prompt(model.config.vocab_size, 2, 5)
    exported = YobxExporter().export_for_generation(
        model, {"input_ids": ids, "attention_mask": mask}, YobxExportConfig()
    )
    expected = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4, do_sample=False
    )
    assert torch.equal(greedy_generate(exported, ids, mask, max_new_tokens=4), expected)


def test_the_saved_structure_is_transformers_own_after_a_yobx_trace():
    """A trace registers yobx's flattening of DynamicCache when nobody did: the exporter
    puts transformers' back, whose structure ``from_pretrained`` reads."""
    import torch.utils._pytree as pytree
    from transformers.cache_utils import DynamicCache
    from transformers.exporters.exporter_dynamo import _pytree_flatten

    from yobx.torch.tracing.inputs import register_cache_flattening

    pytree._deregister_pytree_node(DynamicCache)
    register_cache_flattening()
    assert pytree.SUPPORTED_NODES[DynamicCache].flatten_fn is not _pytree_flatten
    model = _model("LlamaForCausalLM")
    ids, mask = _prompt(model.config.vocab_size, 1, 3, padded=False)
    exported = YobxExporter().export(model, {"input_ids": ids, "attention_mask": mask}, {})
    assert pytree.SUPPORTED_NODES[DynamicCache].flatten_fn is _pytree_flatten
    assert "transformers.cache_utils:DynamicCache" in exported.components["model"].metadata.out_spec


def test_bad_configurations_say_what_to_do():
    with pytest.raises(ValueError, match="optimize must be one of"):
        YobxExportConfig(optimize="fast")
    with pytest.raises(ValueError, match="narrowing"):
        YobxExportConfig(narrowing="none")

    class FxQuantizer:
        quantizes_fx_graph = True

    with pytest.raises(ValueError, match="quantizes the FX graph"):
        YobxExportConfig(quantizer=FxQuantizer())


def test_greedy_generate_needs_generation_components():
    model = _model("LlamaForCausalLM", use_cache=False)
    ids, mask = _prompt(model.config.vocab_size, 1, 3, padded=False)
    exported = YobxExporter().export(model, {"input_ids": ids, "attention_mask": mask}, {})
    with pytest.raises(ValueError, match="'decode'"):
        greedy_generate(exported, ids, mask)


def test_an_onnx_quantizer_of_transformers_applies():
    from transformers.exporters import OnnxRuntimeDynamicConfig, OnnxRuntimeQuantizer

    model = _model("BertModel", use_cache=False)
    ids, mask = _prompt(model.config.vocab_size, 2, 7, padded=False)
    config = YobxExportConfig(quantizer=OnnxRuntimeQuantizer(OnnxRuntimeDynamicConfig()))
    exported = YobxExporter().export(model, {"input_ids": ids, "attention_mask": mask}, config)
    assert "MatMulInteger" in {node.op_type for node in exported.program.graph}
    ids, mask = _prompt(model.config.vocab_size, 3, 9, padded=False)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
    got = exported(input_ids=ids, attention_mask=mask).last_hidden_state
    # int8 weights and activations
    torch.testing.assert_close(got, expected, atol=0.1, rtol=0.1)


@pytest.mark.parametrize(
    "architecture", ["BartForConditionalGeneration", "T5ForConditionalGeneration"]
)
def test_an_encoder_decoder_s_steps_run_at_other_sizes_like_the_model(architecture):
    # BART's and T5's generation components take the encoder's outputs and a cache of
    # self- and cross-attention: their batch, the encoder's tokens and the past are
    # dynamic (before, the encoder's outputs kept the example's batch and the export
    # refused any other); each component against eager on the inputs generate gives it
    # for other prompts
    from transformers.exporters.utils import decompose_for_generation

    from yobx.models.hf_configs import tiny_config as family_config

    # both halves shrunk (T5's decoder layers too)
    config = family_config(getattr(transformers, architecture))
    config.use_cache = True
    if getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = 0
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = getattr(transformers, architecture)(config).eval()

    def prompt(batch, seq):
        ids, mask = _prompt(model.config.vocab_size, batch, seq, padded=False)
        return {"input_ids": ids, "attention_mask": mask}

    exported = YobxExporter().export_for_generation(model, prompt(2, 5), YobxExportConfig())
    assert set(exported.components) == {"prefill", "decode"}
    for batch, seq in ((2, 5), (3, 7), (1, 4)):
        components = decompose_for_generation(model, prompt(batch, seq), multi_token_decode=True)
        for name, (submodel, inputs) in components.items():
            with torch.no_grad():
                expected = submodel(**copy.deepcopy(inputs)).logits
            got = exported.runners[name](**copy.deepcopy(inputs))
            torch.testing.assert_close(torch.as_tensor(got.logits), expected, atol=1e-4, rtol=1e-4)


def test_a_cache_holding_one_tensor_twice_takes_it_by_both_paths():
    # DeepseekV4's cache layers set `values = keys`: both ONNX inputs were renamed after
    # the tensor's last path, and onnxruntime refused the model ("Duplicate
    # definition-site for (cache.layers.0.values)")
    model = _model("LlamaForCausalLM")
    ids, mask = _prompt(model.config.vocab_size, 2, 4, padded=False)
    with torch.no_grad():
        cache = model(input_ids=ids, attention_mask=mask).past_key_values
    for layer in cache.layers:
        layer.values = layer.keys
    new = torch.randint(3, model.config.vocab_size, (2, 1))
    inputs = {"input_ids": new, "attention_mask": torch.ones((2, 5), dtype=torch.int64)}
    exported = YobxExporter().export(model, {**inputs, "cache": copy.deepcopy(cache)}, {})
    names = [v.name for v in exported.program.graph.inputs]
    assert "cache.layers.0.keys" in names and "cache.layers.0.values" in names, names
    got = exported.runners["model"](cache=copy.deepcopy(cache), **inputs)
    with torch.no_grad():
        expected = model(cache=copy.deepcopy(cache), **inputs)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-4, rtol=1e-4)


def test_a_tensor_of_one_value_per_token_takes_the_tokens_axes():
    # XLM's `langs`, a language per token, was static: the model asserts that its
    # shape is the tokens', and the export needed `batch == 2`
    model = _model("XLMWithLMHeadModel", use_cache=False)

    def inputs(batch, seq):
        ids, _ = _prompt(model.config.vocab_size, batch, seq, padded=False)
        langs = torch.randint(0, model.config.n_langs, (batch, seq))
        return {"input_ids": ids, "langs": langs}

    exported = YobxExporter().export(model, inputs(2, 5), {})
    for batch, seq in ((2, 5), (3, 7), (1, 4)):
        example = inputs(batch, seq)
        with torch.no_grad():
            expected = model(**example).logits
        got = exported.runners["model"](**example).logits
        torch.testing.assert_close(torch.as_tensor(got), expected, atol=1e-4, rtol=1e-4)


def test_a_decoder_filling_the_cache_it_is_given_generates_the_model_s_tokens():
    # BERT-like models not configured as decoders (compare_hf_exporters builds them
    # so) fill the cache generate passes them and return none in their output
    # (generate reads back its own): the components returned no cache, and the decode
    # step had none to take
    model = _model("BertLMHeadModel", is_decoder=False)
    ids, mask = _prompt(model.config.vocab_size, 2, 5)
    exported = YobxExporter().export_for_generation(
        model, {"input_ids": ids, "attention_mask": mask}, YobxExportConfig()
    )
    outputs = [v.name for v in exported.components["decode"].program.graph.outputs]
    assert outputs == [
        "logits",
        "present.0.key",
        "present.0.value",
        "present.1.key",
        "present.1.value",
    ]
    _assert_generates_the_model_s_tokens(model, exported)
