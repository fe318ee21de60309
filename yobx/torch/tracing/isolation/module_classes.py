"""``nn.Module``'s attributes patched on the traced modules' classes instead.

A trace intercepts module calls, attribute reads and buffer assignments by replacing
``nn.Module.__call__``, ``__getattr__`` (torch.fx does) and ``__setattr__`` (see
:func:`~.module_state.buffer_assignments`). Setting a special method on a class makes
CPython update the matching slot of every subclass: ``nn.Module`` has hundreds once
transformers is imported, more with a few model families, and the six assignments
of a trace cost up to a millisecond (0.2 to 0.7 ms measured with Llama's classes
loaded, the most right after the model ran, when the subclasses' attribute caches
are valid again).

Set on the classes of the traced modules instead (they have few subclasses), the same
replacements cost a small fraction of that, and act on every call and attribute the
trace sees: those of the model's modules, of modules of the same classes built while
tracing, and of the enclosing trace's modules when a trace is nested (``torch.cond``
branches). A module of another class, built in ``forward``, is not intercepted: it is
traced through, which is what the tracer does with a module that has no path in the
model.

A class (or one of its bases below ``nn.Module``) with an attribute of its own that is
not a trace's replacement (a ``GraphModule``'s ``__call__``, a ``ScriptModule``'s
``__getattr__``) must not get the replacement on itself, which would hide its own:
``nn.Module`` is then patched too, as torch.fx does, and reached through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .world_state import THREAD_STATE

#: ``type.__flags__`` bit of the classes whose attributes cannot be set
_IMMUTABLE_TYPE = 1 << 8


@contextlib.contextmanager
def traced_module_classes(root: torch.nn.Module) -> Iterator[frozenset[type]]:
    """Inside the block, :func:`class_level_targets` answers for the classes of
    ``root``'s modules and of the enclosing traces' modules (this thread only)."""
    prior = THREAD_STATE.module_classes
    classes = frozenset(type(m) for m in root.modules())
    THREAD_STATE.module_classes = classes if prior is None else prior | classes
    try:
        yield THREAD_STATE.module_classes
    finally:
        THREAD_STATE.module_classes = prior


def class_level_targets(name: str) -> list[type]:
    """The classes to set ``nn.Module``'s attribute ``name`` on: the traced modules'
    classes, and ``nn.Module`` itself when one of them overrides the attribute (or
    outside a trace, where it is the only one)."""
    classes = THREAD_STATE.module_classes
    if not classes:
        return [torch.nn.Module]
    targets, base = [], False
    for cls in classes:
        if cls is torch.nn.Module or cls.__flags__ & _IMMUTABLE_TYPE or _overrides(cls, name):
            # torch.fx's own way for it; the other classes still get theirs, which
            # hide the replacements of an enclosing trace on them
            base = True
        else:
            targets.append(cls)
    # a stable order (patches are undone in reverse order)
    targets.sort(key=lambda c: (c.__module__, c.__qualname__, id(c)))
    return [torch.nn.Module, *targets] if base else targets


def _overrides(cls: type, name: str) -> bool:
    """Whether ``cls`` or a base below ``nn.Module`` defines ``name`` itself (a trace's
    own replacement, recognized by its gate, does not count)."""
    for base in cls.__mro__:
        if base is torch.nn.Module:
            return False
        value = vars(base).get(name)
        if value is not None and not hasattr(value, "__yobx_gate__"):
            return True
    # not a subclass of nn.Module
    return True


__all__ = ["class_level_targets", "traced_module_classes"]
