"""Loops over a dynamic range become a scan.

``for i in range(x.shape[1]):`` needs a Python int: torch.export (and the tracer, until
now) fixes the dimension to its example size, so a recurrent model's sequential loop
(a state-space model's slow path, an RNN written by hand) refuses every other length.
Inside the traced modules' code, ``range`` is replaced while a trace runs (as ``len``,
``int`` and ``float`` are, see :mod:`.symbolic_builtins`) by ``traced_range``: on a
symbolic size it returns a :class:`SymbolicRange`, whose iteration is a *loop region*.

The loop still runs as many times as on the example, so that every Python value the
code sees is the one eager would see; but each step's index is a new symbol ``i`` known
to lie in ``[start, stop - 1]`` (:attr:`SymbolicDimensions.loop_bounds`), so that
``x[:, i]`` needs no fact about the dimension, and the nodes each step records are kept
apart. When the loop ends, :mod:`.loop_rolling` checks that every step recorded the
same computation (up to the index, with values carried from one step to the next) and
that the Python values of the loop's frame do not change from one step to the next.

If so, the region is *closed*: its steps stay in the graph while the trace goes on, and
at the end of the trace they become one scan (:class:`~.control_flow.ScanCCOp`, an
ONNX ``Scan``) over the loop's real length. The values the rest of the code takes from
the loop must be ones a scan gives: the carried values after the last step, and the
list of one value per step given whole to ``torch.stack`` or ``torch.cat`` (or to
``len``, which then answers the symbolic length). Anything else (``outs[-1]``, a
decision on the index, a body that differs between steps, an example running the loop
fewer than twice) *unrolls* the region: the example's length is adopted, as before,
with the reason in the message.
"""

from __future__ import annotations

import builtins
import dataclasses
import dis
import sys
from types import FrameType
from typing import Any

import sympy
import torch
from torch.fx.node import Node

from yobx.torch.bounded_cache import BoundedCache

from ..isolation.patch_window import in_patch_window

_RANGE = builtins.range


def loop_index(loop: int, step: int) -> int:
    """Graph target standing for the index of a loop's step while the loop region is
    open; it never runs (the region becomes a scan or its indices constants)."""
    raise RuntimeError(f"loop_index({loop}, {step}) is a tracing placeholder")


def loop_stacked(loop: int, position: int, dim: int, how: str, first: tuple = ()) -> Any:
    """Graph target standing for ``torch.stack``/``torch.cat`` of a value the loop
    computes at every step (after ``first``: the value of a first step kept apart, see
    :attr:`LoopRegion.apart`); replaced by the scan's output (or the unrolled stack)."""
    raise RuntimeError(f"loop_stacked({loop}, {position}) is a tracing placeholder")


@dataclasses.dataclass(eq=False)
class LoopRegion:
    """One iteration over a :class:`SymbolicRange` while tracing."""

    number: int
    graph: torch.fx.Graph
    #: the user's ``file:line`` of the loop
    location: str
    start: int
    #: proxies of the range's end and of its length (``stop - start``)
    stop: Any
    length: Any
    #: how many steps the example runs
    count: int
    index_nodes: list[Node] = dataclasses.field(default_factory=list)
    #: the nodes each step recorded, in order
    steps: list[list[Node]] = dataclasses.field(default_factory=list)
    #: the Python locals of the loop's frame after each step, as comparable tokens
    frames: list[dict] = dataclasses.field(default_factory=list)
    #: why the loop cannot be a scan (None while it can)
    refusal: str | None = None
    #: the nodes the region hands out once closed: node -> (step, position)
    outputs: dict[Node, tuple[int, int]] = dataclasses.field(default_factory=dict)
    #: what :func:`~.loop_rolling.plan_scan` found (set when the region closes)
    plan: Any = None
    #: ``loop_stacked`` nodes made for this region
    stacked: list[Node] = dataclasses.field(default_factory=list)
    #: the last node of the graph when the region closed (the scan goes after it)
    last: Node | None = None
    unrolled: bool = False
    #: ``reversed(range(...))``: the steps run from the last index down
    reverse: bool = False
    #: the Python locals of the loop's frame before its first step, as comparable tokens
    before: dict | None = None
    #: why the first step is not one of the scan's (a decision on its index: ``if i ==
    #: 0:``), or None; the first step then runs before the scan, kept apart (see
    #: :func:`~.loop_rolling.without_first_step`)
    first_apart: str | None = None
    #: the nodes of the first step once it is kept apart from the scan
    apart: list[Node] = dataclasses.field(default_factory=list)
    #: the symbol of the first step's index (a constant once the step is kept apart)
    first_symbol: Any = None
    #: the nodes a list, tuple or dict of the loop's frame holds when the loop ends
    #: (``outs``): read by a constant index after the loop, ``outs[4]`` and ``outs[-1]``
    #: are the same node on the example, so none of them is taken for the last step's
    listed: set[Node] = dataclasses.field(default_factory=set)

    def index_value(self, step: int) -> int:
        """The index of ``step`` on the example."""
        return self.start + (self.count - 1 - step if self.reverse else step)

    def refuse(self, reason: str) -> None:
        """Marks the region as not a scan (the first reason is kept)."""
        if self.refusal is None:
            self.refusal = reason


class SymbolicRange:
    """``range(start, stop)`` with a symbolic ``stop``, in the traced code.

    Iterating over it, or over ``reversed()`` of it, opens a loop region (see the
    module's docstring); ``len()`` of it is the symbolic length. Anything else a range
    offers (indexing, ``in``, ``len`` outside the traced code) needs the real range:
    the length is then fixed to the example's, as for the builtin.
    """

    def __init__(self, tracer: Any, start: int, stop: Any):
        self.tracer = tracer
        self.start = start
        self.stop = stop

    def __iter__(self):
        return _LoopIterator(self, reverse=False)

    def __reversed__(self):
        return _LoopIterator(self, reverse=True)

    def length(self) -> Any:
        """The number of steps, a proxy of ``stop - start`` (0 where ``stop`` is below
        ``start``: ``range(1, n)`` at ``n = 0``, ``range(n - 1)`` too)."""
        steps = self.stop if self.start == 0 else self.stop - self.start
        # a comparison in the graph: torch folds `n - 1 < 0` to False on its positive
        # symbols, and the comparison's decision gets the sizes below the default range
        # (a version for `n < 1`) where a bare `n - 1` would count -1 steps there
        if steps < 0:
            return 0
        return steps

    def _real(self) -> range:
        return _RANGE(self.start, self.tracer.to_int(self.stop))

    def __len__(self) -> int:
        return len(self._real())

    def __getitem__(self, item: Any) -> Any:
        return self._real()[item]

    def __contains__(self, value: Any) -> bool:
        return value in self._real()

    def __repr__(self) -> str:
        return f"range({self.start}, {self.stop})"

    def item(self, index: Any) -> Any:
        """What a step gets from the index (the index itself for a range)."""
        return index


class SymbolicPieces(SymbolicRange):
    """``x.unbind(d)`` or ``x.split(s, d)``: as many pieces as a symbolic size says.

    Iterated over right away (``for p in x.unbind(1):``, ``loop`` is True), it is a
    loop over ``range(x.shape[d])`` whose steps get ``x.select(d, i)``
    (``x.select(d, i).unsqueeze(d)`` for ``split(1, d)``), see the module's docstring.
    Given whole to ``torch.stack`` or ``torch.cat``, the pieces join into what they
    make of ``x`` (:meth:`joined`: ``torch.stack(x.unbind(d), k)`` is ``x`` with axis
    ``d`` moved to ``k``). ``len()`` of them in the traced code is symbolic. One piece
    taken by a constant index (``x.unbind(0)[1]``, ``x.split(2)[0]``) is computed alone
    (:meth:`piece`), also after the first ones are sliced off (``x.split(2)[1:][1]``,
    :class:`TrailingPieces`). Anything else (other slices, unpacking into names) makes
    the pieces for real: their number is fixed to the example's, as before.
    """

    def __init__(
        self, tracer: Any, tensor: Any, dim: int, how: str, call: Any, size: int, loop: bool
    ):
        super().__init__(tracer, 0, tensor.shape[dim])
        self.tensor = tensor
        self.dim = dim
        self.how = how
        #: the size of each piece (``split``)
        self.size = size
        self.loop = loop
        self._call = call
        self._pieces: Any = None

    def length(self) -> Any:
        """The number of pieces."""
        return self.stop if self.size == 1 else (self.stop + self.size - 1) // self.size

    def joined(self, how: str, dim: int) -> Any:
        """``torch.stack``/``torch.cat`` (``how``) of the pieces along ``dim``, computed
        from the tensor (a new one, as they make), or None for a join of pieces that
        has no such form (the pieces are then made for real)."""
        x, d = self.tensor, self.dim
        rank = x.dim()
        if self.how == "unbind" and how == "stack" and -rank <= dim < rank:
            joined = x.movedim(d, dim % rank)
        elif self.how == "unbind" and how == "cat" and rank > 1 and -rank < dim < rank - 1:
            k = dim % (rank - 1)
            joined = x.movedim(d, k).flatten(k, k + 1)
        elif self.how == "split" and how == "cat" and -rank <= dim < rank and dim % rank == d:
            joined = x
        else:
            return None
        return joined.clone(memory_format=torch.contiguous_format)

    def item(self, index: Any) -> Any:
        if self.how == "unbind":
            return self.tensor.select(self.dim, index)
        # the same values as narrow(dim, index, 1), with a size torch knows is 1
        return self.tensor.select(self.dim, index).unsqueeze(self.dim)

    def _real(self) -> Any:
        if self._pieces is None:
            self._pieces = self._call()
        return self._pieces

    def __getitem__(self, item: Any) -> Any:
        whole = self.how == "unbind" or self.size == 1
        if self._pieces is None and type(item) is int and (whole or item >= 0):
            return self.piece(item)
        if self._pieces is None and _is_tail(item):
            return TrailingPieces(self, item.start or 0)
        return self._real()[item]

    def piece(self, index: int) -> Any:
        """Piece ``index`` alone, for any size of the tensor that has it: eager raises
        an IndexError for the others, the capture adopts that the piece exists (a
        decision on the size: versions or a checked constraint)."""
        if self.how == "unbind" or (self.size == 1 and index != 0):
            # select's own bounds: -n <= index < n
            return self.item(index)
        start = index * self.size
        if start > 0:
            # a split's first piece exists at any size: an empty tensor is its own piece
            torch._check(self.tensor.shape[self.dim] > start)
        window = [slice(None)] * self.dim + [slice(start, start + self.size)]
        return self.tensor[tuple(window)]

    def __iter__(self):
        if not self.loop or self._pieces is not None:
            return iter(self._real())
        return super().__iter__()

    def __reversed__(self):
        return reversed(self._real())

    def __repr__(self) -> str:
        return f"{self.how}({self.tensor}, dim={self.dim})"


def _is_tail(item: Any) -> bool:
    """Whether ``item`` is a slice ``[k:]`` with a constant ``k >= 0``."""
    return (
        type(item) is slice
        and item.stop is None
        and item.step in (None, 1)
        and (item.start is None or (type(item.start) is int and item.start >= 0))
    )


class TrailingPieces:
    """``pieces[k:]`` of :class:`SymbolicPieces`: one of them taken by a constant index
    (``x.flatten().split(2)[1:][1]``) is the piece ``k`` further, computed alone;
    anything else is the tuple of the pieces made for real, sliced (their number fixed
    to the example's, as before)."""

    def __init__(self, pieces: SymbolicPieces, offset: int):
        self.pieces = pieces
        self.offset = offset

    def _real(self) -> Any:
        return self.pieces._real()[self.offset :]

    def __getitem__(self, item: Any) -> Any:
        if self.pieces._pieces is None and type(item) is int and item >= 0:
            return self.pieces.piece(self.offset + item)
        if self.pieces._pieces is None and _is_tail(item):
            return TrailingPieces(self.pieces, self.offset + (item.start or 0))
        return self._real()[item]

    def __iter__(self):
        return iter(self._real())

    def __len__(self) -> int:
        return len(self._real())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._real(), name)

    def __repr__(self) -> str:
        return f"{self.pieces!r}[{self.offset}:]"


class RealListFallbacks:
    """What a list whose length is symbolic (:class:`SymbolicRepeat`,
    :class:`~.range_lists.SymbolicRangeList`) does not keep symbolic: the real list
    (``_real()``), its length fixed to the example's (for a dimension declared dynamic,
    refused with the user's line, as for the builtin)."""

    def _real(self) -> Any:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._real(), name)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._real()[key] = value

    def __delitem__(self, key: Any) -> None:
        del self._real()[key]

    def __add__(self, other: Any) -> Any:
        return self._real() + other

    def __radd__(self, other: Any) -> Any:
        return other + self._real()

    def __mul__(self, other: Any) -> Any:
        return self._real() * other

    __rmul__ = __mul__


class SymbolicRepeat(RealListFallbacks, SymbolicRange):
    """``[0] * n`` (or ``n * (a, b)``) with a symbolic ``n``: a list as long as a size.

    ``torch.tensor`` of it is the items' tensor repeated ``n`` times (Chroma's
    ``torch.tensor([0] * batch_size)``); ``len()`` of it in the traced code is
    symbolic; so are an item taken by a constant index (``l[0]``, ``l[-1]``: the capture
    adopts that it exists, as eager raises an IndexError where it does not) and an
    equality with a list or tuple written out (``[0] * n == [0, 0]`` is ``n == 2``).
    Anything else (iterating, slicing, writing) makes the list for real: ``n`` is then
    fixed to the example's, as for the builtin.
    """

    def __init__(self, tracer: Any, items: list | tuple, count: Any):
        super().__init__(tracer, 0, count if len(items) == 1 else count * len(items))
        self.items = items
        self.count = count
        self._list: Any = None

    def _real(self) -> Any:
        # made once: what the code writes into it stays
        if self._list is None:
            self._list = self.items * self.tracer.to_int(self.count)
        return self._list

    def __getitem__(self, item: Any) -> Any:
        if self._list is not None or type(item) is not int:
            return self._real()[item]
        # the item exists where the list is longer than the index (eager raises an
        # IndexError elsewhere): a decision on the size, not its example value
        length = self.length()
        torch._check(length > item if item >= 0 else length >= -item)
        return self.items[item % len(self.items)]

    def __eq__(self, other: Any) -> Any:
        settled = self._compared(other)
        return self._real() == other if settled is None else settled

    def __ne__(self, other: Any) -> Any:
        settled = self._compared(other)
        return self._real() != other if settled is None else not settled

    def _compared(self, other: Any) -> Any:
        """``self == other`` for a list or tuple written out, without making the list:
        False where ``other`` is not the items repeated (at any size), else the
        comparison of the count with its number of repeats. None for anything else."""
        if self._list is not None or type(other) not in (list, tuple):
            return None
        if type(other) is not type(self.items):
            return False
        repeats, rest = divmod(len(other), len(self.items))
        if rest or list(other) != list(self.items) * repeats:
            return False
        return self.count == repeats

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return bool(self.count != 0)

    def length(self) -> Any:
        """The number of items: symbolic until the list is made for real."""
        return super().length() if self._list is None else len(self._list)

    # iterating makes the list: a step gets a constant, so a loop in C (``sum()``)
    # would add up the example's number of items without recording anything
    def __iter__(self):
        return iter(self._real())

    def __reversed__(self):
        return reversed(self._real())

    def as_tensor(self, factory: Any, kwargs: dict) -> Any:
        """``factory(self, **kwargs)`` (``torch.tensor``): the items' tensor repeated."""
        if self._list is not None:
            return factory(self._list, **kwargs)
        base = factory(list(self.items), **kwargs)
        repeats = (self.count, *([1] * (base.dim() - 1)))
        return self.tracer.create_proxy("call_method", "repeat", (base, *repeats), {})

    def joined(self, how: str, dim: int) -> Any:
        """``torch.cat``/``torch.stack`` (``how``) of one traced tensor repeated: the
        tensor repeated along ``dim``, None for anything else (made for real)."""
        item: Any = self.items[0] if len(self.items) == 1 else None
        value = getattr(getattr(item, "node", None), "meta", {}).get("val")
        if item is None or not isinstance(value, torch.Tensor):
            return None
        rank = value.dim() + (how == "stack")
        if rank == 0 or not -rank <= dim < rank:
            return None
        dim %= rank
        counts = [1] * rank
        counts[dim] = self.count
        return (item.unsqueeze(dim) if how == "stack" else item).repeat(*counts)

    def __repr__(self) -> str:
        return f"{list(self.items)!r} * {self.count}"


class _LoopIterator:
    """The iterator of a :class:`SymbolicRange`: one step per ``__next__``."""

    def __init__(self, symbolic_range: SymbolicRange, reverse: bool):
        self.range = symbolic_range
        self.reverse = reverse
        self.region: LoopRegion | None = None

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        tracer = self.range.tracer
        frame = sys._getframe(1)
        if self.region is None:
            self.region = tracer.loop_begin(self.range, self.reverse, frame)
        return self.range.item(tracer.loop_next(self.region, frame))


def symbolic_range(*args: Any) -> SymbolicRange | None:
    """What ``range(*args)`` is in the traced code: a :class:`SymbolicRange` when the end
    is a symbolic size (the start a Python int, no step) and a loop may start here,
    else None (the builtin's range)."""
    from .proxies import CustomProxyInt

    if in_patch_window() and len(args) in (1, 2):
        stop = args[-1]
        start = args[0] if len(args) == 2 else 0
        if (
            isinstance(stop, CustomProxyInt)
            and type(start) is int
            and start >= 0
            and isinstance(stop.node.meta.get("val"), torch.SymInt)
            and stop.node.meta["val"].node.maybe_as_int() is None
            and stop.tracer.loops_allowed()
        ):
            return SymbolicRange(stop.tracer, start, stop)
    return None


_ITERATED: dict[tuple, bool] = BoundedCache(4096)


def iterated_at_once(frame: FrameType | None) -> bool:
    """Whether what the frame's current call returns is iterated over right away (``for
    p in x.unbind(1):``, a comprehension): the next instruction is ``GET_ITER``. The
    pieces of ``torch.stack(x.unbind(1))`` are given whole to a function instead."""
    if frame is None:
        return False
    key = (frame.f_code, frame.f_lasti)
    found = _ITERATED.get(key)
    if found is None:
        following = (i for i in dis.get_instructions(frame.f_code) if i.offset > frame.f_lasti)
        found = next((i.opname == "GET_ITER" for i in following), False)
        _ITERATED[key] = found
    return found


# Python values of the loop's frame, compared between steps


def listed_nodes(frame: FrameType | None) -> set[Node]:
    """The nodes of the proxies the lists, tuples and dicts of the frame's locals hold
    (one level deep)."""
    from torch.fx.proxy import Proxy

    found: set[Node] = set()
    for value in frame.f_locals.values() if frame is not None else ():
        items = value.values() if isinstance(value, dict) else value
        if isinstance(value, (list, tuple, dict)):
            found.update(v.node for v in items if isinstance(v, Proxy))
    return found


def frame_tokens(frame: FrameType | None) -> dict[str, Any]:
    """What of the frame's locals must not change from one step to the next: Python
    values (numbers, strings...) and the identity of other objects. A proxy may change
    to one the step computes (:func:`changed_locals`), and the proxies a list holds
    may change (a list of one value per step grows)."""
    if frame is None:
        return {}
    return {name: _token(value, 0) for name, value in frame.f_locals.items()}


class ProxyToken:
    """A proxy in a frame's tokens: equal to another for the same node."""

    __slots__ = ("node",)

    def __init__(self, node: Any):
        self.node = node

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ProxyToken) and other.node is self.node

    def __hash__(self) -> int:
        return id(self.node)


def _token(value: Any, depth: int) -> Any:
    from torch.fx.proxy import Proxy

    if isinstance(value, Proxy):
        return ProxyToken(value.node)
    if isinstance(value, (bool, int, float, complex, str, bytes, type(None))):
        return (type(value), value)
    if depth < 3 and isinstance(value, tuple):
        return (tuple, None, tuple(_token(v, depth + 1) for v in value))
    if depth < 3 and isinstance(value, list):
        kept = tuple(_token(v, depth + 1) for v in value if not isinstance(v, Proxy))
        return (list, id(value), kept)
    if depth < 3 and isinstance(value, dict):
        kept = tuple(
            (repr(k), _token(v, depth + 1)) for k, v in value.items() if not isinstance(v, Proxy)
        )
        return (dict, id(value), kept)
    return ("object", id(value))


def changed_locals(
    before: dict[str, Any], after: dict[str, Any], recorded: set | None = None
) -> list[str]:
    """Names whose Python value changed from one step to the next, a step recording the
    nodes ``recorded``. A proxy may change to a node of the step only: one computed
    before (``a, b = b, a``: values exchanged, nothing recorded) would move between
    names in Python, unseen by the scan, which repeats what the steps record. Without
    ``recorded``, proxies are not compared."""
    return sorted(n for n, t in after.items() if n in before and not _same(before[n], t, recorded))


def _same(before: Any, after: Any, recorded: set | None) -> bool:
    if isinstance(after, ProxyToken):
        return isinstance(before, ProxyToken) and (
            recorded is None or after.node is before.node or after.node in recorded
        )
    if type(before) is tuple and type(after) is tuple and len(before) == len(after):
        return all(_same(b, a, recorded) for b, a in zip(before, after))
    return before == after


def loop_symbol(dims: Any, region: LoopRegion, step: int) -> torch.SymInt:
    """A new symbol for the index of ``step``, in ``[start, stop - 1]``: the hint is the
    example's index, the upper bound is known to the prover only (a relation).

    The steps after the first leave out the first's index (``[start + 1, stop - 1]``,
    ``[start, stop - 2]`` for ``reversed``): true of them at any length, and what lets a
    decision on the first index (``if i == 0:``) be one the other steps need not make,
    so that the first step can be kept apart from a scan of the others."""
    hint = region.index_value(step)
    later = 1 if step > 0 else 0
    low = region.start + (0 if region.reverse else later)
    symbol, symint = dims.new_symbol(f"i{region.number}_{step}", hint, low, None, positive=None)
    stop = region.stop.node.meta["val"].node.expr
    dims.loop_bounds[symbol] = stop - 1 - (later if region.reverse else 0)
    if step == 0:
        region.first_symbol = symbol
    return symint


def linear_in(expr: Any, symbol: sympy.Symbol) -> tuple[int, int] | None:
    """``(c, b)`` when ``expr`` is ``c*symbol + b`` for integers ``c >= 1`` and ``b``
    (a step's index times a chunk's size, plus an offset), else None."""
    if not isinstance(expr, sympy.Expr) or expr.free_symbols != {symbol}:
        return None
    expanded = sympy.expand(expr)
    c, b = expanded.coeff(symbol, 1), expanded.coeff(symbol, 0)
    if not (c.is_Integer and b.is_Integer) or c < 1 or expanded != c * symbol + b:
        return None
    return int(c), int(b)


def loop_symbols_in(dims: Any, expr: sympy.Basic) -> set[sympy.Symbol]:
    """The loop-index symbols an expression holds."""
    if not dims.loop_bounds:
        return set()
    return {s for s in expr.free_symbols if s in dims.loop_bounds}


__all__ = [
    "LoopRegion",
    "ProxyToken",
    "SymbolicPieces",
    "SymbolicRange",
    "changed_locals",
    "frame_tokens",
    "iterated_at_once",
    "linear_in",
    "loop_index",
    "loop_stacked",
    "loop_symbol",
    "loop_symbols_in",
    "symbolic_range",
]
