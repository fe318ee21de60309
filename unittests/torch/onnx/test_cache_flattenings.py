"""A model with a cache exports alike whichever flattening of caches is registered.

transformers' exporters register their own pytree flattening of caches (every
attribute of a layer: a sliding-window layer's count of positions seen is a constant of
the example) in place of yobx's (keys and values). Once they have run in a process,
yobx traces with theirs.
"""

import copy

import pytest
import torch
import torch.utils._pytree as pytree

from unittests.pytree_registrations import pytree_registrations_restored
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.generate import GenerationError, generate
from yobx.torch.tracing.inputs import cache_dynamic_shapes

transformers = pytest.importorskip("transformers")


class _ReadsTheCount(torch.nn.Module):
    """A step over a sliding-window cache whose output depends on the layer's count of
    positions seen (the masks of sliding-window attention read it)."""

    def forward(self, x, cache):
        keys, _ = cache.update(x, x * 2, 0)
        seen = torch.arange(cache.layers[0].cumulative_length, dtype=x.dtype)
        return keys.sum(dim=(1, 3)) + seen[-keys.shape[2] :], cache.layers[0].keys


def _inputs(batch: int, past: int, seq: int, window: int = 16) -> dict:
    cache = transformers.cache_utils.DynamicCache()
    cache.layers.append(transformers.cache_utils.DynamicSlidingWindowLayer(window))
    cache.update(torch.randn(batch, 2, past, 4), torch.randn(batch, 2, past, 4), 0)
    return {"x": torch.randn(batch, 2, seq, 4), "cache": cache}


def _register_transformers_flattening() -> None:
    from transformers.exporters.exporter_dynamo import register_pytree_node

    cls = transformers.cache_utils.DynamicCache
    if cls in pytree.SUPPORTED_NODES:
        pytree._deregister_pytree_node(cls)
    register_pytree_node(cls)


@pytest.mark.parametrize("flattening", ["yobx", "transformers"])
def test_a_sliding_window_count_follows_the_keys_under_either_flattening(flattening):
    # with transformers' flattening, the count came back as the example's int and
    # `past` was fixed to the example's size ("needs `past == 3`")
    with pytree_registrations_restored():
        if flattening == "transformers":
            _register_transformers_flattening()
        example = _inputs(2, 3, 2)
        shapes = {
            "x": {0: "batch", 2: "seq"},
            "cache": cache_dynamic_shapes(example["cache"], {0: "batch", 2: "past"}),
        }
        result = to_onnx(_ReadsTheCount(), (), copy.deepcopy(example), dynamic_shapes=shapes)
        others = [_inputs(3, 6, 1), _inputs(1, 9, 4)]
        report = result.validate(_ReadsTheCount(), (), example, validation_inputs=others)
    assert report.ok, report
    given = [c.description for c in report.cases if c.description.startswith("given inputs")]
    assert given == ["given inputs 1", "given inputs 2"]


def test_generate_names_the_cache_inputs_it_cannot_feed():
    # transformers' flattening makes a sliding layer's window tensor an input of the
    # step: generate feeds keys and values only, and says so
    config = transformers.LlamaConfig(
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=40,
        sliding_window=8,
        layer_types=["sliding_attention"],
    )
    model = transformers.MistralForCausalLM(transformers.MistralConfig(**config.to_dict()))
    cache = transformers.DynamicCache(config=model.config)
    cache.update(torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8), 0)
    kwargs = {"input_ids": torch.randint(0, 40, (1, 3)), "cache": cache}
    with pytree_registrations_restored():
        _register_transformers_flattening()
        shapes = {
            "input_ids": {0: "batch", 1: "seq"},
            "cache": cache_dynamic_shapes(cache, {0: "batch", 2: "past"}),
        }
        result = to_onnx(model.eval(), (), kwargs, dynamic_shapes=shapes)
    with pytest.raises(GenerationError, match=r"sliding_window_tensor.*transformers' exporters"):
        generate(result, torch.randint(0, 40, (1, 3)), 2)
