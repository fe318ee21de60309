"""The user's modules restored after a trace: tracing does not mutate them.

``forward`` may assign attributes (``self.last = x`` leaves a proxy behind), install
hooks on its first call (transformers' output capture) or fill caches;
:func:`preserved_modules` snapshots every module's state before the trace and puts it
back after, also when the trace raises or is interrupted (the restoration is journaled
on the trace's :mod:`patch window <.patch_window>`).
"""

from __future__ import annotations

import builtins
import contextlib
import operator
from collections.abc import Iterator
from typing import Any

import torch

from .patch_window import register_undo

#: the builtin, even inside the trace's patch window
_ISINSTANCE = builtins.isinstance

_MISSING = object()


@contextlib.contextmanager
def preserved_modules(root: torch.nn.Module) -> Iterator[None]:
    """Restores the state of every module of ``root`` on exit.

    Attributes, parameters, buffers, submodules, and the contents of every dict, list
    or set a module holds (the hook registries: transformers installs its
    output-capturing hooks on the first call, which may be the traced one), and the
    global module hooks.
    """
    from torch.nn.modules import module as module_globals

    snapshot = [(m.__dict__, *_contents(m.__dict__)) for m in root.modules()]
    hooks = {
        name: dict(getattr(module_globals, name))
        for name in _GLOBAL_HOOKS
        if isinstance(getattr(module_globals, name, None), dict)
    }

    def restore() -> None:
        for current, attributes, containers, empty in snapshot:
            if not _identical_dicts(current, attributes):
                for name in [name for name in current if name not in attributes]:
                    del current[name]
                for name, value in attributes.items():
                    if current.get(name, _MISSING) is not value:
                        current[name] = value
            for name, contents in containers.items():
                _refill(attributes[name], contents)
            for container in empty:
                if container:
                    container.clear()
        for name, saved in hooks.items():
            _refill(getattr(module_globals, name), saved)

    # journaled: the trace's window restores the modules if an interrupt skips the exit
    undo = register_undo(restore)
    try:
        yield
    finally:
        undo()


#: the registries of hooks applying to every module
_GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
    "_global_forward_hooks_with_kwargs",
    "_global_forward_hooks_always_called",
)


def _contents(attributes: dict) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """A copy of the attributes, a copy of the items of each container among them that
    has items, and the empty containers (most of them: the hook registries, which are
    restored by emptying them again)."""
    # the builtin isinstance: the snapshot is taken inside the trace's patch window,
    # where the proxy-aware one costs more than the copies (hundreds of attributes)
    isinstance = _ISINSTANCE
    containers: dict[str, Any] = {}
    empty = []
    for name, value in attributes.items():
        if isinstance(value, (dict, list, set)):
            if value:
                containers[name] = dict(value) if isinstance(value, dict) else type(value)(value)
            else:
                empty.append(value)
    return dict(attributes), containers, empty


def _identical_dicts(current: dict, saved: dict) -> bool:
    """The same keys in the same order, each holding the same object (compared by
    identity, in C: most modules are left as they were, and a trace restores them all)."""
    return (
        len(current) == len(saved)
        and all(map(operator.is_, current, saved))
        and all(map(operator.is_, current.values(), saved.values()))
    )


def _refill(container: Any, contents: Any) -> None:
    """Puts ``contents`` back into ``container`` in place, when they differ."""
    if isinstance(container, dict):
        if not _identical_dicts(container, contents):
            container.clear()
            container.update(contents)
    elif isinstance(container, list):
        if len(container) != len(contents) or not all(map(operator.is_, container, contents)):
            container[:] = contents
    elif isinstance(container, set) and container != contents:
        container.clear()
        container.update(contents)
