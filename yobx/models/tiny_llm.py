"""``tiny-llm``: a small decoder-only transformer written in plain torch.

It exercises what makes exporting language models hard: the causal mask and the
rotary positions are computed from the shapes of the inputs and of the past
key/values (given as a list of ``(key, value)`` tuples, one per layer).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn


@dataclasses.dataclass
class TinyLLMConfig:
    """Sizes of :class:`TinyLLM`."""

    vocab_size: int = 128
    hidden_size: int = 32
    num_heads: int = 4
    num_layers: int = 2
    intermediate_size: int = 64
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.hidden_size // self.num_heads


class RMSNorm(nn.Module):
    """Root mean square normalization, written with its elementary pieces."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


class RotaryEmbedding(nn.Module):
    """Rotary position embedding; positions come from the past and current lengths."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, past_length, seq_length) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(past_length, past_length + seq_length).float()
        freqs = positions[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half of the last dimension: ``(x1, x2) -> (-x2, x1)``."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    """Multi-head self-attention with rotary embeddings and a key/value cache."""

    def __init__(self, config: TinyLLMConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, cos, sin, mask, past_key, past_value):
        batch, seq, hidden = x.shape
        q = self._heads(self.q_proj(x))
        k = self._heads(self.k_proj(x))
        v = self._heads(self.v_proj(x))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        key = torch.cat([past_key, k], dim=2)
        value = torch.cat([past_value, v], dim=2)
        out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask)
        out = out.transpose(1, 2).reshape(batch, seq, hidden)
        return self.o_proj(out), key, value


class MLP(nn.Module):
    """Gated feed-forward block."""

    def __init__(self, config: TinyLLMConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks with residual connections."""

    def __init__(self, config: TinyLLMConfig):
        super().__init__()
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Attention(config)
        self.post_attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask, past_key, past_value):
        attended, key, value = self.attention(
            self.input_norm(x), cos, sin, mask, past_key, past_value
        )
        x = x + attended
        x = x + self.mlp(self.post_attention_norm(x))
        return x, key, value


class TinyLLM(nn.Module):
    """A small decoder-only language model.

    ``forward(input_ids, past_key_values)`` takes token ids ``[batch, seq]`` and one
    ``(key, value)`` pair per layer, each ``[batch, heads, past, head_dim]``, and
    returns ``{"logits": [batch, seq, vocab], "present_key_values": [(key, value), ...]}``
    with keys and values of length ``past + seq``.
    """

    def __init__(self, config: TinyLLMConfig | None = None):
        super().__init__()
        self.config = config or TinyLLMConfig()
        c = self.config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_theta)
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, past_key_values: list) -> dict:
        seq = input_ids.shape[1]
        past = past_key_values[0][0].shape[2]
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(past, seq)
        # Query i (absolute position past + i) may attend keys 0 .. past + i.
        mask = torch.full((seq, seq + past), float("-inf")).triu(past + 1)
        present = []
        for layer, (past_key, past_value) in zip(self.layers, past_key_values):
            x, key, value = layer(x, cos, sin, mask, past_key, past_value)
            present.append((key, value))
        return {"logits": self.lm_head(self.norm(x)), "present_key_values": present}


def tiny_llm(
    batch: int = 2, seq: int = 3, past: int = 5, config: TinyLLMConfig | None = None
) -> tuple[TinyLLM, tuple, dict, dict]:
    """Returns the ``tiny-llm`` demo: ``(model, args, kwargs, dynamic_shapes)``.

    The weights are random but seeded, the inputs have a past of ``past`` tokens.
    """
    config = config or TinyLLMConfig()
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = TinyLLM(config).eval()
    input_ids = torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
    shape = (batch, config.num_heads, past, config.head_dim)
    past_key_values = [
        (torch.randn(shape, generator=generator), torch.randn(shape, generator=generator))
        for _ in range(config.num_layers)
    ]
    cache_dims = {0: "batch", 2: "past"}
    dynamic_shapes = {
        "input_ids": {0: "batch", 1: "seq"},
        "past_key_values": [(cache_dims, cache_dims) for _ in range(config.num_layers)],
    }
    kwargs = {"input_ids": input_ids, "past_key_values": past_key_values}
    return model, (), kwargs, dynamic_shapes
