"""Shape rules of the CNN leaf modules: convolutions, batch norm in eval mode, pooling.

Only static spatial dimensions are handled (the batch may be dynamic): the output
size formula is then plain integer arithmetic. Inputs must be exactly contiguous
and free of size-1 dimensions, so that no memory-format question arises (a
contiguous input of such a shape is never also channels-last contiguous).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from ._base import (
    FLOATING,
    TensorFactory,
    Unsupported,
    fake,
    needs_grad,
    require_contiguous,
    size_key,
)


def _single_input(args: tuple, kwargs: dict) -> torch.Tensor:
    if kwargs or len(args) != 1:
        raise Unsupported("unexpected arguments")
    return fake(args[0])


def _spatial(
    x: torch.Tensor, spatial_rank: int, channels: int | None, dynamic: bool = False
) -> list[Any]:
    """The static spatial sizes of a batched input ``[N, C, *spatial]`` (its sizes,
    symbolic ones included, with ``dynamic``)."""
    if x.dim() != spatial_rank + 2 or x.dtype not in FLOATING:
        raise Unsupported("unbatched or non-floating input")
    keys = [size_key(s) for s in x.shape]
    if any(type(k) is int and k in (0, 1) for k in keys):
        raise Unsupported("size-1 or empty dimensions")
    if channels is not None and keys[1] != channels:
        raise Unsupported("channels")
    spatial = keys[2:]
    if dynamic:
        spatial = list(x.shape[2:])
    elif any(type(k) is not int for k in spatial):
        raise Unsupported("dynamic spatial dimensions")
    require_contiguous(x)
    return spatial


def _tuple(value: Any, rank: int) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * rank
    if isinstance(value, (tuple, list)) and len(value) == rank:
        return tuple(value)
    raise Unsupported("parameter")


def _window_output(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    out = (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    if out <= 0:
        raise Unsupported("empty output: torch raises")
    return out


def convolution_module(
    factory: TensorFactory, module: nn.Conv1d | nn.Conv2d | nn.Conv3d, args, kwargs
):
    """``nn.Conv1d/2d/3d`` with zero padding mode, numeric padding or ``"valid"``
    (none) or ``"same"`` (as many outputs as inputs: torch takes it with stride 1 only,
    and pads one more on the right for an even kernel)."""
    rank = {nn.Conv1d: 1, nn.Conv2d: 2, nn.Conv3d: 3}[type(module)]
    x = _single_input(args, kwargs)
    if module.padding_mode != "zeros":
        raise Unsupported("padding mode")
    same = module.padding == "same"
    spatial = _spatial(x, rank, module.in_channels, dynamic=same)
    if x.dtype != module.weight.dtype:
        raise Unsupported("dtype")
    if same:
        # torch's own kernel of this padding reads concrete sizes: its fake execution
        # would fix them to the example's
        out = list(spatial)
    else:
        # torch keeps only "same" and "valid" as text, any other padding as a tuple
        padding = (
            (0,) * rank if module.padding == "valid" else cast("tuple[int, ...]", module.padding)
        )
        out = [
            _window_output(size, k, s, p, d)
            for size, k, s, p, d in zip(
                spatial, module.kernel_size, module.stride, padding, module.dilation
            )
        ]
    grad = needs_grad([x, *module.parameters()])
    return factory.new([x.shape[0], module.out_channels, *out], x.dtype, x.device, grad)


def batch_norm_module(
    factory: TensorFactory,
    module: nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d,
    args,
    kwargs,
):
    """``nn.BatchNorm1d/2d/3d`` in eval mode with running statistics: same shape."""
    x = _single_input(args, kwargs)
    rank = {nn.BatchNorm1d: x.dim() - 2, nn.BatchNorm2d: 2, nn.BatchNorm3d: 3}[type(module)]
    if module.training or module.running_mean is None or rank not in (0, 1, 2, 3):
        raise Unsupported("training mode or no running statistics")
    _spatial(x, rank, module.num_features)
    grad = needs_grad([x, *module.parameters()])
    return factory.new(x.shape, x.dtype, x.device, grad)


def max_pool_module(factory: TensorFactory, module: nn.MaxPool1d | nn.MaxPool2d, args, kwargs):
    """``nn.MaxPool1d/2d`` without indices nor ceil mode."""
    rank = {nn.MaxPool1d: 1, nn.MaxPool2d: 2}[type(module)]
    x = _single_input(args, kwargs)
    if module.return_indices or module.ceil_mode:
        raise Unsupported("indices or ceil mode")
    spatial = _spatial(x, rank, None)
    kernel = _tuple(module.kernel_size, rank)
    stride = _tuple(module.stride if module.stride is not None else module.kernel_size, rank)
    padding = _tuple(module.padding, rank)
    dilation = _tuple(module.dilation, rank)
    out = [_window_output(*p) for p in zip(spatial, kernel, stride, padding, dilation)]
    return factory.new([*x.shape[:2], *out], x.dtype, x.device, needs_grad([x]))


def adaptive_avg_pool_module(
    factory: TensorFactory,
    module: nn.AdaptiveAvgPool1d | nn.AdaptiveAvgPool2d,
    args,
    kwargs,
):
    """``nn.AdaptiveAvgPool1d/2d`` to a fixed output size."""
    rank = {nn.AdaptiveAvgPool1d: 1, nn.AdaptiveAvgPool2d: 2}[type(module)]
    x = _single_input(args, kwargs)
    spatial = _spatial(x, rank, None)
    # None keeps the input's size
    sizes: tuple[int | None, ...] = _tuple(module.output_size, rank)
    out = [s if o is None else o for s, o in zip(spatial, sizes)]
    return factory.new([*x.shape[:2], *out], x.dtype, x.device, needs_grad([x]))


MODULE_RULES: dict[type, Any] = {
    nn.Conv1d: convolution_module,
    nn.Conv2d: convolution_module,
    nn.Conv3d: convolution_module,
    nn.BatchNorm1d: batch_norm_module,
    nn.BatchNorm2d: batch_norm_module,
    nn.BatchNorm3d: batch_norm_module,
    nn.MaxPool1d: max_pool_module,
    nn.MaxPool2d: max_pool_module,
    nn.AdaptiveAvgPool1d: adaptive_avg_pool_module,
    nn.AdaptiveAvgPool2d: adaptive_avg_pool_module,
}
