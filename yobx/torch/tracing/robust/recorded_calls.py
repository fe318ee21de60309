"""One eager run of a model, recorded per module: the inputs each submodule received,
and where a failure came from in the user's code.

Robust and recursive tracing (:mod:`.robust`, :mod:`.recursive`) trace submodules
with the real inputs they received.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..core.decisions import is_internal
from ..errors import TracingError
from ..inputs import call_arguments


@dataclasses.dataclass
class RecordedCall:
    """One call of a module during the eager run: inputs (copied before it ran), output."""

    args: tuple
    kwargs: dict
    output: Any = None


def _copy(value: Any) -> Any:
    """Copies inputs so that in-place code running later cannot change the record."""
    try:
        return copy.deepcopy(value)
    except Exception:
        return pytree.tree_map(
            lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value
        )


def example_call(
    fn: Callable, concrete_args: dict[str, Any] | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Turns ``concrete_args`` (values by parameter name) into ``(args, kwargs)`` for ``fn``."""
    return call_arguments(fn, dict(concrete_args or {}))


def record_calls(
    model: torch.nn.Module, args: tuple, kwargs: dict
) -> dict[torch.nn.Module, list[RecordedCall]]:
    """Runs ``model`` once eagerly and records the inputs and output of every module call.

    Forward hooks (``with_kwargs=True``) are removed and the buffers restored afterwards,
    also on errors, so that the model is left as it was (BatchNorm running statistics,
    caches updated in place...). The inputs of the run are copies of ``args``/``kwargs``.

    :param model: the model, run under ``torch.no_grad()``
    :param args: positional inputs
    :param kwargs: keyword inputs
    :return: for each module, its calls in execution order
    """
    calls: dict[torch.nn.Module, list[RecordedCall]] = {}
    pending: dict[torch.nn.Module, list[RecordedCall]] = {}

    def pre_hook(module, hook_args, hook_kwargs):
        call = RecordedCall(_copy(tuple(hook_args)), _copy(dict(hook_kwargs)))
        calls.setdefault(module, []).append(call)
        pending.setdefault(module, []).append(call)

    def post_hook(module, hook_args, hook_kwargs, output):
        stack = pending.get(module)
        if stack:
            stack.pop().output = pytree.tree_map(
                lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, output
            )

    handles = []
    saved = [
        (owner, name, tensor, tensor.detach().clone())
        for owner in model.modules()
        for name, tensor in owner._buffers.items()
        if tensor is not None
    ]
    try:
        for module in model.modules():
            handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
            handles.append(module.register_forward_hook(post_hook, with_kwargs=True))
        with torch.no_grad():
            model(*_copy(args), **_copy(kwargs))
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for owner, name, tensor, value in saved:
                owner._buffers[name] = tensor
                tensor.copy_(value)
    return calls


def failure_location(e: BaseException) -> str:
    """The user's ``file:line`` that raised ``e``.

    Taken from :attr:`TracingError.location <yobx.torch.tracing.TracingError>`, else
    from the last frame of the traceback (or of its causes) that is user code.
    """
    location = getattr(e, "location", "") if isinstance(e, TracingError) else ""
    if location and os.path.isfile(location.rsplit(":", 1)[0]):
        return location
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for frame in reversed(traceback.extract_tb(current.__traceback__)):
            if not is_internal(frame.filename):
                return f"{frame.filename}:{frame.lineno}"
        current = current.__cause__ or current.__context__
    return ""


__all__ = ["RecordedCall", "example_call", "failure_location", "record_calls"]
