"""The user's parameters put back after an eager run of the model.

Capturing the other side of a decision runs the model eagerly at a size taking it
(:func:`~yobx.torch.tracing.constraints.witness_inputs.run_eagerly`). A forward that
writes into a parameter (``self.w.mul_(2)`` under ``no_grad``, a weight clipped in
place) then changed the user's model: every eager run of the trace wrote into it again.
The buffers, small, are copied before the run; the parameters may be gigabytes, so
:func:`preserved_parameters` copies a parameter only when a call first writes into its
memory (seen by a ``TorchFunctionMode``), and puts the copies back after the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode


def writes_in_place(func: Any, kwargs: dict) -> bool:
    """Whether a torch function or tensor method writes into its first argument (its
    name ends with ``_``: ``add_``, ``copy_``, ``index_copy_``; ``__setitem__`` and
    the ``__i*__`` operators) or into an ``out=`` tensor. ``func`` may be a method's
    name (the target of a ``call_method`` node)."""
    name = func if isinstance(func, str) else getattr(func, "__name__", "")
    if name.startswith("__"):
        return name == "__setitem__" or (name.startswith("__i") and name != "__index__")
    return name.endswith("_") or "out" in kwargs


def _memory(tensor: torch.Tensor) -> int | None:
    """The address of the storage of ``tensor`` (None for one without storage)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


class _FirstWrites(TorchFunctionMode):
    """Copies each of ``parameters`` when a call first writes into its memory (itself,
    a view of it, ``.data``)."""

    def __init__(self, parameters: list[torch.nn.Parameter]):
        super().__init__()
        self.owners: dict[int, list[torch.nn.Parameter]] = {}
        for parameter in parameters:
            address = _memory(parameter)
            if address is not None:
                self.owners.setdefault(address, []).append(parameter)
        #: id of the parameter -> the parameter and its :func:`snapshot` before the
        #: first write
        self.copies: dict[int, tuple] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.owners and writes_in_place(func, kwargs):
            for written in pytree.tree_leaves((args[:1], kwargs.get("out"))):
                if isinstance(written, torch.Tensor):
                    self._copy_owners(written)
        return func(*args, **kwargs)

    def _copy_owners(self, written: torch.Tensor) -> None:
        for parameter in self.owners.get(_memory(written) or -1, ()):
            if id(parameter) not in self.copies:
                # the mode is off inside its own handler: clone is not seen again
                self.copies[id(parameter)] = (parameter, snapshot(parameter))

    def put_back(self) -> None:
        """Writes the copies back into their parameters (see :func:`restore_all`)."""
        restore_all(list(self.copies.values()))


def snapshot(tensor: torch.Tensor) -> tuple:
    """What :func:`restore` puts back: the values of ``tensor``, its storage and its
    geometry, which a model may change in place (``t_()``, ``resize_``)."""
    with torch.no_grad():
        geometry = (tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        return tensor.detach().clone(), tensor.untyped_storage(), geometry


def restore(tensor: torch.Tensor, saved: tuple) -> None:
    """Puts ``tensor`` back as :func:`snapshot` saved it: the same storage seen with the
    same geometry, holding the same values."""
    values, storage, geometry = saved
    with torch.no_grad():
        now = (tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if now != geometry or _memory(tensor) != storage.data_ptr():
            tensor.set_(storage, *geometry)
        tensor.copy_(values)


def restore_all(saved: list[tuple[torch.Tensor, tuple]]) -> None:
    """:func:`restore` of each ``(tensor, snapshot)``: an interrupt landing in it makes
    it run again (the model is never left half restored), then is raised."""
    interrupt = None
    while True:
        try:
            for tensor, values in saved:
                restore(tensor, values)
            break
        except KeyboardInterrupt as exc:
            interrupt = interrupt or exc
    if interrupt is not None:
        raise interrupt


@contextlib.contextmanager
def preserved_parameters(module: torch.nn.Module) -> Iterator[None]:
    """Puts every parameter of ``module`` the block writes into back as it was, on
    exit (also when the block raises)."""
    writes = _FirstWrites(list(module.parameters()))
    try:
        with writes:
            yield
    finally:
        writes.put_back()


__all__ = ["preserved_parameters", "restore", "restore_all", "snapshot", "writes_in_place"]
