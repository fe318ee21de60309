"""Encoder-decoder models exported for generation: an encoder graph and a decoder step
whose cache holds the self- and cross-attention keys and values; greedy generation with
onnxruntime gives ``model.generate``'s tokens."""

import copy

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from yobx.models.hf_seq2seq import (
    CROSS_PAST,
    PAST,
    greedy_reference,
    hf_seq2seq_generation,
)
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.generate import GenerationError, generate_seq2seq

NEW_TOKENS = 8


def _export(architecture: str) -> tuple[dict, torch.nn.Module]:
    cases = hf_seq2seq_generation(architecture)
    model = cases["decoder"][0].model
    # random weights large enough for the tokens to vary (the initialisation's small
    # ones repeat one token, which any step would match)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    exported = {
        name: to_onnx(module, args, copy.deepcopy(kwargs), dynamic_shapes=shapes)
        for name, (module, args, kwargs, shapes) in cases.items()
    }
    return exported, model


def _expected(model: torch.nn.Module, inputs: dict) -> np.ndarray:
    return greedy_reference(model, inputs, NEW_TOKENS).numpy()


def test_greedy_generation_of_a_text_encoder_decoder():
    # (T5 through the command line: test_cli.py)
    exported, model = _export("BartForConditionalGeneration")
    names = [value.name for value in exported["decoder"].model_proto.graph.input]
    # layer by layer, as Optimum's exports list them
    assert names[2:7] == [
        "past_key_values.0.decoder.key",
        "past_key_values.0.decoder.value",
        "past_key_values.0.encoder.key",
        "past_key_values.0.encoder.value",
        "past_key_values.1.decoder.key",
    ]
    outputs = [value.name for value in exported["decoder"].model_proto.graph.output]
    assert outputs[0] == "logits" and "present.1.encoder.key" in outputs
    # one graph for the first step (both caches empty) and the next ones
    conditions = {c.expression for v in exported["decoder"].versions for c in v.conditions}
    assert {f"{CROSS_PAST} < 1", f"{PAST} < 1"} <= conditions
    start = model.generation_config.decoder_start_token_id
    vocab = model.config.vocab_size
    torch.manual_seed(5)
    for batch, length in ((2, 7), (1, 4)):
        ids = torch.randint(3, vocab, (batch, length))
        mask = torch.ones(batch, length, dtype=torch.int64)
        mask[-1, length - 2 :] = 0  # the last row is padded
        inputs = {"input_ids": ids, "attention_mask": mask}
        expected = _expected(model, inputs)
        got = generate_seq2seq(
            exported["encoder"],
            exported["decoder"],
            inputs,
            NEW_TOKENS,
            start,
            model.generation_config.eos_token_id,
            model.generation_config.pad_token_id,
        )
        assert got.shape == expected.shape and (got == expected).all(), (expected, got)


def test_greedy_generation_of_whisper():
    exported, model = _export("WhisperForConditionalGeneration")
    config = model.config
    torch.manual_seed(6)
    features = torch.randn(2, config.num_mel_bins, 2 * config.max_source_positions)
    expected = _expected(model, {"input_features": features})
    got = generate_seq2seq(
        exported["encoder"],
        exported["decoder"],
        {"input_features": features},
        NEW_TOKENS,
        model.generation_config.decoder_start_token_id,
        model.generation_config.eos_token_id,
        model.generation_config.pad_token_id,
    )
    # Whisper's generate returns the new tokens without the start token
    assert (got[:, 1:] == expected).all(), (expected, got)


def test_a_decoder_is_no_encoder_decoder():
    with pytest.raises(ValueError, match="not an encoder-decoder model"):
        hf_seq2seq_generation("LlamaForCausalLM")


def test_generate_seq2seq_says_what_the_models_lack():
    encoder = to_onnx(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    with pytest.raises(GenerationError, match="the encoder takes \\['input'\\]"):
        generate_seq2seq(encoder, encoder, {"input_ids": np.zeros((1, 2))}, 2, 0)
    with pytest.raises(GenerationError, match="decoder_input_ids"):
        generate_seq2seq(encoder, encoder, {"input": np.zeros((2, 4), np.float32)}, 2, 0)
