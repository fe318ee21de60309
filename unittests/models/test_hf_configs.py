"""Tiny configurations: shrunk key by key, then repaired from the message of the rule
the shrinking broke (configuration validators and model constructors), without ever
growing a size beyond a small bound."""

from __future__ import annotations

import pytest
import torch

from yobx.models import hf_configs
from yobx.models.hf_configs import tiny_model

pytest.importorskip("transformers")


class _Config:
    """A configuration whose validator ties keys together, as transformers' do:
    key-value heads equal to the heads, a head width that the rotary sections of a
    nested sub-configuration must cover."""

    def __init__(self, **values):
        defaults = {
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "intermediate_size": 11008,
            "vision_config": {"model_type": "tiny_vision", "hidden_size": 1024, "layers": 24},
            "adapter_in_dim": 1024,
            "num_groups": 32,
        }
        self.values = {**defaults, **values}
        heads, kv = self.values["num_attention_heads"], self.values["num_key_value_heads"]
        if heads != kv:
            raise ValueError(
                f"num_key_value_heads ({kv}) must be the same as num_attention_heads ({heads})"
            )
        vision = self.values["vision_config"]["hidden_size"]
        if self.values["adapter_in_dim"] != vision:
            raise ValueError(
                f"`adapter_in_dim` ({self.values['adapter_in_dim']}) must match "
                f"`vision_config.hidden_size` ({vision})"
            )

    def to_dict(self):
        return dict(self.values)

    @classmethod
    def from_dict(cls, values):
        return cls(**values)


class _Model(torch.nn.Module):
    """A model whose constructor refuses a width its groups do not divide."""

    config_class = _Config

    def __init__(self, config):
        super().__init__()
        hidden, groups = config.values["hidden_size"], config.values["num_groups"]
        if hidden % groups:
            raise ValueError(f"hidden_size ({hidden}) must be divisible by num_groups ({groups})")
        self.norm = torch.nn.GroupNorm(groups, hidden)
        self.proj = torch.nn.Linear(config.values["adapter_in_dim"], hidden)

    def forward(self, x):
        return self.norm(self.proj(x))


def test_a_configuration_its_validators_refuse_is_repaired_from_their_messages():
    config, model = tiny_model(_Model)
    values = config.values
    # shrunk (hidden 32, 4 heads, 2 key-value heads) then repaired: the heads agree,
    # the adapter reads the vision tower's width, and the groups divide the width
    assert values["hidden_size"] == 32
    assert values["num_attention_heads"] == values["num_key_value_heads"] <= 4
    assert values["adapter_in_dim"] == values["vision_config"]["hidden_size"] == 32
    assert 32 % values["num_groups"] == 0
    assert sum(p.numel() for p in model.parameters()) < 10_000
    # the model is in evaluation mode and runs
    assert not model.training
    assert model(torch.randn(3, 32)).shape == (3, 32)


def test_a_repair_never_grows_a_size_beyond_the_bound():
    # the only value that satisfies this rule is the full-size one, which the repair
    # never tries: it stops, and raises the rule it could not satisfy
    tried = []

    class Wide(_Config):
        def __init__(self, **values):
            super().__init__(**values)
            tried.append(self.values["hidden_size"])
            if self.values["hidden_size"] != 4096:
                raise ValueError(f"hidden_size must be 4096, got {self.values['hidden_size']}")

    class Model(_Model):
        config_class = Wide

    with pytest.raises(ValueError, match="hidden_size must be 4096, got 32"):
        tiny_model(Model)
    assert 32 in tried[1:] and max(tried[1:]) <= hf_configs._LARGEST


def test_a_message_naming_no_key_is_raised_as_it_is():
    class Broken(_Config):
        def __init__(self, **values):
            super().__init__(**values)
            if self.values["hidden_size"] < 100:
                raise TypeError("'NoneType' object is not subscriptable")

    class Model(_Model):
        config_class = Broken

    with pytest.raises(TypeError, match="not subscriptable"):
        tiny_model(Model)


def test_two_rules_on_one_key_do_not_undo_each_other_forever():
    # rule 1 wants the adapter as wide as the vision tower, rule 2 as wide as the
    # text: no configuration satisfies both, and the repair stops
    class Torn(_Config):
        def __init__(self, **values):
            super().__init__(**values)
            adapter, hidden = self.values["adapter_in_dim"], self.values["hidden_size"]
            if adapter != hidden:
                raise ValueError(f"adapter_in_dim ({adapter}) must match hidden_size ({hidden})")

    class Model(_Model):
        config_class = Torn

    with pytest.raises(ValueError, match="must match"):
        tiny_model(Model)


@pytest.mark.parametrize(
    ("name", "key", "expected"),
    [
        # validator: "num_query_pool (3) must be less than the number of layers (2)"
        ("HieraModel", "num_query_pool", 1),
        # constructor: "num_channels (8) must be divisible by num_groups (32)"
        ("BitModel", "num_groups", 8),
    ],
)
def test_transformers_configurations_refused_when_shrunk_build_and_run(name, key, expected):
    from yobx.models.hf_families import hf_family_case

    model, kwargs, shapes, other = hf_family_case(name)
    assert getattr(model.config, key) == expected
    with torch.no_grad():
        model(**kwargs)
        model(**other)


def test_multimodal_rotary_sections_fit_the_tiny_head():
    from yobx.models.hf_families import model_class

    config = hf_configs.tiny_config(model_class("Qwen2VLModel"))
    text = config.text_config
    head = text.hidden_size // text.num_attention_heads
    assert sum(text.rope_parameters["mrope_section"]) == head // 2


def test_stages_kept_narrow_the_widths_a_head_reads_from_them():
    # a detection head reads the last three of four backbone stages: with the stages
    # kept, its input widths follow the backbone's; repeated widths (the decoder's own)
    # are not stage widths and stay
    full = {
        "model_type": "detector",
        "backbone_config": {
            "model_type": "backbone",
            "hidden_sizes": [256, 512, 1024, 2048],
            "depths": [3, 4, 6, 3],
            "out_indices": [2, 3, 4],
        },
        "encoder_in_channels": [512, 1024, 2048],
        "decoder_in_channels": [256, 256, 256],
        "feat_strides": [8, 16, 32],
    }
    shrunk = hf_configs._shrunk(full, keep_stages=True)
    backbone = shrunk["backbone_config"]
    assert backbone["hidden_sizes"] == [8, 16, 32, 64] and backbone["depths"] == [1] * 4
    assert backbone["out_indices"] == [2, 3, 4]
    assert shrunk["encoder_in_channels"] == [16, 32, 64]
    assert shrunk["decoder_in_channels"] == [256, 256, 256]
    assert shrunk["feat_strides"] == [8, 16, 32]
    # by default, two stages
    assert hf_configs._shrunk(full)["backbone_config"]["hidden_sizes"] == [8, 16]


def test_a_detector_reading_three_stages_runs():
    from yobx.models.hf_families import hf_family_case

    model, kwargs, shapes, other = hf_family_case("RTDetrModel")
    config = model.config
    assert config.encoder_in_channels == config.backbone_config.hidden_sizes[1:]
    with torch.no_grad():
        model(**kwargs)
        model(**other)


def test_zero_matrices_get_small_random_values():
    # a head initialised to zeros scores every candidate alike, and topk then picks
    # among ties, which eager and onnxruntime break differently
    class ZeroHead(_Model):
        def __init__(self, config):
            super().__init__(config)
            torch.nn.init.zeros_(self.proj.weight)

    config, model = tiny_model(ZeroHead)
    assert model.proj.weight.any()
    assert float(model.proj.weight.abs().max()) < 0.2


@pytest.mark.parametrize("name", ["SwinModel", "Swinv2Model", "PvtModel"])
def test_stage_heads_divide_the_tiny_widths_and_windows_fit_the_grid(name):
    """Swin's heads per stage (3, 6) do not divide the tiny width (32): they become
    powers of two; its window (7) is wider than the tiny image's grid, a regime of
    shrunk windows full-size models never meet: windows of 2 on a grid twice as wide at
    the last stage. The model runs on hf:'s inputs at both sizes."""
    from yobx.models.hf_families import hf_family_case

    model, kwargs, shapes, other = hf_family_case(name)
    config = model.config
    heads = getattr(config, "num_heads", None) or config.num_attention_heads
    assert all(h & (h - 1) == 0 for h in heads), heads
    if hasattr(config, "window_size"):
        grid = config.image_size // config.patch_size >> (len(config.depths) - 1)
        assert config.window_size == 2 and grid > config.window_size
    with torch.no_grad():
        model(**kwargs)
        model(**other)
