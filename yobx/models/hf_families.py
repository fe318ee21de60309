"""Tiny Hugging Face models of every family, with the inputs their task takes.

``hf:<Architecture>`` builds a model of ``transformers`` from its configuration class,
with small sizes, random weights and nothing downloaded. The inputs follow from the
names of ``forward``'s parameters, which say the model's family:

====================  ==============================================================
family                inputs (dynamic dimensions)
====================  ==============================================================
``text``              ``input_ids``, ``attention_mask``, ``token_type_ids`` (batch, seq)
``vision``            ``pixel_values`` (batch, and height, width when eager runs at
                      another image size)
``vision-text``       ``input_ids``, ``attention_mask`` (text_batch, seq) and
                      ``pixel_values`` (image_batch, height, width where eager allows);
                      a model reading image features in place of image tokens
                      (LLaVA, PaliGemma) gets one image per text (batch), as many
                      image tokens in each text as an image has features, and each
                      image's size (``image_sizes``) where the model needs them
``audio``             ``input_values``: a waveform (batch, samples)
``speech-seq2seq``    ``input_features`` (batch, and frames where eager allows),
                      ``decoder_input_ids`` (batch, decoder_seq)
``audio-features``    ``input_features`` alone (an encoder of speech features), mel
                      bins then frames or the other way round, as the model reads them
``audio-text``        ``input_ids``, ``attention_mask`` (batch, seq) with as many audio
                      tokens as a clip has features, ``input_features`` and its mask
                      (batch, frames where eager allows): a speech-language model
                      (Audio Flamingo)
``text2text``         ``input_ids``, ``attention_mask`` (batch, seq),
                      ``decoder_input_ids`` (batch, decoder_seq)
``vision-grid``       a Qwen2-VL-style vision tower: each image's patches, flattened
                      and stacked (patches), and each image's grid of patches
                      ``grid_thw`` (batch); see :mod:`yobx.models.hf_grids`
``vision-grid-text``  the language model around such a tower: text with as many
                      image tokens as merged patches (batch, seq), their
                      ``mm_token_type_ids``, the patches and ``image_grid_thw``
``time-series``       a forecaster's window of ``past_values`` (batch, and steps
                      where the window's length is free), with the time features,
                      masks and future values it reads; see
                      :mod:`yobx.models.hf_series`
====================  ==============================================================

Configurations are shrunk key by key, and repaired where that breaks a rule tying keys
together (:mod:`yobx.models.hf_configs`).

A dimension is dynamic only when eager PyTorch runs the model at another size of it:
a ViT without position interpolation takes its training resolution only, so its height
and width stay static, while a ResNet takes any. :data:`KNOWN_TO_EXPORT` lists, by
family, the architectures whose export is tested (``yobx export --list`` prints it).
"""

from __future__ import annotations

import inspect
import re
import warnings
from typing import Any

import torch
import torch.utils._pytree as pytree

from yobx.models.hf_configs import (
    AUDIO_TOKENS,
    IMAGE_ENDS,
    IMAGE_STARTS,
    IMAGE_TOKENS,
    SPECIAL_TOKENS,
    config_attribute,
    tiny_model,
)
from yobx.models.hf_grids import GRID_INPUTS, PatchGrid
from yobx.models.hf_series import SeriesInputs
from yobx.models.loaded import LoadedModel

#: what each family's forward takes first
_MAIN_INPUTS = ("input_ids", "pixel_values", "input_values", "input_features")

#: architectures whose export (dynamic dimensions, validated against eager at other
#: sizes) is tested, by family; ``yobx export --list`` prints this table
KNOWN_TO_EXPORT: dict[str, list[str]] = {
    "text": [
        "BertModel",
        "GPT2LMHeadModel",
        "LlamaForCausalLM",
        "Qwen2ForCausalLM",
    ],
    "vision": [
        "ViTModel",
        "ViTForImageClassification",
        "DeiTModel",
        "ResNetModel",
        "ResNetForImageClassification",
        "ConvNextModel",
        "DetrModel",
        "PvtV2Model",
    ],
    "vision-text": ["CLIPModel", "SiglipModel", "PaliGemmaModel"],
    "audio": ["Wav2Vec2Model", "Wav2Vec2ForCTC", "HubertModel"],
    "speech-seq2seq": ["WhisperModel", "Speech2TextModel"],
    "audio-features": ["ParakeetEncoder"],
    "text2text": ["T5Model", "T5ForConditionalGeneration", "BartModel"],
    "time-series": ["TimeSeriesTransformerModel", "PatchTSTModel", "TimesFm2_5Model"],
}


def model_class(architecture: str) -> Any:
    """``transformers.<architecture>``, a model class."""
    import transformers

    found = getattr(transformers, architecture, None)
    if found is None or not hasattr(found, "config_class"):
        raise ValueError(f"transformers has no model architecture named {architecture!r}")
    return found


def family_of(cls: Any) -> str:
    """The family of a transformers model class, from the parameters of its
    ``forward`` (see the module's table)."""
    parameters = set(inspect.signature(cls.forward).parameters)
    if "past_values" in parameters:
        return "time-series"
    if parameters & set(GRID_INPUTS):
        return "vision-grid-text" if "input_ids" in parameters else "vision-grid"
    if "input_features" in parameters:
        if "decoder_input_ids" in parameters:
            return "speech-seq2seq"
        return "audio-text" if "input_ids" in parameters else "audio-features"
    if "decoder_input_ids" in parameters and "input_ids" in parameters:
        return "text2text"
    if "pixel_values" in parameters:
        return "vision-text" if "input_ids" in parameters else "vision"
    if "input_values" in parameters:
        return "audio"
    if "input_ids" in parameters:
        return "text"
    raise ValueError(
        f"{cls.__name__}.forward takes none of {', '.join(_MAIN_INPUTS)}: "
        "hf: does not know which inputs to build; pass a factory returning "
        "(model, args, kwargs, dynamic_shapes) instead (module:factory)"
    )


def _first(value: Any) -> int:
    """A size given as a number or as ``(height, width)``: the first one."""
    return int(value[0] if isinstance(value, (list, tuple)) else value)


class _Inputs:
    """Builds a family's inputs at given sizes (a seeded generator per call)."""

    def __init__(self, cls: Any, config: Any, family: str):
        self.family = family
        self.parameters = set(inspect.signature(cls.forward).parameters)
        self.vocab = int(config_attribute(config, "vocab_size", 99))
        self.channels = int(config_attribute(config, "num_channels", 3))
        image = config_attribute(config, "image_size", 32)
        # (height, width) when the configuration gives both (MGP-STR reads 32 x 128)
        self.image = _first(image)
        self.image_width = int(image[-1]) if isinstance(image, (list, tuple)) else self.image
        self.patch = _first(config_attribute(config, "patch_size", 8))
        self.mel_bins = int(
            config_attribute(config, "num_mel_bins")
            or config_attribute(config, "input_feat_per_channel", 16)
        )
        # Speech2Text takes frames then features, Whisper features (mel bins) then frames
        self.features_last = config_attribute(config, "input_feat_per_channel") is not None
        sources = None if self.features_last else config_attribute(config, "max_source_positions")
        # Whisper's encoder takes exactly twice its positions in frames
        self.frames = 2 * int(sources) if sources else 32
        self.type_vocab = int(config_attribute(config, "type_vocab_size", 0) or 0)
        #: a vision- or speech-language model's image or audio token, and how many of
        #: them each image's or clip's features take in the text (see
        #: :meth:`place_media_tokens`)
        names = AUDIO_TOKENS if family == "audio-text" else IMAGE_TOKENS
        tokens = [getattr(config, name, None) for name in names]
        self.media_token = next((t for t in tokens if isinstance(t, int)), None)
        self.media_tokens = 0
        #: whether the model gets each image's size (it needs them or fails with them)
        self.with_image_sizes = False
        #: images as grids of flattened patches (Qwen2-VL), and the tokens around an
        #: image's tokens in the text
        self.grid = PatchGrid(config, self.parameters) if "grid" in family else None
        #: a forecaster's window of past values (and the future ones it is trained on)
        self.series = SeriesInputs(config, self.parameters) if family == "time-series" else None
        self.around = [
            next((t for t in (getattr(config, n, None) for n in keys) if isinstance(t, int)), None)
            for keys in (IMAGE_STARTS, IMAGE_ENDS)
        ]

    def orient_features(self, model: torch.nn.Module) -> None:
        """Speech features come as (mel bins, frames) or (frames, mel bins) depending on
        the model, which the configuration does not always say (Parakeet, Canary):
        the other order is taken when the model runs with it only."""
        if "frames" not in self.sizes() or _runs(model, self.make(self.sizes())):
            return
        self.features_last = not self.features_last
        if not _runs(model, self.make(self.sizes())):
            self.features_last = not self.features_last

    def orient_patches(self, model: torch.nn.Module) -> None:
        """Patches of a grid come flattened (Qwen2-VL) or as small images (Kimi): the
        second form is taken when the model runs with it only."""
        if self.grid is None or _runs(model, self.make(self.sizes())):
            return
        self.grid.flat = False
        if not _runs(model, self.make(self.sizes())):
            self.grid.flat = True

    def place_media_tokens(self, model: torch.nn.Module) -> None:
        """For a vision- or speech-language model reading each image's (audio clip's)
        features in place of image (audio) tokens of its text (LLaVA, PaliGemma, Audio
        Flamingo...): finds how many tokens an image or a clip takes, trying the
        feature counts of ``get_image_features`` (``get_audio_features``) and of the
        model's own error on a text without any, and keeps the first count the model
        runs with. Texts and images or clips then come in one batch, one per text."""
        if self.family not in ("vision-text", "audio-text") or self.media_token is None:
            return
        for with_sizes in dict.fromkeys(["image_sizes" in self.parameters, False]):
            self.with_image_sizes = with_sizes
            for count in self._media_token_counts(model):
                self.media_tokens = count
                if _runs(model, self.make(self.sizes())):
                    return
        self.media_tokens = 0

    def _media_token_counts(self, model: torch.nn.Module) -> list[int]:
        counts: list[int] = []
        sizes = self.sizes()
        audio = self.family == "audio-text"
        name = "input_features" if audio else "pixel_values"
        inputs = self.make(sizes)
        # the first image or clip, and its size where the model takes it
        first = {k: inputs[k][:1] for k in (name, "image_sizes") if k in inputs}
        try:
            method = model.get_audio_features if audio else model.get_image_features
            with torch.no_grad():
                features = method(**first)
        except Exception:
            features = None
        for leaf in pytree.tree_leaves(features):
            if isinstance(leaf, torch.Tensor) and leaf.dim() >= 2:
                counts += [leaf.shape[-2], leaf.numel() // leaf.shape[-1]]
        try:
            with torch.no_grad():
                model(**self.make(sizes))
        except Exception as e:
            # "Image features and image tokens do not match, tokens: 0, features: 32"
            found = re.search(r"features:?\s*(\d+)", str(e))
            if found and int(found.group(1)) % sizes["batch"] == 0:
                counts.append(int(found.group(1)) // sizes["batch"])
        return [c for c in dict.fromkeys(counts) if 0 < c < 4096]

    def sizes(self) -> dict[str, int]:
        """The example's size of each dimension the family has."""
        sizes = {"batch": 2}
        if self.family in ("text", "text2text", "vision-text", "audio-text", "vision-grid-text"):
            sizes["seq"] = 7
        if self.series is not None:
            sizes.update(self.series.sizes())
        if self.grid is not None:
            sizes.update(self.grid.sizes())
            if "seq" in sizes:
                sizes["seq"] += self.grid.tokens(sizes)
        if self.family in ("vision", "vision-text"):
            sizes.update(height=self.image, width=self.image_width)
        if self.media_tokens:
            sizes["seq"] += self.media_tokens
        elif self.family == "vision-text":
            sizes.update(text_batch=2, batch=3)
        if self.family in ("text2text", "speech-seq2seq"):
            sizes["decoder_seq"] = 5
        if self.family in ("speech-seq2seq", "audio-features", "audio-text"):
            sizes["frames"] = self.frames
        if self.family == "audio":
            sizes["samples"] = 400
        return sizes

    def other_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        """Other sizes for each dimension: 1.5 times as many tokens, images a patch
        taller and two wider (not square), 1.3 times the samples or frames."""
        other = {name: value + 1 for name, value in sizes.items()}
        if "seq" in sizes:
            other["seq"] = sizes["seq"] + 4
        if "height" in sizes:
            other.update(height=sizes["height"] + self.patch, width=sizes["width"] + 2 * self.patch)
        if "samples" in sizes:
            other["samples"] = sizes["samples"] + 123
        if "frames" in sizes:
            other["frames"] = sizes["frames"] + 8
        if self.grid is not None:
            other.update(self.grid.other_sizes(sizes))
        if self.series is not None:
            other.update(self.series.other_sizes(sizes))
        return other

    def make(self, sizes: dict[str, int]) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(sum(sizes.values()))
        inputs: dict[str, torch.Tensor] = {}
        batch = sizes["batch"]
        if "seq" in sizes:
            text_batch = sizes.get("text_batch", batch)
            shape = (text_batch, sizes["seq"])
            # the last tokens of the vocabulary stay the image tokens' (hf_configs)
            high = max(self.vocab - SPECIAL_TOKENS, 4)
            inputs["input_ids"] = torch.randint(3, high, shape, generator=generator)
            self._place_tokens(inputs["input_ids"], sizes)
            if "mm_token_type_ids" in self.parameters and self.grid is not None:
                # 1 marks an image's token, 0 text (Qwen2-VL's rotary positions)
                image = inputs["input_ids"] == self.media_token
                inputs["mm_token_type_ids"] = image.to(torch.int64)
            if "attention_mask" in self.parameters:
                inputs["attention_mask"] = torch.ones(shape, dtype=torch.int64)
            if "token_type_ids" in self.parameters and self.type_vocab > 0:
                inputs["token_type_ids"] = torch.zeros(shape, dtype=torch.int64)
        if "height" in sizes:
            shape = (batch, self.channels, sizes["height"], sizes["width"])
            inputs["pixel_values"] = torch.randn(shape, generator=generator)
            if self.with_image_sizes:
                # each image's size before any resizing (LLaVA-NeXT, Mistral 3)
                image_size = [sizes["height"], sizes["width"]]
                inputs["image_sizes"] = torch.tensor([image_size] * batch, dtype=torch.int64)
        if self.grid is not None:
            inputs.update(self.grid.make(sizes, generator))
        if self.series is not None:
            inputs.update(self.series.make(sizes, generator))
        if "samples" in sizes:
            inputs["input_values"] = torch.randn((batch, sizes["samples"]), generator=generator)
        if "frames" in sizes:
            shape = (batch, self.mel_bins, sizes["frames"])
            if self.features_last:
                shape = (batch, sizes["frames"], self.mel_bins)
            inputs["input_features"] = torch.randn(shape, generator=generator)
            if "input_features_mask" in self.parameters:
                # every frame is speech (a speech-language model pools by the mask)
                mask_shape = (batch, sizes["frames"])
                inputs["input_features_mask"] = torch.ones(mask_shape, dtype=torch.int64)
        if "decoder_seq" in sizes:
            shape = (batch, sizes["decoder_seq"])
            inputs["decoder_input_ids"] = torch.randint(3, self.vocab, shape, generator=generator)
        return inputs

    def axes(self) -> dict[str, dict[int, str]]:
        """Each input's dimensions, named by their role."""
        text_batch = "text_batch" if self.family == "vision-text" else "batch"
        if self.media_tokens:
            text_batch = "batch"
        grid = self.grid.axes() if self.grid is not None else {}
        series = self.series.axes() if self.series is not None else {}
        return (
            {
                "input_ids": {0: text_batch, 1: "seq"},
                "attention_mask": {0: text_batch, 1: "seq"},
                "token_type_ids": {0: text_batch, 1: "seq"},
                "pixel_values": {0: "batch", 2: "height", 3: "width"},
                "input_values": {0: "batch", 1: "samples"},
                "input_features": {0: "batch", 1 if self.features_last else 2: "frames"},
                "input_features_mask": {0: "batch", 1: "frames"},
                "image_sizes": {0: "batch"},
                "decoder_input_ids": {0: "batch", 1: "decoder_seq"},
                "mm_token_type_ids": {0: "batch", 1: "seq"},
            }
            | grid
            | series
        )

    def _place_tokens(self, input_ids: torch.Tensor, sizes: dict[str, int]) -> None:
        """Puts each image's (clip's) tokens in its text, after the token starting an
        image and before the one ending it where the model has them."""
        count = self.grid.tokens(sizes) if self.grid is not None else self.media_tokens
        if not count or self.media_token is None:
            return
        input_ids[:, 1 : 1 + count] = self.media_token
        start, end = self.around
        if start is not None:
            input_ids[:, 0] = start
        if end is not None and 1 + count < input_ids.shape[1]:
            input_ids[:, 1 + count] = end


def _runs(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> bool:
    try:
        with torch.no_grad():
            model(**inputs)
    except Exception:
        return False
    return True


def hf_family_model(architecture: str, batch: int = 2) -> LoadedModel:
    """``(model, args, kwargs, dynamic_shapes)`` for a tiny random model of any family,
    with inputs where every dynamic dimension has another size as its
    ``validation_inputs``.

    Each dimension is dynamic when eager runs the model with that dimension alone at
    another size (the others at the example's); the rest stay static, so that the
    export never claims a size the model does not take. A multimodal model that does
    not run on its family's inputs but runs on text (no tower in its tiny
    configuration, media inputs hf: cannot build) gets its text inputs alone, with a
    ``UserWarning`` naming what is not exported.

    :raises ValueError: unknown architecture, no known inputs, or a model that runs
        neither on the inputs built for its family nor on text
    """
    model, kwargs, dynamic_shapes, other = hf_family_case(architecture, batch=batch)
    # the validation's random inputs of other sizes hold no image token: these do
    return LoadedModel((model, (), kwargs, dynamic_shapes), [other])


def _family_inputs(
    cls: Any, config: Any, family: str, model: torch.nn.Module, batch: int
) -> tuple[_Inputs, dict[str, int], dict[str, torch.Tensor]]:
    """The inputs of ``family`` for ``model``: their builder, sizes and values."""
    maker = _Inputs(cls, config, family)
    maker.orient_features(model)
    maker.orient_patches(model)
    maker.place_media_tokens(model)
    sizes = maker.sizes()
    if "text_batch" in sizes:
        # texts and images in batches of their own sizes, so that they stay apart
        sizes.update(text_batch=batch, batch=batch + 1)
    else:
        sizes["batch"] = batch
    return maker, sizes, maker.make(sizes)


def hf_family_case(
    architecture: str, batch: int = 2
) -> tuple[Any, dict[str, torch.Tensor], dict, dict[str, torch.Tensor]]:
    """``(model, kwargs, dynamic_shapes, other_kwargs)``: :func:`hf_family_model`'s
    model and example, and inputs where every dynamic dimension has another size (the
    sizes a check of the export compares at; static ones keep the example's).

    :raises ValueError: as :func:`hf_family_model`
    """
    cls = model_class(architecture)
    family = family_of(cls)
    config, model = tiny_model(cls)
    maker, sizes, kwargs = _family_inputs(cls, config, family, model, batch)
    if family == "vision" and not _runs(model, kwargs):
        # a detection head reading more stages of its backbone than the two kept
        try:
            config, model = tiny_model(cls, keep_stages=True)
        except Exception:
            pass
        else:
            maker, sizes, kwargs = _family_inputs(cls, config, family, model, batch)
    try:
        with torch.no_grad():
            model(**kwargs)
    except Exception as e:
        # a multimodal model whose tiny configuration has no audio or vision tower
        # (Gemma 4) still reads text
        text = _family_inputs(cls, config, "text", model, batch) if "input_ids" in kwargs else None
        if text is None or not _runs(model, text[2]):
            raise ValueError(
                f"{architecture} ({family}) does not run on the inputs hf: builds "
                f"({', '.join(kwargs)}): {type(e).__name__}: {e}; pass a factory "
                "returning (model, args, kwargs, dynamic_shapes) instead (module:factory)"
            ) from e
        warnings.warn(
            f"{architecture} ({family}) does not run on the inputs hf: builds for its "
            f"family ({', '.join(kwargs)}: {type(e).__name__}: {str(e)[:200]}); its text "
            "inputs alone are used, the other ones are not exported; pass a factory "
            "returning (model, args, kwargs, dynamic_shapes) for them (module:factory)",
            UserWarning,
            stacklevel=2,
        )
        maker, sizes, kwargs = text
    other = maker.other_sizes(sizes)
    dynamic = {name for name in sizes if _runs(model, maker.make({**sizes, name: other[name]}))}
    dynamic = PatchGrid.derived(dynamic) if maker.grid is not None else dynamic
    axes = maker.axes()
    dynamic_shapes = {
        name: {axis: dim for axis, dim in axes[name].items() if dim in dynamic} for name in kwargs
    }
    other_kwargs = maker.make(
        {name: other[name] if name in dynamic else size for name, size in sizes.items()}
    )
    return model, kwargs, dynamic_shapes, other_kwargs
