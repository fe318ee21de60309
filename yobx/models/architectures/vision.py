"""Vision architectures: ViT, DeiT, DINOv2, Swin, SegFormer, ConvNeXt, ResNet.

Images are ``pixel_values [batch, 3, height, width]`` with dynamic batch, height and
width; the examples are not square so that the two spatial dimensions differ.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import ArchitectureCase, generator_for, hf_config, hf_model, make_case

IMAGE_DIMS = {"pixel_values": {0: "batch", 2: "height", 3: "width"}}


def image_inputs(interpolate_pos_encoding: bool | None = None):
    """``sizes -> {"pixel_values": [batch, 3, height, width]}``."""

    def make(sizes: dict[str, int]) -> dict[str, Any]:
        g = generator_for(sizes)
        shape = (sizes["batch"], 3, sizes["height"], sizes["width"])
        kwargs: dict[str, Any] = {"pixel_values": torch.randn(shape, generator=g)}
        if interpolate_pos_encoding is not None:
            kwargs["interpolate_pos_encoding"] = interpolate_pos_encoding
        return kwargs

    return make


def _image_case(
    name: str,
    model: torch.nn.Module,
    sizes: dict[str, int],
    other_sizes: list[dict[str, int]],
    interpolate_pos_encoding: bool | None = None,
    stress_sizes: list[dict[str, int]] | None = None,
) -> ArchitectureCase:
    return make_case(
        name,
        "vision",
        model,
        image_inputs(interpolate_pos_encoding),
        IMAGE_DIMS,
        sizes,
        other_sizes,
        stress_sizes,
    )


#: sizes multiple of the patch size (8) for the patch-embedding transformers
_PATCH_SIZES = {"batch": 2, "height": 32, "width": 48}
_PATCH_OTHER = [{"batch": 3, "height": 48, "width": 24}, {"batch": 4, "height": 64, "width": 40}]
#: a square image of the training resolution skips the interpolation (torch.export
#: adopts ``(height//8)*(width//8) != 16`` from the example), and 16x64 has the same
#: number of patches but is not square (interpolated in eager, refused by export)
PATCH_STRESS = [{"height": 32, "width": 32}, {"height": 16, "width": 64}]

_VIT_LIKE = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    image_size=32,
    patch_size=8,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def vit() -> ArchitectureCase:
    """ViTModel with ``interpolate_pos_encoding=True`` on non-square images."""
    model = hf_model("ViTModel", hf_config("ViTConfig", **_VIT_LIKE))
    return _image_case("vit", model, _PATCH_SIZES, _PATCH_OTHER, True, PATCH_STRESS)


def deit() -> ArchitectureCase:
    """DeiTModel (class and distillation tokens) with position interpolation."""
    model = hf_model("DeiTModel", hf_config("DeiTConfig", **_VIT_LIKE))
    return _image_case("deit", model, _PATCH_SIZES, _PATCH_OTHER, True, PATCH_STRESS)


def dinov2() -> ArchitectureCase:
    """Dinov2Model: always interpolates its position embeddings to the image size."""
    values = {k: v for k, v in _VIT_LIKE.items() if k != "intermediate_size"}
    model = hf_model("Dinov2Model", hf_config("Dinov2Config", mlp_ratio=2, **values))
    return _image_case("dinov2", model, _PATCH_SIZES, _PATCH_OTHER, None, PATCH_STRESS)


def swin() -> ArchitectureCase:
    """SwinModel on sizes that are not multiples of the patch or window size, so that
    the padding paths (``maybe_pad``, window padding, odd patch merging) run.

    The other sizes take the same padding branches as the example (torch.export
    adopts them: ``height // 2 % 2 == 1``...); the stress size takes other ones."""
    config = hf_config(
        "SwinConfig",
        image_size=32,
        patch_size=2,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
        mlp_ratio=2.0,
        drop_path_rate=0.0,
    )
    model = hf_model("SwinModel", config)
    sizes = {"batch": 2, "height": 30, "width": 22}
    others = [{"batch": 3, "height": 46, "width": 26}, {"batch": 4, "height": 30, "width": 50}]
    stress = [{"height": 36, "width": 28}]
    return _image_case("swin", model, sizes, others, None, stress)


def segformer() -> ArchitectureCase:
    """SegformerForSemanticSegmentation: overlapping patch embeddings, reduced
    attention, and a decode head that upsamples every stage to the first one."""
    config = hf_config(
        "SegformerConfig",
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=32,
        drop_path_rate=0.0,
        num_labels=3,
    )
    model = hf_model("SegformerForSemanticSegmentation", config)
    sizes = {"batch": 2, "height": 32, "width": 48}
    others = [{"batch": 3, "height": 40, "width": 24}, {"batch": 4, "height": 64, "width": 56}]
    return _image_case("segformer", model, sizes, others)


_CONV_SIZES = {"batch": 2, "height": 32, "width": 40}
_CONV_OTHER = [{"batch": 3, "height": 48, "width": 24}, {"batch": 4, "height": 37, "width": 53}]


def convnext() -> ArchitectureCase:
    """ConvNextModel with two stages."""
    config = hf_config(
        "ConvNextConfig", num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], patch_size=4
    )
    model = hf_model("ConvNextModel", config)
    return _image_case("convnext", model, _CONV_SIZES, _CONV_OTHER)


def resnet() -> ArchitectureCase:
    """ResNetModel with basic blocks and two stages."""
    config = hf_config(
        "ResNetConfig", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"
    )
    model = hf_model("ResNetModel", config)
    return _image_case("resnet", model, _CONV_SIZES, _CONV_OTHER)


BUILDERS = {
    "vit": vit,
    "deit": deit,
    "dinov2": dinov2,
    "swin": swin,
    "segformer": segformer,
    "convnext": convnext,
    "resnet": resnet,
}
