"""Diffusion models: diffusers' UNet2DModel, UNet2DConditionModel and AutoencoderKL
from tiny configurations, and a hand-written UNet block with odd-size padding branches.

Images have a dynamic batch, height and width. The diffusers cases are skipped (their
builders raise ImportError) when diffusers is not installed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .base import ArchitectureCase, generator_for, make_case, seeded_model

_SAMPLE_DIMS = {0: "batch", 2: "height", 3: "width"}


def _sample_inputs(channels: int, timestep: bool = False, text: int = 0):
    """``sizes -> {"sample": [batch, channels, height, width], ...}``."""

    def make(sizes: dict[str, int]) -> dict[str, Any]:
        g = generator_for(sizes)
        batch = sizes["batch"]
        shape = (batch, channels, sizes["height"], sizes["width"])
        kwargs: dict[str, Any] = {"sample": torch.randn(shape, generator=g)}
        if timestep:
            kwargs["timestep"] = torch.randint(0, 1000, (batch,), generator=g)
        if text:
            shape = (batch, sizes["text_seq"], text)
            kwargs["encoder_hidden_states"] = torch.randn(shape, generator=g)
        return kwargs

    return make


_BLOCKS = dict(block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4)


def unet2d() -> ArchitectureCase:
    """diffusers.UNet2DModel with one attention block and one downsampling."""
    import diffusers

    model = seeded_model(
        lambda: diffusers.UNet2DModel(
            sample_size=16,
            in_channels=3,
            out_channels=3,
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=4,
            **_BLOCKS,
        )
    )
    dims = {"sample": _SAMPLE_DIMS, "timestep": {0: "batch"}}
    sizes = {"batch": 2, "height": 16, "width": 24}
    others = [{"batch": 3, "height": 24, "width": 8}, {"batch": 4, "height": 32, "width": 20}]
    return make_case("unet2d", "diffusion", model, _sample_inputs(3, True), dims, sizes, others)


def unet2d_condition() -> ArchitectureCase:
    """diffusers.UNet2DConditionModel with cross attention on a text sequence; the
    stress size (odd height) takes its ``forward_upsample_size`` path."""
    import diffusers

    model = seeded_model(
        lambda: diffusers.UNet2DConditionModel(
            sample_size=16,
            in_channels=4,
            out_channels=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=16,
            attention_head_dim=4,
            **_BLOCKS,
        )
    )
    dims = {
        "sample": _SAMPLE_DIMS,
        "timestep": {0: "batch"},
        "encoder_hidden_states": {0: "batch", 1: "text_seq"},
    }
    sizes = {"batch": 2, "height": 16, "width": 24, "text_seq": 5}
    others = [
        {"batch": 3, "height": 12, "width": 20, "text_seq": 7},
        {"batch": 4, "height": 20, "width": 10, "text_seq": 3},
    ]
    stress = [{"height": 17, "width": 22}]
    make = _sample_inputs(4, timestep=True, text=16)
    return make_case("unet2d_condition", "diffusion", model, make, dims, sizes, others, stress)


def autoencoder_kl() -> ArchitectureCase:
    """diffusers.AutoencoderKL, encode then decode (the posterior's mode)."""
    import diffusers

    model = seeded_model(
        lambda: diffusers.AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
            latent_channels=4,
            sample_size=32,
            **_BLOCKS,
        )
    )
    sizes = {"batch": 2, "height": 16, "width": 24}
    others = [{"batch": 3, "height": 24, "width": 8}, {"batch": 4, "height": 32, "width": 20}]
    make = _sample_inputs(3)
    return make_case(
        "autoencoder_kl", "diffusion", model, make, {"sample": _SAMPLE_DIMS}, sizes, others
    )


class PaddedUNetBlock(nn.Module):
    """A UNet level written the way hand-made UNets are: pad odd sizes, downsample,
    upsample, concatenate the skip connection, crop back to the input size.

    :param branches: pad with ``if h % 2 != 0`` branches (the common style), else with
        pads computed as ``h % 2`` (no branch: one graph for every parity)
    """

    def __init__(self, channels: int = 4, branches: bool = True):
        super().__init__()
        self.branches = branches
        self.conv_in = nn.Conv2d(3, channels, 3, padding=1)
        self.norm = nn.GroupNorm(2, channels)
        self.down = nn.Conv2d(channels, channels * 2, 3, stride=2, padding=1)
        self.up = nn.Conv2d(channels * 2, channels, 3, padding=1)
        self.conv_out = nn.Conv2d(channels * 2, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2:]
        h = F.silu(self.norm(self.conv_in(x)))
        if self.branches:
            if h.shape[-2] % 2 != 0:
                h = F.pad(h, (0, 0, 0, 1))
            if h.shape[-1] % 2 != 0:
                h = F.pad(h, (0, 1, 0, 0))
        else:
            h = F.pad(h, (0, h.shape[-1] % 2, 0, h.shape[-2] % 2))
        skip = h
        d = F.silu(self.down(h))
        u = self.up(F.interpolate(d, scale_factor=2.0, mode="nearest"))
        out = self.conv_out(torch.cat([u, skip], dim=1))
        return out[..., :height, :width]


def _unet_block_case(name: str, branches: bool) -> ArchitectureCase:
    model = seeded_model(lambda: PaddedUNetBlock(branches=branches))
    # The other sizes keep the example's parities (odd height, even width); the stress
    # size swaps them.
    sizes = {"batch": 2, "height": 15, "width": 20}
    others = [{"batch": 3, "height": 17, "width": 24}, {"batch": 4, "height": 9, "width": 14}]
    stress = [{"height": 16, "width": 21}]

    def make(sizes: dict[str, int]) -> dict[str, Any]:
        shape = (sizes["batch"], 3, sizes["height"], sizes["width"])
        return {"x": torch.randn(shape, generator=generator_for(sizes))}

    dims = {"x": _SAMPLE_DIMS}
    return make_case(name, "diffusion", model, make, dims, sizes, others, stress)


def unet_block_branches() -> ArchitectureCase:
    """:class:`PaddedUNetBlock` with ``if dim % 2 != 0: pad`` branches."""
    return _unet_block_case("unet_block_branches", branches=True)


def unet_block_computed_pads() -> ArchitectureCase:
    """:class:`PaddedUNetBlock` padding by ``dim % 2`` without branches: one program
    is right for every parity (torch.export still refuses the stress size)."""
    return _unet_block_case("unet_block_computed_pads", branches=False)


BUILDERS = {
    "unet2d": unet2d,
    "unet2d_condition": unet2d_condition,
    "autoencoder_kl": autoencoder_kl,
    "unet_block_branches": unet_block_branches,
    "unet_block_computed_pads": unet_block_computed_pads,
}
