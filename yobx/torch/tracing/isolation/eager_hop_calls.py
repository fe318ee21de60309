"""Eager higher-order operators already running in other threads when a trace starts.

An eager ``torch.cond`` (``while_loop``, ``scan``, ``map``, ``strict_mode``,
``invoke_subgraph``) compiles itself with dynamo through ``_hop_compile_and_call``:

* it saves torch.fx's tracing flag (a global), clears it, and restores the saved value
  when it returns (``_set_compilation_env``);
* ``torch.compile(fn)`` reads ``torch.fx._symbolic_trace.is_fx_symbolic_tracing`` when
  it builds its wrapper and calls it a moment later: true, dynamo refuses to run
  ("Detected that you are using FX to symbolically trace a dynamo-optimized
  function").

A call that starts while a trace's window is open waits for the window
(:mod:`.fx_isolation` gates its entries). A call already running when the window opens
does not pass through those entries again: it read the original ``is_fx_symbolic_tracing``
and may restore a flag saved before the trace after the trace set its own. Before the
trace makes its torch.fx state per-thread, :func:`wait_for_calls_in_flight` waits for
those calls to return, and :func:`held_unless_in_flight` lets their nested entries
through the window's gates meanwhile (they started first).

A call that is blocked on dynamo's compile lock (it compiles, and the window holds the
lock) cannot return before the window closes: it is not waited for.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
import types
from collections.abc import Iterator
from types import FrameType
from typing import Any

#: thread id -> the frame of its eager higher-order call that the open window waits for
#: (read by the window's gates)
_IN_FLIGHT: dict[int, FrameType] = {}
#: how often a thread waiting at a gate looks whether its call is counted in flight
_POLL_SECONDS = 0.002


def _code_of(function: Any) -> types.CodeType | None:
    code = getattr(function, "__code__", None)
    return code if isinstance(code, types.CodeType) else None


@functools.cache
def _entry_codes() -> frozenset[types.CodeType]:
    # torch >= 2.8 runs every eager higher-order operator through this function
    from torch._higher_order_ops import utils as hop_utils

    code = _code_of(getattr(hop_utils, "_hop_compile_and_call", None))
    return frozenset([code] if code is not None else [])


@functools.cache
def _compile_lock_codes() -> frozenset[types.CodeType]:
    """The code of dynamo's frame callbacks that take the compile lock."""
    # imported when a trace runs (dynamo takes half a second to import)
    from torch._dynamo import convert_frame

    codes = []
    for value in vars(convert_frame).values():
        call = vars(value).get("__call__") if isinstance(value, type) else None
        code = _code_of(call)
        if code is not None and "compile_lock" in code.co_names:
            codes.append(code)
    return frozenset(codes)


def _stack(frame: FrameType | None) -> list[FrameType]:
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def _calls_in_flight() -> dict[int, FrameType]:
    """Thread id -> the outermost frame of its running eager higher-order call, for
    every other thread that has one."""
    me, codes = threading.get_ident(), _entry_codes()
    calls = {}
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        entries = [f for f in _stack(frame) if f.f_code in codes]
        if entries:
            calls[ident] = entries[-1]
    return calls


def _still_running(ident: int, entry: FrameType, frames: dict[int, FrameType]) -> bool:
    stack = _stack(frames.get(ident))
    if not any(f is entry for f in stack):
        return False
    # blocked on (or about to take) the compile lock the window holds: it cannot return
    codes = _compile_lock_codes()
    return not any(f.f_code in codes for f in stack)


def _in_flight() -> bool:
    """True inside the eager higher-order call of this thread that the window waits for
    (a later call of the same thread waits for the window like any other)."""
    entry = _IN_FLIGHT.get(threading.get_ident())
    return entry is not None and any(f is entry for f in _stack(sys._getframe(1)))


@contextlib.contextmanager
def held_unless_in_flight(lock: Any) -> Iterator[None]:
    """Holds ``lock`` (the window's) for the block, unless this thread's eager
    higher-order call is one the open window waits for, or becomes one while this thread
    waits for the lock: then the block runs without it."""
    # a timeout, not one blocking acquire: the window may count this thread's call in
    # flight after this thread began to wait (it looks once its gates are installed)
    while not lock.acquire(timeout=_POLL_SECONDS):
        if _in_flight():
            yield
            return
    try:
        yield
    finally:
        lock.release()


def wait_for_calls_in_flight(timeout: float) -> None:
    """Waits (at most ``timeout`` seconds) until the eager higher-order calls running in
    other threads now have returned; their nested gated entries run meanwhile."""
    calls = _calls_in_flight()
    if not calls:
        return
    _IN_FLIGHT.update(calls)
    deadline = time.monotonic() + timeout
    try:
        while calls and time.monotonic() < deadline:
            frames = sys._current_frames()
            calls = {i: f for i, f in calls.items() if _still_running(i, f, frames)}
            del frames
            if calls:
                time.sleep(0.001)
    finally:
        _IN_FLIGHT.clear()
        calls.clear()


__all__ = ["held_unless_in_flight", "wait_for_calls_in_flight"]
