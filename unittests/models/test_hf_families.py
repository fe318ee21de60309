"""hf: for every family: tiny models of vision, audio, speech and encoder-decoder
architectures get their family's inputs, dynamic where eager runs at other sizes, and
every architecture of the table ``yobx export --list`` prints exports and validates
against eager at other sizes."""

from __future__ import annotations

import pytest
import torch

from yobx.models import ModelLoadError, load_model
from yobx.models.hf_families import KNOWN_TO_EXPORT, family_of, model_class

pytest.importorskip("transformers")

TABLE = [(family, name) for family, names in KNOWN_TO_EXPORT.items() for name in names]


@pytest.mark.parametrize(("family", "name"), TABLE, ids=[name for _, name in TABLE])
def test_every_listed_architecture_exports_and_validates(family, name):
    pytest.importorskip("onnxruntime")
    from yobx.torch.onnx import to_onnx

    assert family_of(model_class(name)) == family
    loaded = load_model(f"hf:{name}")
    model, args, kwargs, dynamic_shapes = loaded
    # with hf:'s inputs of other sizes for a family other than text (image tokens
    # matching the images...)
    assert bool(loaded.validation_inputs) == (family != "text")
    result = to_onnx(
        model,
        args,
        kwargs=kwargs,
        dynamic_shapes=dynamic_shapes,
        validate=True,
        validation_inputs=loaded.validation_inputs,
    )
    report = result.validation
    assert report.ok, report.format()
    # the example and at least one other size of the dynamic dimensions
    assert report.n_checked >= 2, report.format()
    assert "batch" in result.dynamic_dimensions


def test_image_sizes_are_dynamic_only_where_eager_takes_them():
    # a convolutional network takes any image size; a ViT without position
    # interpolation takes its training resolution only
    _, _, kwargs, shapes = load_model("hf:ResNetModel")
    assert shapes["pixel_values"] == {0: "batch", 2: "height", 3: "width"}
    _, _, kwargs, shapes = load_model("hf:ViTModel")
    assert shapes["pixel_values"] == {0: "batch"}
    assert kwargs["pixel_values"].shape[1:] == (3, 32, 32)


def test_family_inputs_are_named_by_their_role():
    model, _, kwargs, shapes = load_model("hf:T5ForConditionalGeneration")
    assert set(kwargs) == {"input_ids", "attention_mask", "decoder_input_ids"}
    assert shapes["decoder_input_ids"] == {0: "batch", 1: "decoder_seq"}
    _, _, kwargs, shapes = load_model("hf:CLIPModel")
    # text and images come in batches of their own
    assert shapes["input_ids"][0] == "text_batch" and shapes["pixel_values"][0] == "batch"
    assert kwargs["input_ids"].shape[0] != kwargs["pixel_values"].shape[0]
    _, _, kwargs, shapes = load_model("hf:Speech2TextModel")
    # Speech2Text takes frames then features; Whisper the other way round, and only
    # twice its positions in frames (static)
    assert shapes["input_features"] == {0: "batch", 1: "frames"}
    _, _, kwargs, shapes = load_model("hf:WhisperModel")
    assert shapes["input_features"] == {0: "batch"}
    model, _, kwargs, shapes = load_model("hf:Wav2Vec2Model")
    assert shapes["input_values"] == {0: "batch", 1: "samples"}
    with torch.no_grad():
        model(**kwargs)


def test_a_model_without_known_inputs_says_what_to_do():
    with pytest.raises(ModelLoadError, match=r"takes none of input_ids.*module:factory"):
        load_model("hf:DecisionTransformerModel")


def test_the_lists_of_a_stage_are_cut_with_the_stages():
    # PVT gives strides, patch sizes, heads and ratios per stage, and their number:
    # all are cut to the two tiny stages, or the model indexes past their end
    from yobx.models.hf_configs import tiny_config

    config = tiny_config(model_class("PvtV2Model"))
    stages = len(config.depths)
    assert stages == len(config.hidden_sizes) == config.num_encoder_blocks == 2
    for name in ("patch_sizes", "strides", "sr_ratios", "num_attention_heads", "mlp_ratios"):
        assert len(getattr(config, name)) == stages, name
    model, _, kwargs, shapes = load_model("hf:PvtV2Model")
    assert shapes["pixel_values"] == {0: "batch", 2: "height", 3: "width"}
    with torch.no_grad():
        model(**kwargs)


def test_a_timm_backbone_is_replaced_by_transformers_resnet():
    # timm is not a dependency of transformers: DETR's default backbone would not build
    from yobx.models.hf_configs import tiny_config

    config = tiny_config(model_class("DetrModel"))
    assert config.backbone_config.model_type == "resnet"
    assert config.backbone_config.hidden_sizes == [8, 16]


def test_image_tokens_stand_in_the_text_for_each_image_s_features():
    # LLaVA reads an image's features in place of as many image tokens of its text:
    # one image per text, in one batch, the text long enough for them
    model, _, kwargs, shapes = load_model("hf:LlavaModel")
    token = model.config.image_token_id
    assert token < model.config.text_config.vocab_size
    counts = (kwargs["input_ids"] == token).sum(dim=1)
    assert counts.tolist() == [counts[0].item()] * kwargs["pixel_values"].shape[0]
    assert counts[0] > 0 and kwargs["input_ids"].shape[1] > counts[0]
    assert shapes["input_ids"] == {0: "batch", 1: "seq"}
    assert shapes["pixel_values"][0] == "batch"


def test_speech_features_come_in_the_order_the_model_reads():
    # Parakeet takes frames then mel bins, which its configuration does not say
    model, _, kwargs, shapes = load_model("hf:ParakeetEncoder")
    features = kwargs["input_features"]
    assert features.shape[2] == model.config.num_mel_bins
    assert shapes["input_features"] == {0: "batch", 1: "frames"}


def test_audio_tokens_stand_in_the_text_for_each_clip_s_features():
    # a speech-language model reads each clip's features in place of its audio tokens
    model, _, kwargs, shapes = load_model("hf:AudioFlamingo3Model")
    assert family_of(model_class("AudioFlamingo3Model")) == "audio-text"
    counts = (kwargs["input_ids"] == model.config.audio_token_id).sum(dim=1)
    assert counts[0] > 0 and counts.tolist() == [counts[0].item()] * counts.shape[0]
    assert kwargs["input_features_mask"].shape == kwargs["input_features"].shape[::2]
    assert shapes["input_ids"] == {0: "batch", 1: "seq"}
    with torch.no_grad():
        model(**kwargs)


def test_a_multimodal_model_without_its_towers_reads_text():
    # Gemma 4 takes audio features too, but its tiny configuration has no audio tower;
    # its layer settings by index are those of the layers kept
    from yobx.models.hf_configs import tiny_config

    text = tiny_config(model_class("Gemma4Model")).to_dict()["text_config"]
    assert all(int(i) < text["num_hidden_layers"] for i in text["per_layer_config"])
    with pytest.warns(UserWarning, match="its text inputs alone are used"):
        model, _, kwargs, shapes = load_model("hf:Gemma4Model")
    assert set(kwargs) == {"input_ids", "attention_mask"}
    assert shapes["input_ids"] == {0: "batch", 1: "seq"}
    with torch.no_grad():
        model(**kwargs)


def test_a_vision_language_model_exports_at_other_text_and_batch_sizes():
    # PaliGemma (image tokens in the text): the ONNX model against eager on hf:'s inputs
    # of other sizes (the validation's own random tokens would hold no image token)
    pytest.importorskip("onnxruntime")
    from yobx.models.hf_families import hf_family_case

    model, kwargs, shapes, other = hf_family_case("PaliGemmaModel")
    assert shapes["input_ids"] == {0: "batch", 1: "seq"}
    _assert_onnx_matches_eager(model, kwargs, shapes, [other])


def _assert_onnx_matches_eager(model, kwargs, shapes, others):
    """The ONNX model's first output against eager's ``last_hidden_state``, on the
    example and on the other inputs."""
    import onnxruntime

    from yobx.torch.onnx import to_onnx

    result = to_onnx(model, (), kwargs=kwargs, dynamic_shapes=shapes)
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    for inputs in (kwargs, *others):
        with torch.no_grad():
            expected = model(**inputs).last_hidden_state
        got = session.run(None, {n: inputs[n].numpy() for n in names})[0]
        assert got.shape == tuple(expected.shape)
        torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-4, rtol=1e-4)


def test_images_as_grids_of_flattened_patches():
    # Qwen2-VL's tower: the patches of every image stacked, with each image's grid of
    # patches; the language model: as many image tokens per text as merged patches,
    # between the tokens starting and ending an image, and their token types
    from yobx.models.hf_families import hf_family_case

    tower, kwargs, shapes, other = hf_family_case("Qwen2_5_VisionTransformerPretrainedModel")
    assert family_of(type(tower)) == "vision-grid"
    assert shapes == {"hidden_states": {0: "patches"}, "grid_thw": {0: "batch"}}
    for inputs in (kwargs, other):
        grid = inputs["grid_thw"]
        assert inputs["hidden_states"].shape[0] == int(grid.prod(-1).sum())
        with torch.no_grad():
            out = tower(**inputs)
        merged = int(grid.prod(-1).sum()) // tower.config.spatial_merge_size**2
        assert out.pooler_output.shape[0] == merged
    # another grid, not square: other sizes differ in rows and columns
    assert other["grid_thw"][0, 1] != other["grid_thw"][0, 2]

    model, kwargs, shapes, other = hf_family_case("Qwen2VLModel")
    assert family_of(type(model)) == "vision-grid-text"
    assert shapes["pixel_values"] == {0: "patches"}
    assert shapes["input_ids"] == {0: "batch", 1: "seq"}
    config = model.config
    for inputs in (kwargs, other):
        ids, grid = inputs["input_ids"], inputs["image_grid_thw"]
        tokens = (ids == config.image_token_id).sum(-1)
        assert tokens.tolist() == (grid.prod(-1) // 4).tolist()
        assert (ids[:, 0] == config.vision_start_token_id).all()
        assert (inputs["mm_token_type_ids"] == (ids == config.image_token_id)).all()
        with torch.no_grad():
            model(**inputs)


def test_forecasters_get_their_window_and_export_at_other_sizes():
    # a forecaster's past values (and the future ones its decoder reads); TimesFM 2.5
    # reads a window of any number of patches, and keeps running statistics in a loop
    # over them: the ONNX model against eager at another batch and number of patches
    pytest.importorskip("onnxruntime")
    from yobx.models.hf_families import hf_family_case

    model, kwargs, shapes, other = hf_family_case("TimeSeriesTransformerModel")
    assert family_of(type(model)) == "time-series"
    assert {"past_values", "past_time_features", "future_values"} <= set(kwargs)
    assert shapes["past_values"] == {0: "batch"}

    model, kwargs, shapes, other = hf_family_case("TimesFm2_5Model")
    assert shapes["past_values"] == {0: "batch", 1: "steps"}
    assert other["past_values"].shape[1] > kwargs["past_values"].shape[1]
    _assert_onnx_matches_eager(model, kwargs, shapes, [other])
