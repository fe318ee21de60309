"""Attributes of modules and classes replaced for the length of a block.

:func:`patched_attributes` sets ``owner.name = value`` for a list of replacements and
restores everything on exit, also when the block raises or is interrupted; the block runs
in a :mod:`patch window <.patch_window>` (one at a time in the process) and the functions
it installs answer with the original behaviour in every thread but the patching one.
:func:`memoized_replacements` builds such a list once for as long as the attributes it
replaces do not change. The tracer's replacements (:mod:`..core.proxy_patches`), the
symbolic kernels (:mod:`..symbolic.symbolic_kernels`) and the ONNX lowering use them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from .patch_window import gated_value, patch_window, register_undo
from .type_slots import restore_slots, saved_slots

_MISSING = object()


def _settle_device_constructors() -> None:
    """Computes now the set of tensor factories ``with torch.device(...)`` applies to.

    torch computes it once per process (``torch.utils._device._device_constructors``,
    cached) the first time a device context meets a torch function. Computed while
    ``torch.arange`` or ``torch.ones`` are patched (a ``torch.device`` context inside a
    trace, as scan's), it would hold the patches instead of the factories, and every
    later ``with torch.device("meta")`` of the process would silently create tensors on
    the CPU: a big model built "on meta" would allocate all its weights.
    """
    from torch.utils import _device

    constructors = getattr(_device, "_device_constructors", None)
    if constructors is not None:
        constructors()


#: lists kept per memoized build
_MEMOIZED_LISTS = 4


def memoized_replacements(build: Callable[[], list[tuple[Any, str, Any]]]) -> Callable:
    """Wraps ``build`` (which reads the current attributes and returns the
    ``(owner, name, replacement)`` list) so that its list is built once and reused as
    long as every attribute it replaces is still the object it was built from.

    The replacements find their tracer through the proxies they receive, so they hold
    for every trace; building them (``functools.wraps`` copies attributes) and gating
    them again would cost each trace a few milliseconds. Someone else patching one of
    the attributes (a user's own patch, another library's) makes the next call rebuild.
    """
    # a few lists: the same build may run under different patches (the kernels'
    # variants inside a trace, over its indexing patch, and in the ONNX lowering)
    cache: list[tuple[list[tuple[Any, str, Any]], list[tuple[Any, str, Any]]]] = []

    @functools.wraps(build)
    def replacements() -> list[tuple[Any, str, Any]]:
        for entries, originals in cache:
            if all(getattr(owner, name, None) is found for owner, name, found in originals):
                return entries
        entries = build()
        originals = [(owner, name, getattr(owner, name, None)) for owner, name, _ in entries]
        cache.insert(0, (entries, originals))
        del cache[_MEMOIZED_LISTS:]
        return entries

    return replacements


@contextlib.contextmanager
def patched_attributes(replacements: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Sets ``owner.name = value`` for each replacement, restores all on exit.

    An attribute the owner only inherited (``Tensor.__getitem__`` comes from the C
    base class) is deleted again rather than set, so that inheritance is restored.
    The block runs in a :func:`~.patch_window.patch_window` (one at a time in the
    process); a function set on a module or a class is wrapped by
    :func:`~.patch_window.thread_gate`, so that other threads keep the original; the
    restoration is journaled on the window, which completes it if an interrupt cuts
    this block's exit short.
    """
    _settle_device_constructors()
    with patch_window():
        saved: list[tuple[Any, str, Any]] = []
        # a special method set and deleted again leaves a sequence slot behind
        # (type_slots)
        slots = saved_slots(
            [(owner, name) for owner, name, _ in replacements if isinstance(owner, type)]
        )

        def undo() -> None:
            for owner, name, value in reversed(saved):
                if value is not _MISSING:
                    setattr(owner, name, value)
                elif name in vars(owner):
                    delattr(owner, name)
            restore_slots(slots)

        restore = register_undo(undo)
        try:
            for owner, name, value in replacements:
                # saved before the change: an interrupt in between is undone too
                saved.append((owner, name, vars(owner).get(name, _MISSING)))
                setattr(owner, name, gated_value(owner, name, value))
            yield
        finally:
            restore()
