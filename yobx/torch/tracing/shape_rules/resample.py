"""Shape rule of ``F.interpolate`` to a given size (nearest, bilinear, bicubic).

A vision transformer interpolates its static position table to the patch grid of the
image (``size=(height // 16, width // 16)``, symbolic): torch computes that through
the Python decomposition of the resampling, 200 ms per call on fake tensors (the
tracer must take it, see ``symbolic_variants._python_dispatched``). The output is
``[N, C, *size]`` of the input's dtype, laid out in the memory format torch suggests
for the input (``result.contiguous(memory_format=suggest_memory_format(input))`` in
every resampling decomposition): channels-last for a permuted table, else contiguous.

The rule also applies when the input is static and only the size is symbolic (the
other rules need a symbolic input, see :func:`.applies`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch._prims_common import (
    make_channels_last_strides_for,
    make_contiguous_strides_for,
    suggest_memory_format,
)

from ._base import (
    FLOATING,
    TensorFactory,
    Unsupported,
    exactly_contiguous,
    fake,
    is_one,
    is_static,
    needs_grad,
)

#: the parameters of ``F.interpolate``, in order, and their defaults
INTERPOLATE_PARAMETERS = (
    "input",
    "size",
    "scale_factor",
    "mode",
    "align_corners",
    "recompute_scale_factor",
    "antialias",
)
INTERPOLATE_DEFAULTS = {
    "size": None,
    "scale_factor": None,
    "mode": "nearest",
    "align_corners": None,
    "recompute_scale_factor": None,
    "antialias": False,
}
#: modes without corner alignment (F.interpolate refuses ``align_corners`` for them)
_NEAREST = ("nearest", "nearest-exact")
_LINEAR = ("bilinear", "bicubic")


def _bound(args: tuple, kwargs: dict) -> dict[str, Any]:
    if len(args) > len(INTERPOLATE_PARAMETERS) or any(
        k not in INTERPOLATE_PARAMETERS for k in kwargs
    ):
        raise Unsupported("arguments")
    bound = dict(INTERPOLATE_DEFAULTS)
    bound.update(zip(INTERPOLATE_PARAMETERS, args))
    for name, value in kwargs.items():
        if name in bound and INTERPOLATE_PARAMETERS.index(name) < len(args):
            raise Unsupported("argument given twice")
        bound[name] = value
    if "input" not in bound:
        raise Unsupported("no input")
    return bound


def _output_size(size: Any) -> list[Any]:
    if isinstance(size, (int, torch.SymInt)) and not isinstance(size, bool):
        size = [size, size]
    if not isinstance(size, (tuple, list)) or len(size) != 2:
        raise Unsupported("size")
    for s in size:
        if isinstance(s, bool) or not isinstance(s, (int, torch.SymInt)):
            raise Unsupported("size")
        # a static size must be valid (torch raises otherwise); a symbolic one is
        # checked by torch when the graph runs
        if type(s) is int and s <= 0:
            raise Unsupported("empty or negative size")
    return list(size)


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    """torch's ``suggest_memory_format(x)``, without deciding anything about symbols."""
    if not x._has_symbolic_sizes_strides:
        return suggest_memory_format(x)
    # an exactly contiguous input without size-1 dimensions cannot also be channels-last
    # contiguous (its channel stride is the product of the spatial sizes, not 1)
    if exactly_contiguous(x) and not any(is_one(s) for s in x.shape[1:]):
        return torch.contiguous_format
    raise Unsupported("layout of a symbolic input")


def interpolate(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``F.interpolate(x, size=...)`` of a 4-d floating tensor, no scale factor, no
    antialiasing."""
    bound = _bound(args, kwargs)
    x = fake(bound["input"])
    mode = bound["mode"]
    if x.dim() != 4 or x.dtype not in FLOATING or not isinstance(mode, str):
        raise Unsupported("input or mode")
    if bound["scale_factor"] is not None or bound["recompute_scale_factor"] is not None:
        raise Unsupported("scale factor")
    if bound["antialias"] is not False:
        raise Unsupported("antialiasing")
    align_corners = bound["align_corners"]
    if mode in _NEAREST:
        if align_corners is not None:
            raise Unsupported("align_corners with a nearest mode: torch raises")
    elif mode not in _LINEAR or align_corners not in (None, True, False):
        raise Unsupported("mode")
    if any(is_static(s, 0) for s in x.shape):
        raise Unsupported("empty input")
    sizes = [*x.shape[:2], *_output_size(bound["size"])]
    if _memory_format(x) == torch.channels_last:
        strides = make_channels_last_strides_for(sizes)
    else:
        strides = make_contiguous_strides_for(sizes)
    return factory.new(sizes, x.dtype, x.device, needs_grad([x]), strides)


FUNCTION_RULES: dict[Any, Any] = {F.interpolate: interpolate}
