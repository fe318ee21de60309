"""The user's modules while tracing: attribute assignments in ``forward``.

``self.count += 1`` on a buffer runs ``Module.__setattr__(self, "count", proxy)`` and
torch accepts the proxy as the new buffer (it has ``__torch_function__``); a cache
stored with ``self.last = x`` leaves a proxy behind as well. Tracing must not change
the user's modules (:func:`~..isolation.module_snapshot.preserved_modules` restores
them after the trace), and the graph must still compute what eager does:
:func:`buffer_assignments` routes the assignment of a traced tensor to a buffer through
the tracer: an in-place update of that buffer (``+=``) is already in the graph, any
other new value becomes ``buffer.copy_(value)``, which keeps eager's values for every
later read (the buffer must keep its shape and dtype).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx.node import Node

from ..errors import TracingError
from ..isolation.module_classes import class_level_targets
from ..isolation.patch_window import patch_window
from ..isolation.patching import patched_attributes
from ..shape_rules._base import Unsupported, size_key
from .proxies import INPLACE_OPERATORS, CustomProxy

_INPLACE_OPERATORS = frozenset(INPLACE_OPERATORS)


@contextlib.contextmanager
def buffer_assignments(
    assign: Callable[[torch.nn.Module, str, Any], bool],
    assigned: Callable[[torch.nn.Module, str], None] | None = None,
) -> Iterator[None]:
    """Patches ``Module.__setattr__``: ``assign(module, name, value)`` handles the
    assignment of a buffer when it returns True; otherwise it happens as usual.
    ``assigned(module, name)`` is told of every assignment (a loop that assigns module
    attributes at each step cannot become a scan, see :mod:`.loops`)."""
    with patch_window():
        # on the traced modules' classes (see module_classes); one replacement per
        # original (they differ only under a nested trace)
        replacements: dict[int, Callable] = {}
        entries = []
        for cls in class_level_targets("__setattr__"):
            original = cls.__setattr__
            setattr_ = replacements.get(id(original))
            if setattr_ is None:
                setattr_ = replacements[id(original)] = _buffer_setattr(original, assign, assigned)
            entries.append((cls, "__setattr__", setattr_))
        with patched_attributes(entries):
            yield


def _buffer_setattr(original: Callable, assign: Callable, assigned: Callable | None) -> Callable:
    def setattr_(module: torch.nn.Module, name: str, value: Any) -> None:
        if assigned is not None:
            assigned(module, name)
        buffers = module.__dict__.get("_buffers")
        is_buffer = buffers is not None and buffers.get(name) is not None
        if is_buffer and assign(module, name, value):
            return
        original(module, name, value)

    return setattr_


def assign_traced_buffer(tracer: Any, module: torch.nn.Module, name: str, value: Any) -> bool:
    """``module.name = value`` on a buffer while ``tracer`` traces.

    Returns False to let a value that is not traced through (it is restored after the
    trace by :func:`preserved_modules`).
    """
    if tracer.running_fake or not isinstance(value, CustomProxy):
        return False
    buffer = module._buffers[name]
    qualified = tracer.tensor_name(buffer)
    if qualified is None:
        return False
    node = value.node
    first = node.args[0] if node.args else None
    reads_buffer = isinstance(first, Node) and first.op == "get_attr" and first.target == qualified
    in_place = node.target in _INPLACE_OPERATORS or (
        node.op == "call_method" and str(node.target).endswith("_")
    )
    if in_place and reads_buffer:
        # `self.count += 1`: the in-place update of the buffer is already recorded
        return True
    new, old = node.meta.get("val"), tracer.dims.from_real(buffer)
    if not _same_layout(new, old):
        raise TracingError.at(
            tracer.location(),
            f"forward assigns a new value to buffer {qualified!r} "
            f"({_summary(new)} instead of {_summary(old)}); a traced graph can only "
            f"update a buffer in place: keep its shape and dtype (for example "
            f"`self.{name}.copy_(...)`) or return the new value instead",
        )
    target = tracer.create_proxy("get_attr", qualified, (), {})
    tracer.create_proxy("call_method", "copy_", (target, value), {})
    return True


def _same_layout(new: Any, old: torch.Tensor) -> bool:
    """Same dtype and the same static shape (compared without deciding anything)."""
    if not isinstance(new, torch.Tensor) or new.dtype != old.dtype or new.dim() != old.dim():
        return False
    try:
        return [size_key(d) for d in new.shape] == [size_key(d) for d in old.shape]
    except Unsupported:
        return False


def _summary(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__
