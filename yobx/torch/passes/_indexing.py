"""Decomposition of ``__getitem__``/``__setitem__`` indices into basic views.

``plan_index`` turns an index (ints, slices, ``None``, ``Ellipsis``, index tensors,
masks) into the chain of views torch applies (``select``, ``slice``, ``unsqueeze``) and
the advanced indices left for ``index_put``; ``scatter_steps`` writes a new value back
through such a chain.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Graph, Node

from ._targets import INT64_MAX, example_value, is_tensor


def _call(graph: Graph, target: Any, *args: Any) -> Node:
    return graph.call_function(target, args)


def is_full_slice(item: Any) -> bool:
    """Tells if a Python slice selects a whole dimension whatever its size."""
    return (
        isinstance(item, slice)
        and item.start in (None, 0)
        and item.stop in (None, INT64_MAX)
        and item.step in (None, 1)
    )


def _entry_kind(entry: Any) -> str | None:
    if entry is None:
        return "newaxis"
    if entry is Ellipsis:
        return "ellipsis"
    if isinstance(entry, bool):
        return None
    if isinstance(entry, int):
        return "int"
    if isinstance(entry, slice):
        bounds = (entry.start, entry.stop, entry.step)
        if any(isinstance(b, Node) and is_tensor(b) is not False for b in bounds):
            return None
        return "slice"
    if isinstance(entry, Node):
        kind = is_tensor(entry)
        if kind is False:
            return "int"
        return "advanced" if kind else None
    if isinstance(entry, (list, tuple)) and all(
        isinstance(e, int) and not isinstance(e, bool) for e in entry
    ):
        return "advanced"
    return None


@dataclass
class IndexPlan:
    """Decomposition of a ``__getitem__``/``__setitem__`` index.

    :param steps: basic views applied in order, ``("select", dim, index)``,
        ``("slice", dim, slice)`` or ``("unsqueeze", dim)``
    :param advanced: indices for ``index_put`` on the result of the steps (None entries for
        whole dimensions), empty when the index is basic
    """

    steps: list[tuple]
    advanced: list[Any]


def plan_index(index: Any, base_rank: int | None = None) -> IndexPlan | None:
    """Decomposes an index the way torch applies it, None when it cannot be proven."""
    entries = index if isinstance(index, tuple) else (index,)
    kinds = [_entry_kind(e) for e in entries]
    if any(k is None for k in kinds) or kinds.count("ellipsis") > 1:
        return None
    split = kinds.index("ellipsis") if "ellipsis" in kinds else len(kinds)
    steps: list[tuple] = []
    advanced: list[Any] = []
    dim: int | None = 0
    for entry, kind in zip(entries[:split], kinds[:split]):
        if kind in ("int", "slice", "newaxis") and dim is None:
            return None
        if kind == "newaxis":
            steps.append(("unsqueeze", dim))
            advanced.append(None)
            dim += 1
        elif kind == "int":
            steps.append(("select", dim, entry))
        elif kind == "slice":
            if not is_full_slice(entry):
                steps.append(("slice", dim, entry))
            advanced.append(None)
            dim += 1
        else:
            advanced.append(entry)
            dim = None if _mask_rank(entry) is None else dim + _mask_rank(entry)
    right = list(zip(entries[split + 1 :], kinds[split + 1 :]))
    if any(kind == "advanced" for _, kind in right):
        if base_rank is None or dim is None:
            return None
        return _plan_right_advanced(entries, kinds, split, base_rank)
    negative = -1
    for entry, kind in reversed(right):
        if kind == "newaxis":
            steps.append(("unsqueeze", negative))
            negative -= 1
        elif kind == "int":
            steps.append(("select", negative, entry))
        else:
            if not is_full_slice(entry):
                steps.append(("slice", negative, entry))
            negative -= 1
    if not any(a is not None for a in advanced):
        advanced = []
    return IndexPlan(steps, advanced)


def _plan_right_advanced(
    entries: tuple, kinds: list[str], split: int, base_rank: int
) -> IndexPlan | None:
    """Expands the ellipsis when advanced indices follow it (the rank must be known)."""
    consumed = 0
    for entry, kind in zip(entries, kinds):
        if kind in ("int", "slice"):
            consumed += 1
        elif kind == "advanced":
            rank = _mask_rank(entry)
            if rank is None:
                return None
            consumed += rank
    fill = base_rank - consumed
    if fill < 0:
        return None
    expanded = (*entries[:split], *([slice(None)] * fill), *entries[split + 1 :])
    return plan_index(expanded, None)


def _mask_rank(entry: Any) -> int | None:
    """Number of dimensions an advanced index consumes (a boolean mask consumes its rank)."""
    if isinstance(entry, (list, tuple)):
        return 1
    val = example_value(entry)
    if not isinstance(val, torch.Tensor):
        return None
    return val.dim() if val.dtype in (torch.bool, torch.uint8) else 1


def _index_for_dim(dim: int, entry: Any) -> tuple:
    if dim >= 0:
        return (*([slice(None)] * dim), entry)
    return (Ellipsis, entry, *([slice(None)] * (-dim - 1)))


def apply_step(graph: Graph, value: Node, step: tuple) -> Node:
    """Emits the view described by one step of an ``IndexPlan``."""
    if step[0] == "unsqueeze":
        return _call(graph, torch.unsqueeze, value, step[1])
    return _call(graph, operator.getitem, value, _index_for_dim(step[1], step[2]))


def scatter_step(graph: Graph, base: Node, new: Node, step: tuple) -> Node:
    """Emits the new value of ``base`` once the view ``step`` of it receives ``new``."""
    if step[0] == "unsqueeze":
        return _call(graph, torch.squeeze, new, step[1])
    if step[0] == "select":
        return _call(graph, torch.select_scatter, base, new, step[1], step[2])
    item: slice = step[2]
    return _call(
        graph,
        torch.slice_scatter,
        base,
        new,
        step[1],
        item.start,
        item.stop,
        1 if item.step is None else item.step,
    )


def scatter_steps(graph: Graph, base: Node, new: Node, steps: list[tuple]) -> Node:
    """Writes ``new`` into the view of ``base`` described by ``steps``."""
    intermediates = [base]
    for step in steps[:-1]:
        intermediates.append(apply_step(graph, intermediates[-1], step))
    for step, value in zip(reversed(steps), reversed(intermediates)):
        new = scatter_step(graph, value, new, step)
    return new


def basic_index_steps(index: Any) -> list[tuple] | None:
    """Returns the views of a basic index (ints, slices, None, Ellipsis), else None."""
    plan = plan_index(index)
    if plan is None or plan.advanced:
        return None
    return plan.steps
