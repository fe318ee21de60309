"""The role of a step's attention mask length (yobx.models.roles)."""

from __future__ import annotations

import torch
import transformers

from yobx.models.roles import PAST_PLUS_SEQ, attention_mask_length


def _cache(lengths: list[int | None], config=None) -> transformers.DynamicCache:
    cache = transformers.DynamicCache(config=config)
    for layer, length in enumerate(lengths):
        if length is not None:
            cache.update(torch.randn(2, 2, length, 4), torch.randn(2, 2, length, 4), layer)
    return cache


def _inputs(seq: int, mask: int) -> dict:
    return {
        "input_ids": torch.zeros(2, seq, dtype=torch.int64),
        "attention_mask": torch.ones(2, mask),
    }


def test_a_mask_over_the_cache_and_the_new_tokens_is_past_plus_seq():
    assert attention_mask_length(_inputs(3, 8), _cache([5, 5])) == PAST_PLUS_SEQ


def test_a_prefill_mask_over_the_new_tokens_is_seq():
    assert attention_mask_length(_inputs(3, 3), _cache([])) == "seq"


def test_a_sliding_window_not_full_yet_spans_past_plus_seq_too():
    config = transformers.LlamaConfig(
        num_hidden_layers=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"]
    )
    assert attention_mask_length(_inputs(1, 3), _cache([2, 2], config)) == PAST_PLUS_SEQ
    # full: the sliding layer keeps 3 positions of 5
    assert attention_mask_length(_inputs(1, 6), _cache([5, 5], config)) == "total"


def test_other_masks_and_caches_keep_a_dimension_of_their_own():
    # a longer mask in the example, layers of other lengths, no tokens
    assert attention_mask_length(_inputs(3, 9), _cache([5, 5])) == "total"
    assert attention_mask_length(_inputs(3, 8), _cache([5, 4])) == "total"
    assert attention_mask_length({"attention_mask": torch.ones(2, 3)}, _cache([2])) == "total"
