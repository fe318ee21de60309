"""``list(range(n))`` over a symbolic size: a list as long as a dimension.

CPM-Ant builds its padding mask from the positions counted backwards::

    torch.tensor(list(range(seqlen - prompt_length))[::-1], device=device)

``list()`` iterates the range in C: the builtin list holds as many ints as the example
has positions, so the dimension is fixed to its example size (torch.export fixes it
too, and refuses it when declared dynamic). Inside the traced modules' code, ``list`` is
replaced while a trace runs (as ``range`` is, see :mod:`.symbolic_builtins`): ``list()``
of a :class:`~.loops.SymbolicRange` is a :class:`SymbolicRangeList`, which keeps the
length symbolic through what such code does with it:

* ``[::-1]`` (the positions backwards) and ``[:]`` (a copy);
* ``len()``, a truth test (a decision on the size, as for the range);
* ``torch.tensor(...)`` / ``torch.as_tensor(...)``: ``torch.arange`` over the same
  values (``dtype``, ``device`` passed on), which torch.tensor of the ints would hold;
* a ``for`` loop over it: a loop region, as over the range (see :mod:`.loops`).

Anything else (another index or slice, ``append``, a comparison, giving it to an
operation) makes the list for real, once: the length is then fixed to the example's,
as for the builtin, and what the code writes into it stays.
"""

from __future__ import annotations

import builtins
from typing import Any

import torch

from .loops import RealListFallbacks, SymbolicRange, _LoopIterator

_RANGE = builtins.range
_LIST = builtins.list
#: read at import: a trace replaces torch's factories by recording ones
_ARANGE = torch.arange


class SymbolicRangeList(RealListFallbacks, SymbolicRange):
    """``list(range(start, stop))`` with a symbolic ``stop``, ``reverse``: its ``[::-1]``."""

    def __init__(self, tracer: Any, start: int, stop: Any, reverse: bool = False):
        super().__init__(tracer, start, stop)
        self.reverse = reverse
        self._list: list | None = None

    def _real(self) -> Any:
        # made once: what the code writes into it stays
        if self._list is None:
            values = _LIST(_RANGE(self.start, self.tracer.to_int(self.stop)))
            self._list = values[::-1] if self.reverse else values
        return self._list

    def length(self) -> Any:
        """The number of items: symbolic until the list is made for real."""
        return super().length() if self._list is None else len(self._list)

    def __bool__(self) -> bool:
        return bool(self.length() != 0)

    def __iter__(self):
        if self._list is not None:
            return iter(self._list)
        return _LoopIterator(self, reverse=self.reverse)

    def __reversed__(self):
        if self._list is not None:
            return reversed(self._list)
        return _LoopIterator(self, reverse=not self.reverse)

    def __getitem__(self, item: Any) -> Any:
        if (
            self._list is None
            and type(item) is slice
            and item.start is item.stop is None
            and item.step in (None, -1)
        ):
            # `[:]` a copy, `[::-1]` the other way round
            reverse = self.reverse != (item.step == -1)
            return SymbolicRangeList(self.tracer, self.start, self.stop, reverse)
        return self._real()[item]

    def as_tensor(self, factory: Any, kwargs: dict) -> Any:
        """``factory(self, **kwargs)`` (``torch.tensor``): ``torch.arange`` over the
        same values."""
        if self._list is not None:
            return factory(self._list, **kwargs)
        length = self.length()
        bounds: tuple[Any, ...]
        if self.reverse:
            bounds = (self.start + length - 1, self.start - 1, -1)
        else:
            bounds = (self.start, self.start + length)
        return self.tracer.create_proxy("call_function", _ARANGE, bounds, kwargs)

    def __eq__(self, other: Any) -> Any:
        return self._real() == other

    def __ne__(self, other: Any) -> Any:
        return self._real() != other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        text = f"list(range({self.start}, {self.stop}))"
        return f"{text}[::-1]" if self.reverse else text


def range_list(values: Any) -> SymbolicRangeList | None:
    """What ``list(values)`` is in the traced code when ``values`` is a symbolic range
    (exactly: not one of its subclasses, the pieces of a tensor or a repeated list), or
    a list of one (a copy); None otherwise (the builtin's list)."""
    if type(values) is SymbolicRange:
        return SymbolicRangeList(values.tracer, values.start, values.stop)
    if type(values) is SymbolicRangeList and values._list is None:
        return values[:]
    return None
