"""Decoder language models: a decode step with a ``DynamicCache``, and MoE models.

A decode step takes ``input_ids [batch, seq]``, a ``transformers.DynamicCache`` of
``past`` tokens per layer and an ``attention_mask [batch, total]`` covering the past and
the new tokens (``total = past + seq``, which string names cannot say: the tracer has
to find the relation). The cache follows torch.export's format for dynamic shapes:
``[[key dims per layer], [value dims per layer]]``, the flattening of
:func:`yobx.torch.tracing.register_cache_flattening`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..huggingface import tiny_config
from .base import ArchitectureCase, generator_for, hf_model, make_case, token_inputs
from .sequences import _TOKEN_OTHER, _TOKEN_SIZES, TOKEN_DIMS


def _decoder_config(architecture: str, **values: Any) -> Any:
    config = tiny_config(architecture)
    config.use_cache = True
    for key, value in values.items():
        setattr(config, key, value)
    return config


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def decode_inputs(config: Any):
    """``sizes -> kwargs`` of a decode step: ids, a cache of ``past`` tokens, and a mask
    of ``past + seq`` positions whose first position is padding in the last row."""
    from transformers import DynamicCache

    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = _head_dim(config)

    def make(sizes: dict[str, int]) -> dict[str, Any]:
        g = generator_for(sizes)
        batch, seq, past = sizes["batch"], sizes["seq"], sizes["past"]
        if sizes.get("total", past + seq) != past + seq:
            raise ValueError(f"decode inputs need total == past + seq, got {sizes}")
        cache = DynamicCache()
        for layer in range(config.num_hidden_layers):
            shape = (batch, heads, past, head_dim)
            cache.update(torch.randn(shape, generator=g), torch.randn(shape, generator=g), layer)
        mask = torch.ones((batch, past + seq), dtype=torch.int64)
        mask[-1, 0] = 0
        return {
            "input_ids": torch.randint(1, config.vocab_size, (batch, seq), generator=g),
            "attention_mask": mask,
            "past_key_values": cache,
        }

    return make


def _decode_case(name: str, architecture: str, **values: Any) -> ArchitectureCase:
    config = _decoder_config(architecture, **values)
    model = hf_model(architecture, config)
    from yobx.torch.tracing.inputs import cache_dynamic_shapes

    sizes = {"batch": 2, "seq": 3, "past": 5, "total": 8}
    cache = decode_inputs(config)(sizes)["past_key_values"]
    dims = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "past_key_values": cache_dynamic_shapes(cache, {0: "batch", 2: "past"}),
    }
    others = [
        {"batch": 3, "seq": 4, "past": 7, "total": 11},
        {"batch": 4, "seq": 2, "past": 12, "total": 14},
    ]
    return make_case(name, "decoder", model, decode_inputs(config), dims, sizes, others)


def llama_decode() -> ArchitectureCase:
    """LlamaForCausalLM decode step with a DynamicCache."""
    return _decode_case("llama_decode", "LlamaForCausalLM")


def qwen2_decode() -> ArchitectureCase:
    """Qwen2ForCausalLM decode step with a DynamicCache."""
    return _decode_case("qwen2_decode", "Qwen2ForCausalLM")


def gemma_decode() -> ArchitectureCase:
    """GemmaForCausalLM decode step with a DynamicCache (head_dim 8 instead of 256)."""
    return _decode_case("gemma_decode", "GemmaForCausalLM", head_dim=8)


def _moe_case(name: str, architecture: str, experts: str | None, **values: Any) -> ArchitectureCase:
    config = tiny_config(architecture)
    for key, value in values.items():
        setattr(config, key, value)
    model = hf_model(architecture, config)
    if experts is not None:
        # transformers picks the experts' kernel per config (grouped_mm by default);
        # "eager" loops over the experts, "batched_mm" gathers every expert's weights.
        model.set_experts_implementation(experts)
    return make_case(
        name,
        "moe",
        model,
        token_inputs(config.vocab_size),
        TOKEN_DIMS,
        _TOKEN_SIZES,
        _TOKEN_OTHER,
    )


# torch._grouped_mm on CPU needs 16-byte aligned strides: with intermediate_size=37
# (the tiny default) the default experts implementation fails eagerly with
# "strides should be multiple of 16 bytes"; 32 float32 values are 128 bytes.
_MIXTRAL = {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32}
_QWEN2_MOE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 16,
}


def mixtral() -> ArchitectureCase:
    """MixtralForCausalLM with the experts implementation transformers selects."""
    return _moe_case("mixtral", "MixtralForCausalLM", None, **_MIXTRAL)


def mixtral_eager_experts() -> ArchitectureCase:
    """MixtralForCausalLM with ``experts_implementation="eager"`` (a loop on experts)."""
    return _moe_case("mixtral_eager_experts", "MixtralForCausalLM", "eager", **_MIXTRAL)


def mixtral_batched_mm() -> ArchitectureCase:
    """MixtralForCausalLM with ``experts_implementation="batched_mm"``."""
    return _moe_case("mixtral_batched_mm", "MixtralForCausalLM", "batched_mm", **_MIXTRAL)


def qwen2_moe() -> ArchitectureCase:
    """Qwen2MoeForCausalLM (shared expert) with the default experts implementation."""
    return _moe_case("qwen2_moe", "Qwen2MoeForCausalLM", None, **_QWEN2_MOE)


def qwen2_moe_eager_experts() -> ArchitectureCase:
    """Qwen2MoeForCausalLM with ``experts_implementation="eager"``."""
    return _moe_case("qwen2_moe_eager_experts", "Qwen2MoeForCausalLM", "eager", **_QWEN2_MOE)


BUILDERS = {
    "llama_decode": llama_decode,
    "qwen2_decode": qwen2_decode,
    "gemma_decode": gemma_decode,
    "mixtral": mixtral,
    "mixtral_eager_experts": mixtral_eager_experts,
    "mixtral_batched_mm": mixtral_batched_mm,
    "qwen2_moe": qwen2_moe,
    "qwen2_moe_eager_experts": qwen2_moe_eager_experts,
}
