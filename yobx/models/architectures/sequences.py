"""Audio, text encoders, CLIP and encoder-decoder architectures.

Token inputs have a dynamic batch and sequence length and a padded attention mask;
audio inputs have a dynamic batch and number of samples.
"""

from __future__ import annotations

from typing import Any

import torch

from ..huggingface import tiny_config
from .base import (
    ArchitectureCase,
    generator_for,
    hf_config,
    hf_model,
    make_case,
    token_inputs,
)
from .vision import PATCH_STRESS, image_inputs

TOKEN_DIMS = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
_TOKEN_SIZES = {"batch": 2, "seq": 7}
_TOKEN_OTHER = [{"batch": 3, "seq": 12}, {"batch": 5, "seq": 20}]


def _audio_config(config_name: str) -> Any:
    # Two feature-extractor convolutions (stride 5 then 2) instead of seven.
    return hf_config(
        config_name,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_feat_extract_layers=2,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        hidden_dropout=0.0,
        activation_dropout=0.0,
        attention_dropout=0.0,
        layerdrop=0.0,
        mask_time_prob=0.0,
    )


def _audio_inputs(sizes: dict[str, int]) -> dict[str, Any]:
    g = generator_for(sizes)
    return {"input_values": torch.randn((sizes["batch"], sizes["samples"]), generator=g)}


def _audio_case(name: str, class_name: str, config_name: str) -> ArchitectureCase:
    model = hf_model(class_name, _audio_config(config_name))
    return make_case(
        name,
        "audio",
        model,
        _audio_inputs,
        {"input_values": {0: "batch", 1: "samples"}},
        {"batch": 2, "samples": 400},
        [{"batch": 3, "samples": 523}, {"batch": 4, "samples": 811}],
    )


def wav2vec2() -> ArchitectureCase:
    """Wav2Vec2Model: convolutional feature extractor, positional convolution, encoder."""
    return _audio_case("wav2vec2", "Wav2Vec2Model", "Wav2Vec2Config")


def hubert() -> ArchitectureCase:
    """HubertModel with the same tiny feature extractor."""
    return _audio_case("hubert", "HubertModel", "HubertConfig")


def _text_encoder(name: str, architecture: str) -> ArchitectureCase:
    config = tiny_config(architecture)
    if hasattr(config, "hidden_dim"):  # DistilBERT's name for intermediate_size
        config.hidden_dim = 37
    model = hf_model(architecture, config)
    return make_case(
        name,
        "text",
        model,
        token_inputs(config.vocab_size),
        TOKEN_DIMS,
        _TOKEN_SIZES,
        _TOKEN_OTHER,
    )


def distilbert() -> ArchitectureCase:
    """DistilBertModel (64 positions)."""
    return _text_encoder("distilbert", "DistilBertModel")


def albert() -> ArchitectureCase:
    """AlbertModel (factorized embeddings, shared layers, 64 positions)."""
    return _text_encoder("albert", "AlbertModel")


def bert() -> ArchitectureCase:
    """BertModel (64 positions, token type buffer)."""
    return _text_encoder("bert", "BertModel")


def _state_space(name: str, architecture: str) -> ArchitectureCase:
    # transformers' reference path (no mamba_ssm kernels): a loop over the sequence
    config = tiny_config(architecture)
    config.use_cache = False
    model = hf_model(architecture, config)
    return make_case(
        name,
        "state_space",
        model,
        token_inputs(config.vocab_size, with_mask=False),
        {"input_ids": TOKEN_DIMS["input_ids"]},
        _TOKEN_SIZES,
        _TOKEN_OTHER,
        stress_sizes=[{"batch": 1, "seq": 1}, {"batch": 2, "seq": 2}],
    )


def mamba() -> ArchitectureCase:
    """MambaModel: the selective scan's reference path loops over the sequence."""
    return _state_space("mamba", "MambaModel")


def falcon_mamba() -> ArchitectureCase:
    """FalconMambaModel (Mamba with RMS-normalized B, C and time steps)."""
    return _state_space("falcon_mamba", "FalconMambaModel")


def clip() -> ArchitectureCase:
    """CLIPModel: text and vision towers, non-square images with position
    interpolation; text and image batches are independent dimensions."""
    text = dict(
        vocab_size=99,
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        projection_dim=16,
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
        projection_dim=16,
    )
    config = hf_config("CLIPConfig", text_config=text, vision_config=vision, projection_dim=16)
    model = hf_model("CLIPModel", config)
    tokens, images = token_inputs(99), image_inputs(interpolate_pos_encoding=True)

    def make(sizes: dict[str, int]) -> dict[str, Any]:
        kwargs = tokens({"batch": sizes["text_batch"], "seq": sizes["seq"]})
        kwargs.update(images({"batch": sizes["image_batch"], **sizes}))
        return kwargs

    dims = {
        "input_ids": {0: "text_batch", 1: "seq"},
        "attention_mask": {0: "text_batch", 1: "seq"},
        "pixel_values": {0: "image_batch", 2: "height", 3: "width"},
    }
    sizes = {"text_batch": 2, "seq": 7, "image_batch": 3, "height": 32, "width": 48}
    others = [
        {"text_batch": 4, "seq": 11, "image_batch": 2, "height": 48, "width": 24},
        {"text_batch": 3, "seq": 16, "image_batch": 5, "height": 40, "width": 64},
    ]
    return make_case("clip", "clip", model, make, dims, sizes, others, PATCH_STRESS)


def _seq2seq_inputs(vocab_size: int):
    tokens = token_inputs(vocab_size)

    def make(sizes: dict[str, int]) -> dict[str, Any]:
        kwargs = tokens(sizes)
        g = generator_for({**sizes, "decoder": 1})
        shape = (sizes["batch"], sizes["decoder_seq"])
        kwargs["decoder_input_ids"] = torch.randint(1, vocab_size, shape, generator=g)
        return kwargs

    return make


def _seq2seq_case(name: str, class_name: str, config: Any) -> ArchitectureCase:
    model = hf_model(class_name, config)
    dims = {**TOKEN_DIMS, "decoder_input_ids": {0: "batch", 1: "decoder_seq"}}
    sizes = {"batch": 2, "seq": 7, "decoder_seq": 5}
    others = [
        {"batch": 3, "seq": 12, "decoder_seq": 4},
        {"batch": 4, "seq": 9, "decoder_seq": 13},
    ]
    return make_case(name, "encoder_decoder", model, _seq2seq_inputs(99), dims, sizes, others)


def t5() -> ArchitectureCase:
    """T5ForConditionalGeneration (relative position buckets), without cache."""
    config = hf_config(
        "T5Config",
        vocab_size=99,
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        dropout_rate=0.0,
        decoder_start_token_id=0,
    )
    return _seq2seq_case("t5", "T5ForConditionalGeneration", config)


def bart() -> ArchitectureCase:
    """BartForConditionalGeneration (learned positions, 64 of them), without cache."""
    config = hf_config(
        "BartConfig",
        vocab_size=99,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        max_position_embeddings=64,
        dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=2,
    )
    return _seq2seq_case("bart", "BartForConditionalGeneration", config)


BUILDERS = {
    "wav2vec2": wav2vec2,
    "hubert": hubert,
    "distilbert": distilbert,
    "albert": albert,
    "bert": bert,
    "clip": clip,
    "t5": t5,
    "bart": bart,
    "mamba": mamba,
    "falcon_mamba": falcon_mamba,
}
