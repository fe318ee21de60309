"""Encoder-decoder models (T5, BART, Whisper...) exported for generation: an encoder
graph and a decoder-step graph.

Generation runs the encoder once, then the decoder one step at a time. The decoder's
cache is an ``EncoderDecoderCache``: its own keys and values (self-attention, growing by
the step's tokens) and the cross-attention's keys and values of the encoder's output.
At the first step the cross-attention cache is empty and the step computes it from
``encoder_hidden_states``; afterwards it reads it. transformers decides which from the
cache's length, a decision on sizes: the tracer captures both sides as versions of one
graph, which also serves the first step (an empty self-attention cache) and the next
ones (one token). The ONNX inputs are ``decoder_input_ids``, ``encoder_hidden_states``,
``attention_mask`` (the encoder's, where the model takes one) and
``past_key_values.<layer>.decoder|encoder.key|value``; the outputs ``logits`` and
``present.<layer>.decoder|encoder.key|value`` (see :mod:`yobx.torch.onnx.cache_names`).
:func:`yobx.torch.onnx.generate.generate_seq2seq` runs the two graphs.
"""

from __future__ import annotations

from typing import Any

import torch

from yobx.models.huggingface import _model_class, tiny_config

#: the dynamic dimensions of the decoder step: the encoder's length, the decoder's
#: tokens in this step, its cache's length and the cross-attention cache's length (0 at
#: the first step, the encoder's length after)
ENCODER_SEQ, SEQ, PAST, CROSS_PAST = "encoder_seq", "seq", "past", "cross_past"


#: small sizes of the encoder's and the decoder's own configuration entries
_TINY_HALVES = {
    "num_layers": 2,
    "num_decoder_layers": 2,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "d_ff": 64,
    "d_kv": 8,
    # Whisper's encoder takes twice as many frames as its position table has rows
    "max_source_positions": 32,
}


class Seq2SeqEncoder(torch.nn.Module):
    """The encoder of an encoder-decoder model: its output's ``last_hidden_state``."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]


class Seq2SeqAudioEncoder(torch.nn.Module):
    """The encoder of a speech-to-text model taking ``input_features`` (Whisper)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_features=input_features)[0]


class Seq2SeqDecoderStep(torch.nn.Module):
    """One step of the decoder with its cache: ``{"logits": ..., "present": cache}``."""

    def __init__(self, model: torch.nn.Module, argument: str):
        super().__init__()
        self.model = model
        # the cache's argument: `cache` in transformers 5, `past_key_values` before
        self.argument = argument

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        cache: Any,
        attention_mask: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        from transformers.cache_utils import EncoderDecoderCache

        kwargs = {} if attention_mask is None else {"attention_mask": attention_mask}
        # built again from its two caches: its constructor decides from the
        # cross-attention cache's length whether the step computes the encoder's keys
        # and values (the first step) or reads them, a decision on sizes the tracer
        # captures both sides of; a flattening keeping that decision as a constant of
        # the example (transformers' exporters') would read an empty cache at the
        # first step
        cache = EncoderDecoderCache(cache.self_attention_cache, cache.cross_attention_cache)
        out = self.model(
            encoder_outputs=(encoder_hidden_states,),
            decoder_input_ids=decoder_input_ids,
            use_cache=True,
            **{self.argument: cache},
            **kwargs,
        )
        cache = getattr(out, "cache", None) or out.past_key_values
        return {"logits": out.logits, "present": cache}


def hf_seq2seq_generation(
    architecture: str,
    batch: int = 2,
    seq: int = 3,
    past: int = 4,
    encoder_seq: int = 6,
    model: torch.nn.Module | None = None,
) -> dict[str, tuple[torch.nn.Module, tuple, dict, dict]]:
    """The two graphs of an encoder-decoder model's generation, each as ``(model,
    args, kwargs, dynamic_shapes)`` for :func:`~yobx.torch.onnx.to_onnx`: ``encoder``
    (``input_ids`` and ``attention_mask`` of ``encoder_seq`` tokens, or Whisper's
    ``input_features``) and ``decoder`` (a step of ``seq`` tokens on a cache of
    ``past`` positions and a cross-attention cache of the encoder's length). The
    example's caches are made by running the model (their shapes are the model's own).

    :param architecture: a transformers class (``T5ForConditionalGeneration``,
        ``BartForConditionalGeneration``, ``WhisperForConditionalGeneration``...)
    :param model: the model (a checkpoint loaded with ``from_pretrained``); by
        default a tiny one with random weights
    :raises ValueError: the architecture is not an encoder-decoder model with a cache
    """
    model_class = _model_class(architecture)
    if model is None:
        model = _tiny_model(architecture, model_class)
    config = model.config
    if not getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"{architecture} is not an encoder-decoder model: text2text-generation "
            "needs one (T5, BART, Whisper...); a decoder uses text-generation"
        )
    model.config.use_cache = True
    if model.generation_config.decoder_start_token_id is None:
        # a tiny configuration misses what a checkpoint's generation config says:
        # T5's decoder starts with its padding token
        start = getattr(config, "decoder_start_token_id", None)
        model.generation_config.decoder_start_token_id = (
            config.pad_token_id if start is None else start
        )
    argument = "cache" if "cache" in _parameters(model_class) else "past_key_values"
    generator = torch.Generator().manual_seed(3)
    if "input_features" in _parameters(model_class):
        encoder: torch.nn.Module = Seq2SeqAudioEncoder(model)
        # Whisper's encoder takes exactly the frames of its position table
        frames = 2 * model.config.max_source_positions
        features = torch.randn(batch, model.config.num_mel_bins, frames, generator=generator)
        encoder_inputs = {"input_features": features}
        encoder_shapes: dict = {"input_features": {0: "batch"}}
    else:
        encoder = Seq2SeqEncoder(model)
        vocab = model.config.vocab_size
        encoder_inputs = {
            "input_ids": torch.randint(3, vocab, (batch, encoder_seq), generator=generator),
            "attention_mask": torch.ones((batch, encoder_seq), dtype=torch.int64),
        }
        dims = {0: "batch", 1: ENCODER_SEQ}
        encoder_shapes = {"input_ids": dims, "attention_mask": dims}
    step = Seq2SeqDecoderStep(model, argument)
    decoder_inputs = _decoder_inputs(model, encoder, encoder_inputs, step, seq, past, generator)
    return {
        "encoder": (encoder, (), encoder_inputs, encoder_shapes),
        "decoder": (step, (), decoder_inputs, _decoder_shapes(decoder_inputs)),
    }


def _tiny_model(architecture: str, model_class: Any) -> torch.nn.Module:
    config = tiny_config(architecture)
    for name, value in _TINY_HALVES.items():
        # the sizes of each half, beside the shared ones tiny_config sets
        if isinstance(getattr(config, name, None), int):
            setattr(config, name, value)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return model_class(config).eval()


def _parameters(model_class: Any) -> Any:
    import inspect

    return inspect.signature(model_class.forward).parameters


def _decoder_inputs(
    model: Any,
    encoder: torch.nn.Module,
    encoder_inputs: dict,
    step: Seq2SeqDecoderStep,
    seq: int,
    past: int,
    generator: torch.Generator,
) -> dict:
    """The step's example: ``seq`` new tokens after a cache of ``past`` positions, made
    by running ``past`` tokens first (the caches' shapes are the model's own)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    vocab = model.config.vocab_size
    batch = next(iter(encoder_inputs.values())).shape[0]
    with torch.no_grad():
        hidden = encoder(**encoder_inputs)
        mask = (
            {"attention_mask": encoder_inputs["attention_mask"]}
            if ("attention_mask" in encoder_inputs)
            else {}
        )
        ids = torch.randint(3, vocab, (batch, past), generator=generator)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        step(ids, hidden, cache, **mask)
    return {
        "decoder_input_ids": torch.randint(3, vocab, (batch, seq), generator=generator),
        "encoder_hidden_states": hidden,
        "cache": cache,
        **mask,
    }


def _decoder_shapes(inputs: dict) -> dict:
    from yobx.torch.tracing.inputs import cache_dynamic_shapes

    cache = inputs["cache"]
    shapes = {
        "decoder_input_ids": {0: "batch", 1: SEQ},
        "encoder_hidden_states": {0: "batch", 1: ENCODER_SEQ},
        # in the structure of whichever flattening is registered (yobx's, or
        # transformers' exporters' once they ran in the process)
        "cache": cache_dynamic_shapes(cache, {0: "batch", 2: PAST}, {0: "batch", 2: CROSS_PAST}),
    }
    if "attention_mask" in inputs:
        shapes["attention_mask"] = {0: "batch", 1: ENCODER_SEQ}
    return shapes


def greedy_reference(model: Any, inputs: dict, new_tokens: int) -> torch.Tensor:
    """``model.generate``'s tokens with greedy search alone, as
    :func:`yobx.torch.onnx.generate.generate_seq2seq` decodes: no forced tokens (BART
    forces its end token at the last position) and no suppressed ones (Whisper's); the
    model's generation config is left as it was."""
    import copy

    from transformers import GenerationConfig

    config = model.generation_config
    greedy = GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=False,
        decoder_start_token_id=config.decoder_start_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    plain = copy.deepcopy(config)
    for name in ("forced_bos_token_id", "forced_eos_token_id", "suppress_tokens"):
        setattr(plain, name, None)
    plain.begin_suppress_tokens = None
    model.generation_config = plain
    try:
        with torch.no_grad():
            return model.generate(**inputs, generation_config=greedy)
    finally:
        model.generation_config = config
