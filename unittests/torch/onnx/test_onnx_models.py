"""Export of whole models: the tiny-llm demo with past key/values, tiny Hugging Face
models, nn.TransformerEncoder and a small CNN, validated at several sizes."""

import pytest

from unittests.torch.onnx._helpers import export_and_validate, onnx_dims
from yobx.models import load_model, tiny_cnn, tiny_llm, transformer_encoder


def test_tiny_llm_with_past_key_values():
    model, args, kwargs, dynamic_shapes = tiny_llm()
    result = export_and_validate(model, args, kwargs, dynamic_shapes=dynamic_shapes, min_cases=5)
    dims = onnx_dims(result.model_proto)
    assert dims["input_ids"] == ["batch", "seq"]
    assert dims["past_key_values.0.key"] == ["batch", 4, "past", 8]
    assert dims["logits"] == ["batch", "seq", 128]
    # The cache grows by the new tokens: the derived dimension is an expression of
    # the user's names, the same for every layer, key and value.
    for name in ("present.0.key", "present.1.value"):
        assert dims[name] == ["batch", 4, "past+seq", 8]
    assert result.input_names[0] == "input_ids"
    assert result.output_names[0] == "logits"
    names = [stage.name for stage in result.stages]
    assert names[:7] == [
        "capture",
        "passes",
        "lower",
        "translate",
        "optimize",
        "runtime_checks",
        "check",
    ]
    assert all(stage.end_ns >= stage.start_ns for stage in result.stages)


# Bloom: autograd.Function, baddbmm on symbolic sizes; Falcon: list indexing; MPT: a real
# tensor sliced by dimensions; CodeGen: modules built in forward, rotary_dim.
@pytest.mark.parametrize(
    "architecture",
    [
        "LlamaForCausalLM",
        "GPT2LMHeadModel",
        "BertModel",
        "BloomForCausalLM",
        "FalconForCausalLM",
        "MptForCausalLM",
        "CodeGenForCausalLM",
    ],
)
def test_huggingface_tiny_model(architecture):
    pytest.importorskip("transformers")
    model, args, kwargs, dynamic_shapes = load_model(f"hf:{architecture}")
    result = export_and_validate(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    dims = onnx_dims(result.model_proto)
    assert dims["input_ids"] == ["batch", "seq"]
    assert dims["attention_mask"] == ["batch", "seq"]
    first_output = result.output_names[0]
    assert first_output in ("logits", "last_hidden_state")
    assert dims[first_output][:2] == ["batch", "seq"]


def test_huggingface_decoder_returning_its_cache():
    """use_cache=True (the default): the DynamicCache output becomes named outputs."""
    transformers = pytest.importorskip("transformers")
    import torch

    config = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    kwargs = {
        "input_ids": torch.randint(0, 100, (2, 6)),
        "attention_mask": torch.ones(2, 6, dtype=torch.int64),
    }
    dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    result = export_and_validate(model, (), kwargs, dynamic_shapes=dynamic)
    assert result.output_names == [
        "logits",
        "present.0.key",
        "present.1.key",
        "present.0.value",
        "present.1.value",
    ]
    dims = onnx_dims(result.model_proto)
    assert dims["present.1.key"] == ["batch", 1, "seq", 16]


def test_transformer_encoder():
    model, args, kwargs, dynamic_shapes = transformer_encoder()
    result = export_and_validate(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    assert onnx_dims(result.model_proto)["src"] == ["batch", "seq", 16]


@pytest.mark.parametrize("tracer", ["custom", "fx"])
def test_small_cnn(tracer):
    model, args, kwargs, dynamic_shapes = tiny_cnn()
    result = export_and_validate(model, args, kwargs, dynamic_shapes=dynamic_shapes, tracer=tracer)
    dims = onnx_dims(result.model_proto)
    assert dims["images"] == ["batch", 3, 16, 16]
    assert dims["output"] == ["batch", 10]


def test_model_updating_an_input_and_a_buffer():
    """The final values of mutated inputs and buffers are extra ONNX outputs, validated
    against eager; validation leaves the model's buffers as they were."""
    import torch

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x):
            x.mul_(2)
            self.count += 1
            return x * self.count

    model = Counter()
    result = export_and_validate(model, (torch.randn(2, 3),), dynamic_shapes=({0: "batch"},))
    assert result.output_names == ["output", "x_updated", "count_updated"]
    assert float(model.count) == 0.0


def test_model_updating_an_input_with_an_optional_input_left_out():
    """An optional input passed as None between a written input and one read after
    the write (FalconMamba's cache and mask): the write becomes an extra output (it
    was refused, ``a`` taken to share storage with ``b``)."""
    import torch

    class WritesOne(torch.nn.Module):
        def forward(self, a, mask=None, b=None):
            a.add_(1)
            out = b * 2
            return out if mask is None else out * mask

    kwargs = {"a": torch.randn(2, 3), "mask": None, "b": torch.randn(2, 3)}
    shapes = {"a": {0: "batch"}, "mask": None, "b": {0: "batch"}}
    result = export_and_validate(WritesOne(), (), kwargs, dynamic_shapes=shapes)
    assert result.output_names == ["output", "a_updated"]


def test_sdpa_decode_step_validates_moving_related_dimensions_together():
    """transformers' default attention (sdpa), an all-ones mask and a DynamicCache: the
    example's version holds where ``total == past + seq``, so validation moves ``seq``
    or ``past`` with ``total`` (it reported NOT OK: no other size found for them)."""
    transformers = pytest.importorskip("transformers")
    import torch

    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=99,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    batch, seq, past = 2, 3, 5
    cache = transformers.DynamicCache(config=config)
    for layer in range(2):
        cache.update(torch.randn(batch, 2, past, 8), torch.randn(batch, 2, past, 8), layer)
    kwargs = {
        "input_ids": torch.randint(0, 99, (batch, seq)),
        "attention_mask": torch.ones(batch, past + seq, dtype=torch.int64),
        "past_key_values": cache,
    }
    cache_dims = [[{0: "batch", 2: "past"}] * 2] * 2
    dynamic = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "past_key_values": cache_dims,
    }
    result = export_and_validate(model, (), kwargs, dynamic_shapes=dynamic)
    example_cases = [
        c.description for c in result.validation.cases if not c.description.startswith("[")
    ]
    assert any("seq=" in d and "total=" in d for d in example_cases), example_cases
    assert any("past=" in d and "total=" in d for d in example_cases), example_cases
