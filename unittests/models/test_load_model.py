"""Resolution of model names and the demo models themselves (eager)."""

import pytest
import torch

from yobx.models import DEMOS, ModelLoadError, load_model


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_demo_runs_on_its_inputs(name):
    model, args, kwargs, dynamic_shapes = load_model(name)
    assert isinstance(model, torch.nn.Module)
    assert not model.training
    assert isinstance(dynamic_shapes, dict)
    with torch.no_grad():
        model(*args, **kwargs)


def test_tiny_llm_cache_grows_and_mask_is_causal():
    model, _, kwargs, _ = load_model("tiny-llm")
    with torch.no_grad():
        out = model(**kwargs)
    past = kwargs["past_key_values"][0][0].shape[2]
    seq = kwargs["input_ids"].shape[1]
    assert out["logits"].shape == (2, seq, 128)
    assert out["present_key_values"][0][0].shape[2] == past + seq
    # Changing the last token must not change the logits of the earlier ones.
    ids = kwargs["input_ids"].clone()
    ids[:, -1] = (ids[:, -1] + 1) % 128
    with torch.no_grad():
        other = model(input_ids=ids, past_key_values=kwargs["past_key_values"])
    torch.testing.assert_close(other["logits"][:, :-1], out["logits"][:, :-1])
    assert not torch.allclose(other["logits"][:, -1], out["logits"][:, -1])


def test_factory_with_two_elements_gets_defaults():
    model, args, kwargs, dynamic_shapes = load_model("unittests.models.factories:two")
    assert isinstance(model, torch.nn.Linear)
    assert len(args) == 1 and kwargs == {} and dynamic_shapes is None


def test_factory_with_validation_inputs_keeps_them():
    loaded = load_model("unittests.models.factories:five")
    model, args, kwargs, dynamic_shapes = loaded
    assert dynamic_shapes == {"input": {0: "batch"}}
    assert [v["input"].shape[0] for v in loaded.validation_inputs] == [5]
    # a factory of four elements gives none
    assert load_model("unittests.models.factories:two").validation_inputs == []


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nope", "unknown model 'nope'"),
        ("unittests.models.factories:missing", "has no callable 'missing'"),
        ("unittests.models.factories:not_a_model", "expected a torch.nn.Module"),
        ("unittests.models.factories:fails", "failed: ValueError: no weights"),
        ("no_such_package_xyz.mod:f", "cannot import module"),
        ("hf:NoSuchArchitecture", "no model architecture named"),
    ],
)
def test_errors_are_clear(name, message):
    with pytest.raises(ModelLoadError, match=message.replace("(", r"\(")):
        load_model(name)


def test_hf_config_is_tiny():
    pytest.importorskip("transformers")
    from yobx.models.huggingface import tiny_config

    config = tiny_config("LlamaForCausalLM")
    assert config.hidden_size == 32 and config.num_hidden_layers == 2
