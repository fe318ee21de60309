"""Adaptive pooling lowered for every input size, without a guard on it.

``F.adaptive_avg_pool2d(x, (oh, ow))`` averages (``adaptive_max_pool2d``: takes the
maximum of), for output row ``i`` of an axis of input size ``I`` and output size ``O``,
the input rows ``floor(i * I / O)`` to ``ceil((i + 1) * I / O)`` (excluded). torch's
decompositions (the ones torch.onnx's table applies) first ask whether ``I % O == 0``
(then it is an ``avg_pool2d`` or ``max_pool2d`` whose kernel is ``I // O``, a Python
int) and, otherwise, whether all windows have the same length: with a dynamic ``I``,
each question is a decision on the size, which the lowering would adopt as a constraint
(``h % 3 == 0``, the model then refusing the other heights; torch.onnx translates the
operators with the example's kernel instead, silently wrong at other sizes).

Here, when a pooled axis is dynamic, every axis takes the general path: windows of
``I // O + 2`` rows (the longest a window gets, for any ``I`` and ``O``) gathered from
clamped indices, the rows past a window's end masked out, then summed and divided by
each window's length, or reduced to their maximum and its index in the input plane
(``row * W + column``, the first maximum in row-major order, as torch's kernel).
Static inputs keep torch's decompositions.
"""

from __future__ import annotations

from typing import Any

import torch


def _is_static(size: Any) -> bool:
    return not isinstance(size, torch.SymInt) or size.node.maybe_as_int() is not None


def _windows(size: Any, out: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """For an axis of input size ``size`` pooled to ``out``: the clamped indices of each
    window ``[out, length]``, the mask of the rows inside it and its length ``[out]``."""
    rows = torch.arange(out, device=device, dtype=torch.int64)
    start = torch.div(rows * size, out, rounding_mode="floor")
    end = torch.div((rows + 1) * size + out - 1, out, rounding_mode="floor")
    offsets = torch.arange(size // out + 2, device=device, dtype=torch.int64)
    index = start.unsqueeze(-1) + offsets
    inside = index < end.unsqueeze(-1)
    index = torch.minimum(index, torch.scalar_tensor(size - 1, dtype=torch.int64, device=device))
    return index, inside, end - start


def adaptive_avg_pool2d(input: torch.Tensor, output_size: Any) -> torch.Tensor:
    """``aten._adaptive_avg_pool2d`` for the lowering's decomposition table."""
    from torch._decomp.decompositions import adaptive_avg_pool2d as torch_decomposition

    height, width = input.shape[-2:]
    out_h, out_w = (int(s) for s in output_size)
    if _is_static(height) and _is_static(width):
        return torch_decomposition(input, output_size)
    rows, rows_inside, rows_length = _windows(height, out_h, input.device)
    cols, cols_inside, cols_length = _windows(width, out_w, input.device)
    # [..., out_h, length_h, out_w, length_w]
    values = input[..., rows.unsqueeze(-1).unsqueeze(-1), cols]
    inside = rows_inside.unsqueeze(-1).unsqueeze(-1) & cols_inside
    compute = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    summed = torch.where(inside, values, 0).to(compute).sum(dim=(-3, -1))
    count = (rows_length.unsqueeze(-1) * cols_length).to(compute)
    return (summed / count).to(input.dtype)


def adaptive_max_pool2d(input: torch.Tensor, output_size: Any) -> Any:
    """``aten.adaptive_max_pool2d`` for the lowering's decomposition table: the
    maxima and their indices in the input plane."""
    from torch._decomp.decompositions import adaptive_max_pool2d as torch_decomposition

    height, width = input.shape[-2:]
    out_h, out_w = (int(s) for s in output_size)
    if (_is_static(height) and _is_static(width)) or out_h == 0 or out_w == 0:
        return torch_decomposition(input, output_size)
    rows, rows_inside, _ = _windows(height, out_h, input.device)
    cols, cols_inside, _ = _windows(width, out_w, input.device)
    length_w = cols.shape[-1]
    # [..., out_h, out_w, length_h * length_w]: each window's values in row-major order
    values = input[..., rows.unsqueeze(-1).unsqueeze(-1), cols].transpose(-3, -2)
    inside = (rows_inside.unsqueeze(-1).unsqueeze(-1) & cols_inside).transpose(-3, -2)
    flat = values.flatten(-2)
    # rows past a window's end never win: below every value
    fill = float("-inf") if input.dtype.is_floating_point else torch.iinfo(input.dtype).min
    flat = torch.where(inside.flatten(-2), flat, fill)
    maxima, where = flat.max(dim=-1)
    row_in_window = torch.div(where, length_w, rounding_mode="floor")
    col_in_window = where - row_in_window * length_w
    out_rows = torch.arange(out_h, device=input.device).unsqueeze(-1)
    out_cols = torch.arange(out_w, device=input.device)
    row = rows[out_rows, row_in_window]
    col = cols[out_cols, col_in_window]
    return maxima, row * width + col
