"""Images as grids of flattened patches, the input of Qwen2-VL-style vision towers.

A vision tower of this kind (Qwen2-VL and its successors, GLM-4V, Kimi, HunYuan-VL...)
does not take images as ``(batch, channels, height, width)``: its processor cuts each
image into patches of ``patch_size`` pixels (repeated ``temporal_patch_size`` times, as
the frames of a video), flattens each patch, and stacks the patches of every image in
one ``(patches, channels * temporal * patch * patch)`` tensor. Beside it comes each
image's grid of patches, ``grid_thw`` (``image_grid_thw`` in the language model),
``(frames, rows, columns)`` per image: the model reads the sizes of the images from
these values. Neighbouring patches are merged ``spatial_merge_size`` by
``spatial_merge_size`` after the tower, so rows and columns are multiples of it, and
each image takes ``rows * columns / merge**2`` image tokens in the text.

:class:`PatchGrid` builds such inputs at given sizes; :mod:`yobx.models.hf_families`
uses it for the ``vision-grid`` and ``vision-grid-text`` families.
"""

from __future__ import annotations

from typing import Any

import torch

from yobx.models.hf_configs import config_attribute

#: the names of each image's grid of patches, in the language model and in the tower
GRID_INPUTS = ("image_grid_thw", "grid_thw")


class PatchGrid:
    """The flattened patches of one image per text, and their grids (see the module's
    docstring). Sizes: ``batch`` images of ``grid_h`` rows and ``grid_w`` columns of
    patches; the patches' dimension is named ``patches``."""

    def __init__(self, config: Any, parameters: set[str]):
        self.grid_name = next(name for name in GRID_INPUTS if name in parameters)
        # the tower's first input (``hidden_states`` in Qwen2-VL's tower)
        self.pixels_name = "pixel_values" if "pixel_values" in parameters else "hidden_states"
        self.merge = int(config_attribute(config, "spatial_merge_size") or 1)
        self.temporal = int(config_attribute(config, "temporal_patch_size") or 1)
        patch = config_attribute(config, "patch_size", 8)
        self.patch = int(patch[0] if isinstance(patch, (list, tuple)) else patch)
        self.channels = int(
            config_attribute(config, "in_channels")
            or config_attribute(config, "in_chans")
            or config_attribute(config, "num_channels")
            or 3
        )
        #: patches flattened to vectors (Qwen2-VL), or kept as small images of
        #: ``(channels, patch, patch)`` (Kimi's tower convolves them)
        self.flat = True

    def sizes(self) -> dict[str, int]:
        """Images of two merged patches by two."""
        return {"grid_h": 2 * self.merge, "grid_w": 2 * self.merge}

    def other_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        """One merged patch more in rows, two in columns (not square)."""
        return {"grid_h": sizes["grid_h"] + self.merge, "grid_w": sizes["grid_w"] + 2 * self.merge}

    def tokens(self, sizes: dict[str, int]) -> int:
        """How many image tokens an image takes in the text."""
        return sizes["grid_h"] * sizes["grid_w"] // self.merge**2

    def make(self, sizes: dict[str, int], generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The patches of ``sizes["batch"]`` images, and their grids."""
        batch, rows, columns = sizes["batch"], sizes["grid_h"], sizes["grid_w"]
        width = self.channels * self.temporal * self.patch * self.patch
        shape = (width,) if self.flat else (self.channels, self.patch, self.patch)
        patches = torch.randn((batch * rows * columns, *shape), generator=generator)
        grid = torch.tensor([[1, rows, columns]] * batch, dtype=torch.int64)
        return {self.pixels_name: patches, self.grid_name: grid}

    def axes(self) -> dict[str, dict[int, str]]:
        return {self.pixels_name: {0: "patches"}, self.grid_name: {0: "batch"}}

    @staticmethod
    def derived(dynamic: set[str]) -> set[str]:
        """The dynamic dimensions, with ``patches`` when a size it depends on is."""
        if dynamic & {"batch", "grid_h", "grid_w"}:
            return dynamic | {"patches"}
        return dynamic
