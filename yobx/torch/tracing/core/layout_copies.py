"""Writes through ``contiguous()`` and ``reshape``: a view at some sizes, a copy at others.

``x.contiguous()`` returns ``x`` itself when ``x`` is contiguous, a copy otherwise;
``x.reshape(...)`` (and ``flatten``) a view of ``x`` when ATen's ``computeStride``
finds strides for one, a copy otherwise. The values are the same either way, and the
trace takes the example's answer, or a copy when the ranges of the dimensions leave it
open (see :func:`~.fake_execution._copy_when_layout_undecided` and
:func:`~yobx.torch.tracing.symbolic.symbolic_variants._reshape_copy`), without a
decision: one would narrow the capture for nothing.

A write makes it matter: eager writes into ``x`` through the view, not through the copy
(``w = x[:, : n // 2].reshape(-1); w.mul_(2)`` doubles half of ``x`` where that reshape
is a view: ``x.shape[0] == 1`` or ``n // 2 == 1``). So every such call on a tensor whose
layout depends on the sizes is remembered (:class:`LayoutCall`), and a write into its
value, or into its input, turns the layout into decisions of the capture, conditions
on the sizes whose other sides versions capture (:meth:`decided_contiguity`,
:func:`merge_clauses`):

* where the trace's value already is what eager returns there, the call's node is
  marked a view or a copy (:data:`LAYOUT_KEY`), which the passes read (``remove_inplace``
  writes through the view into the input, or leaves the input alone) and the merging of
  versions compares;
* where the trace made a copy and eager returns a view, the tracer captures again
  (:class:`~yobx.torch.tracing.errors.LayoutAliasNeeded`), that line's layout decided
  from the start (:meth:`LayoutCopiesMixin.layout_decided_now`): the node's value a
  view of its input, marked one.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch.fx.node import Node
from torch.multiprocessing.reductions import StorageWeakRef

from ...node_text import operation_name
from ...passes._side_effects import writes
from ...passes._views import LAYOUT_COPY, LAYOUT_KEY, LAYOUT_VIEW
from ..errors import LayoutAliasNeeded
from ..shape_rules._base import (
    Unsupported,
    contiguous_strides,
    exactly_contiguous,
    same_size,
)
from ..shape_rules.views import view_strides
from .tracer_contract import MixinBase

_RESHAPE_METHODS = frozenset({"reshape", "flatten"})
_RESHAPE_FUNCTIONS = frozenset(
    {torch.reshape, torch.flatten, torch.Tensor.reshape, torch.Tensor.flatten}
)


@dataclasses.dataclass
class LayoutCall:
    """A ``contiguous()`` or reshape whose result is a view of its input at some sizes
    and a copy at others, remembered for a write that would make it matter.

    :param location: the user's ``file:line`` of the call
    :param source: the fake value the call was given (its input)
    :param node: the graph node of the call
    :param kind: ``"contiguous"`` or ``"reshape"``
    :param storage: the storage of the call's value in the trace
    :param source_storage: the storage of ``source`` (read at every later write)
    :param view: whether that value is a view of ``source`` (else a copy)
    """

    location: str
    source: torch.Tensor
    node: Node
    kind: str
    storage: Any
    source_storage: Any
    view: bool


def is_reshape_call(node: Node) -> bool:
    """``x.reshape(...)``, ``x.flatten(...)``, ``torch.reshape(x, ...)``..."""
    if node.op == "call_method":
        return node.target in _RESHAPE_METHODS
    return node.op == "call_function" and node.target in _RESHAPE_FUNCTIONS


def _first_tensor(args: tuple, kwargs: dict) -> Any:
    value = args[0] if args else kwargs.get("input")
    return value if isinstance(value, torch.Tensor) else None


def _storage(value: torch.Tensor) -> Any:
    return StorageWeakRef(value.untyped_storage())


def _static(source: torch.Tensor) -> bool:
    """Whether the sizes and strides of ``source`` are all Python ints."""
    return not any(isinstance(s, torch.SymInt) for s in (*source.shape, *source.stride()))


def _layout_varies(source: torch.Tensor) -> bool:
    """Whether a ``contiguous()`` or a reshape of ``source`` may be a view at some sizes
    and a copy at others: not when its sizes are static, nor when it is laid out as a
    fresh tensor (both are then views at every size)."""
    if _static(source):
        return False
    try:
        return not exactly_contiguous(source)
    except Unsupported:
        return True


def merged_range(old_sizes: list, new_sizes: list) -> tuple[int, int] | None:
    """``(start, end)`` when ``new_sizes`` are ``old_sizes`` with the dimensions
    ``start`` to ``end`` merged into one (``flatten(start, end)``, ``reshape(-1)``...),
    the others the same expressions; None otherwise."""
    merged = len(old_sizes) - len(new_sizes)
    if merged < 1 or not new_sizes:
        return None
    for start in range(len(new_sizes)):
        end = start + merged
        before = zip(old_sizes[:start], new_sizes[:start])
        after = zip(old_sizes[end + 1 :], new_sizes[start + 1 :])
        if all(same_size(o, n) for o, n in before) and all(same_size(o, n) for o, n in after):
            return start, end
    return None


def merge_clauses(sizes: list, strides: list, start: int, end: int) -> list[list[Any]]:
    """The condition on the sizes under which dimensions ``start`` to ``end`` of a
    tensor of ``sizes`` and ``strides`` merge into one view (computeStride's single
    chunk), as clauses that must all hold, each of comparisons one of which must: every
    two of the dimensions of size other than 1, with only sizes 1 between, are laid out
    one after the other (``stride[d] == stride[e] * size[e]``)."""
    clauses: list[list[Any]] = []
    for d in range(start, end + 1):
        for e in range(d + 1, end + 1):
            between = [sizes[m] != 1 for m in range(d + 1, e)]
            laid_out = strides[d] == strides[e] * sizes[e]
            clauses.append([sizes[d] == 1, sizes[e] == 1, *between, laid_out])
    return clauses


def contiguity_clauses(sizes: list, strides: list) -> list[list[Any]]:
    """torch's definition of a contiguous tensor as clauses that must all hold, each of
    comparisons one of which must: every dimension of size 1 or with the stride of a
    fresh tensor (a size of 1 multiplies nothing: the expected stride needs no case of
    its own)."""
    clauses: list[list[Any]] = []
    expected: Any = 1
    for size, stride in zip(reversed(sizes), reversed(strides)):
        clauses.append([size == 1, stride == expected])
        expected = expected * size
    return clauses


def _at_example(dims: Any, comparison: Any, path: list[Any]) -> bool:
    """The answer of ``comparison`` at the example; a symbolic one is appended to
    ``path`` as the fact it takes there."""
    if not isinstance(comparison, torch.SymBool):
        return bool(comparison)
    value = bool(dims.hint(comparison))
    path.append(comparison if value else torch.sym_not(comparison))
    return value


class LayoutCopiesMixin(MixinBase):
    """The decisions on the layout of ``contiguous()`` and ``reshape`` results that are
    written into (see the module's documentation). Mixed into
    :class:`~yobx.torch.tracing.CustomTracer`."""

    def remember_layout_call(self, node: Node, source: Any, value: Any, kind: str) -> None:
        """Records ``value``, what ``node`` made of ``source``, for a later write."""
        storage, source_storage = _storage(value), _storage(source)
        view = storage == source_storage
        call = LayoutCall(self.location(), source, node, kind, storage, source_storage, view)
        self.state.layout_calls.append(call)

    def settled_layout(self, node: Node, args: tuple, kwargs: dict, value: Any) -> Any:
        """The value of a ``contiguous()`` or reshape ``node`` that ran into ``value``:
        marked a view or a copy where that holds at every size (static sizes, a fresh
        tensor's layout; the passes may not prove a copy), else remembered for a later
        write; at a line whose layout is decided (:attr:`aliased_layouts`), the view
        or the copy eager makes, decided on the sizes (:meth:`layout_decided_now`)."""
        source = _first_tensor(args, kwargs)
        if source is None or not isinstance(value, torch.Tensor):
            return value
        kind = "reshape" if is_reshape_call(node) else "contiguous"
        if not _layout_varies(source):
            return self._layout_at_every_size(node, kind, source, value)
        if self.location() in self.aliased_layouts:
            return self.layout_decided_now(node, kind, source, value)
        self.remember_layout_call(node, source, value, kind)
        return value

    def _layout_at_every_size(self, node: Node, kind: str, source: Any, value: Any) -> Any:
        """The value of ``node`` where its layout is the same at every size (static
        sizes, or a fresh tensor's layout): eager's view of ``source`` or ``value``, a
        copy, the node marked a view or a copy. Not read from ``value``'s storage: a
        shape rule computes a fresh tensor for a reshape or a ``contiguous()`` that
        eager makes a view."""
        view = None
        with self.fake_mode:
            # symbolic sizes here: laid out as a fresh tensor (see _layout_varies)
            if kind == "contiguous" and (not _static(source) or source.is_contiguous()):
                view = source
            elif kind == "reshape":
                try:
                    view = source.view(value.shape)
                except (RuntimeError, ValueError):
                    # computeStride finds no view (torch's fake kernel raises a
                    # ValueError for it): reshape copies
                    view = None
        node.meta[LAYOUT_KEY] = LAYOUT_COPY if view is None else LAYOUT_VIEW
        return value if view is None else view

    def layout_decided_now(self, node: Node, kind: str, source: Any, value: Any) -> Any:
        """The value of ``node`` (``kind`` of call on ``source``, which gave ``value``
        in the trace so far) at a line whose layout is decided: ``source`` itself or a
        view of it where eager returns one, else a contiguous copy, the node marked a
        view or a copy."""
        strides = None
        if kind == "contiguous":
            view = self.decided_contiguity(node, source)
        else:
            strides = self._decided_view_strides(node, source, list(value.shape))
            view = strides is not None
        node.meta[LAYOUT_KEY] = LAYOUT_VIEW if view else LAYOUT_COPY
        with self.fake_mode:
            if view and strides is None:
                return source
            if view:
                return source.as_strided(list(value.shape), strides, source.storage_offset())
            if _storage(value) != _storage(source):
                return value
            copy = source.clone(memory_format=torch.contiguous_format)
            return copy if kind == "contiguous" else copy.view(value.shape)

    def decide_layouts_written(self, node: Node) -> None:
        """An in-place write ``node`` into a remembered call's value, or into its input:
        whether the call returned a view becomes a decision here (a fact of the
        capture, whose other side a version captures) and the call's node is marked a
        view or a copy. Where the trace made a copy and eager a view, the tracer
        captures again, that line's layout decided from the start
        (:class:`LayoutAliasNeeded`)."""
        written = {
            _storage(value)
            for target in writes(node)
            if isinstance(target, Node)
            and isinstance(value := target.meta.get("val"), torch.Tensor)
        }
        if not written:
            return
        for call in self.state.layout_calls:
            if LAYOUT_KEY in call.node.meta:
                continue
            if call.storage in written or call.source_storage in written:
                self._decide_layout(node, call)

    def _decide_layout(self, node: Node, call: LayoutCall) -> None:
        if call.kind == "contiguous":
            view = self.decided_contiguity(node, call.source)
        else:
            value = call.node.meta.get("val")
            sizes = list(value.shape) if isinstance(value, torch.Tensor) else []
            view = self._decided_view_strides(node, call.source, sizes) is not None
        if view == call.view:
            call.node.meta[LAYOUT_KEY] = LAYOUT_VIEW if view else LAYOUT_COPY
            return
        what = "`contiguous()`" if call.kind == "contiguous" else "the reshape"
        error = LayoutAliasNeeded.at(
            self.location(),
            f"{operation_name(node)} writes into the result of {what} at "
            f"{call.location}, or into its input, which is a view of its input at some "
            "sizes and a copy at others (the input's strides decide): write into a "
            "`.clone()` instead, or into the input directly",
        )
        error.copy_location = call.location
        raise error

    def decided_contiguity(self, node: Node, source: torch.Tensor) -> bool:
        """Whether ``source`` is contiguous, decided on the sizes
        (:func:`contiguity_clauses`, :meth:`_decided_clauses`). torch's own
        ``is_contiguous`` takes a symbolic size for not 1 without a guard
        (size-oblivious): trusted here, it would call ``x[:, :k]`` a copy at
        ``x.shape[0] == 1`` too, where eager returns a view and writes through it.

        An empty tensor is contiguous for torch; that is left out of the condition, since
        a view and a copy of no element hold the same values after any write."""
        clauses = contiguity_clauses(list(source.shape), list(source.stride()))
        return self._decided_clauses(node, clauses)

    def _decided_view_strides(self, node: Node, source: torch.Tensor, sizes: list) -> Any:
        """computeStride's strides for a view of ``source`` with ``sizes`` (None: a copy),
        decided on the sizes: a reshape to the same sizes is a view; one merging
        dimensions, as :func:`merge_clauses` and :meth:`_decided_clauses` say; any
        other, each comparison computeStride makes decided as at the example. ATen
        views an empty tensor whatever its strides; that is left out, for the reason
        :meth:`decided_contiguity` gives."""
        old_sizes, old_strides = list(source.shape), list(source.stride())
        if len(old_sizes) == len(sizes) and all(map(same_size, old_sizes, sizes)):
            return old_strides
        dims = self.trace_dims()
        path: list[Any] = []

        def one(size: Any) -> bool:
            return _at_example(dims, size == 1, path)

        at_example = functools.partial(_at_example, dims, path=path)
        strides = view_strides(old_sizes, old_strides, sizes, at_example, one)
        merged = merged_range(old_sizes, sizes)
        if merged is not None:
            view = self._decided_clauses(node, merge_clauses(old_sizes, old_strides, *merged))
        else:
            for comparison in path:
                self.decide(comparison, operation_name(node))
            view = strides is not None
        if view and strides is None:
            # an empty example (ATen views it whatever its strides, the clauses leave
            # that out): the strides ATen gives it, a fresh tensor's
            return contiguous_strides(sizes)
        return strides if view else None

    def _decided_clauses(self, node: Node, clauses: list[list[Any]]) -> bool:
        """Whether every clause holds (one of its comparisons), decided on the sizes in
        the name of ``node`` (the write, or the call whose line's layout is decided) by
        the comparisons the example's answer rests on: the first clause none of whose
        comparisons holds (each decided false), or the first comparison holding in each
        clause (decided true). Each is decided alone (:meth:`decide`, proved or
        adopted, its other side a version): torch's ShapeEnv cannot assume every
        conjunction of disjunctions (its simplification fails on some)."""
        dims = self.trace_dims()
        what = operation_name(node)

        def holds(comparison: Any) -> bool:
            if isinstance(comparison, torch.SymBool):
                return bool(dims.hint(comparison))
            return bool(comparison)

        failing = next((c for c in clauses if not any(map(holds, c))), None)
        if failing is not None:
            for comparison in failing:
                if isinstance(comparison, torch.SymBool):
                    self.decide(comparison, what)
            return False
        for clause in clauses:
            comparison = next(c for c in clause if holds(c))
            if isinstance(comparison, torch.SymBool):
                self.decide(comparison, what)
        return True
