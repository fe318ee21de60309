"""Torch kernels that fail on or fix a dynamic size, routed to symbolic variants.

:func:`symbolic_kernels` is installed while tracing and by anything that re-runs a
traced graph on its fake values (the ONNX lowering). Only fake tensors take the detour:
real tensors, and every other thread, get torch's kernels.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..isolation.patch_window import patch_window
from ..isolation.patching import memoized_replacements, patched_attributes


@contextlib.contextmanager
def symbolic_kernels() -> Iterator[None]:
    """Routes torch kernels that fail on or fix a dynamic size to symbolic variants.

    Used while tracing and by anything that re-runs a traced graph on its fake values
    (the ONNX lowering): ``torch.max_pool1d`` becomes ``max_pool1d_with_indices``,
    ``baddbmm`` becomes ``bmm`` and additions, plus the variants of
    :mod:`.symbolic_variants` (indexing with a symbolic integer, ``take_along_dim``,
    ``reshape``/``flatten``, ``F.pad``, ``F.interpolate``, float32 ``_grouped_mm``).
    Only fake tensors take the detour. Restored on exit.
    """
    from . import symbolic_variants

    with (
        patch_window(),
        patched_attributes(_kernel_replacements()),
        symbolic_variants.grouped_mm_fake_values(),
    ):
        yield


@memoized_replacements
def _kernel_replacements() -> list[tuple[Any, str, Any]]:
    from . import symbolic_variants

    return [
        (torch, "max_pool1d", _symbolic_max_pool1d(torch.max_pool1d)),
        (torch, "baddbmm", _symbolic_baddbmm(torch.baddbmm)),
        (torch.Tensor, "baddbmm", _symbolic_baddbmm(torch.Tensor.baddbmm)),
        *symbolic_variants.replacements(),
    ]


def _symbolic_max_pool1d(original: Callable) -> Callable:
    """``torch.max_pool1d`` on fake tensors, keeping the length symbolic.

    Its C++ kernel fixes the input length to the example's (it guards
    ``length == 8``); the variant returning indices computes the same values with a
    symbolic output length. Only fake tensors (the tracer computing ``meta["val"]``,
    for ``F.max_pool1d`` and ``nn.MaxPool1d`` alike) take the detour.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    def max_pool1d(input, *args, **kwargs):
        if type(input) is FakeTensor:
            return torch.max_pool1d_with_indices(input, *args, **kwargs)[0]
        return original(input, *args, **kwargs)

    return max_pool1d


def _symbolic_baddbmm(original: Callable) -> Callable:
    """``baddbmm`` on fake tensors: torch's meta kernel rejects symbolic sizes.

    ``beta * input + alpha * (batch1 @ batch2)`` with the same broadcasting and dtype;
    ``beta == 0`` ignores ``input`` as baddbmm does (its NaNs do not propagate).
    """
    from torch._subclasses.fake_tensor import FakeTensor

    @functools.wraps(original)
    def baddbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):
        if out is None and type(input) is FakeTensor:
            product = torch.bmm(batch1, batch2)
            if alpha != 1:
                product = product * alpha
            if beta == 0:
                return product
            return product + (input if beta == 1 else input * beta)
        if out is None:
            return original(input, batch1, batch2, beta=beta, alpha=alpha)
        return original(input, batch1, batch2, beta=beta, alpha=alpha, out=out)

    return baddbmm
