"""Dynamic dimensions read off several input sets: the axes whose size differs.

:func:`~yobx.torch.inspect.record_run` traces the graph once, on the first input set,
then runs every set through it. Traced with static shapes, the graph refuses the second
set as soon as one size differs (``ConstraintViolationError``), so when no
``dynamic_shapes`` is given, every axis whose size differs between the sets is
declared ``Dim.DYNAMIC``: the sets themselves say which sizes vary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def varying_dynamic_shapes(named_runs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``dynamic_shapes`` (torch.export's format, by parameter name) declaring dynamic
    every axis of a tensor whose size differs between the input sets, or None when the
    sizes never differ.

    Tensors are followed through lists, tuples and dicts; any other container, and a
    leaf whose structure differs between the sets, stays static.

    :param named_runs: each input set as ``{parameter name: value}``
    """
    if len(named_runs) < 2:
        return None
    first, others = named_runs[0], named_runs[1:]
    spec = {name: _spec(value, [o.get(name) for o in others]) for name, value in first.items()}
    if not any(_declares(s) for s in spec.values()):
        return None
    return spec


def _spec(value: Any, others: list[Any]) -> Any:
    if isinstance(value, torch.Tensor):
        axes = {
            axis: torch.export.Dim.DYNAMIC
            for axis in range(value.dim())
            if any(
                isinstance(o, torch.Tensor)
                and o.dim() == value.dim()
                and o.shape[axis] != value.shape[axis]
                for o in others
            )
        }
        return axes or None
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        same = [o for o in others if type(o) is type(value) and len(o) == len(value)]
        return type(value)(_spec(v, [o[i] for o in same]) for i, v in enumerate(value))
    if type(value) is dict:
        same = [o for o in others if type(o) is dict and o.keys() == value.keys()]
        return {k: _spec(v, [o[k] for o in same]) for k, v in value.items()}
    return None


def _declares(spec: Any) -> bool:
    if isinstance(spec, dict) and spec and all(isinstance(k, int) for k in spec):
        return True
    if isinstance(spec, (list, tuple)):
        return any(_declares(s) for s in spec)
    if isinstance(spec, dict):
        return any(_declares(s) for s in spec.values())
    return False
