"""torch.fx's process-wide tracing state, kept to the tracing thread.

``torch.fx.Tracer.trace`` keeps its state in module globals of
``torch.fx._symbolic_trace``, shared by every thread: the patcher (``CURRENT_PATCHER``,
which dynamo reverts and reapplies around every frame it compiles, in any thread), the
patches of ``nn.Module.__call__``/``__getattr__`` (class attributes) and the flag
``_is_fx_tracing_flag``. Another thread tracing with torch.fx at the same time, and
torch does when ``torch.cond`` runs eagerly (dynamo compiles it and ``make_fx`` traces
the branches), would see or undo the trace's patches. While :func:`fx_tracing_per_thread`
is active:

* the trace's patcher lives in a thread-local slot (:func:`current_fx_patcher`), so that
  dynamo in another thread never reverts it;
* in another thread, a torch.fx trace, a make_fx run and a higher-order operator
  (eager ``torch.cond`` builds its subgraphs with make_fx) wait for the window to close:
  they use process-wide state (``nn.Module`` patches, make_fx's current tracer); one
  already running when the window opens is waited for first;
* that patcher gates every patch it makes (``nn.Module.__call__``/``__getattr__``, the
  globals of the traced code): other threads get the originals;
* ``is_fx_tracing()``/``is_fx_symbolic_tracing()`` answer for the calling thread, and
  the global flag holds a thread-aware value, so that an eager ``torch.cond`` in another
  thread (dynamo refuses to compile under a torch.fx trace) keeps working;
* an eager ``torch.cond`` already running in another thread when the window opens
  (it saves and restores the global flag itself) is waited for
  (:mod:`.eager_hop_calls`).

What remains shared: ``torch.fx.Tracer.trace`` sets the global flag to True itself,
and only its ``_new_patcher``, a few lines later, makes it thread-aware again; code of
another thread reading the global variable directly at that instant sees True.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import inspect
import math
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import torch
from torch._higher_order_ops import utils as hop_utils
from torch.fx import _symbolic_trace
from torch.fx.experimental import proxy_tensor

from .eager_hop_calls import held_unless_in_flight, wait_for_calls_in_flight
from .module_classes import class_level_targets
from .patch_window import _WINDOW_LOCK, any_thread, patch_window, thread_gate
from .patching import memoized_replacements, patched_attributes
from .world_state import (
    THREAD_STATE,
    PatchedClasses,
    PatchedDictItems,
    current_fx_patcher,
    revert_fx_patches,
)

#: seconds to wait for another thread's torch.fx trace before tracing anyway
FOREIGN_TRACE_TIMEOUT = 60.0


class _FxTracingFlag:
    """``torch.fx._symbolic_trace._is_fx_tracing_flag`` while a window is open: true in
    a thread running ``torch.fx.Tracer.trace`` under the window (``is_fx_tracing()``
    answers False in the others)."""

    def __bool__(self) -> bool:
        return THREAD_STATE.fx_patcher is not None

    def __repr__(self) -> str:
        return f"FxTracingFlag({bool(self)})"


FX_TRACING_FLAG = _FxTracingFlag()


def _thread_aware_flag() -> None:
    # torch.fx.Tracer.trace sets the global flag to True; until this runs (in its
    # `_new_patcher`), other threads may see it: eager torch.cond would refuse to compile
    # and may save and restore True after the trace is over
    if _symbolic_trace._is_fx_tracing_flag is True:
        # torch types the flag a bool; an object with __bool__ is what it reads
        _symbolic_trace._is_fx_tracing_flag = FX_TRACING_FLAG  # type: ignore[assignment]


class _ThreadPatcher(_symbolic_trace._Patcher):
    """torch.fx's patcher whose patches answer for the tracing thread only.

    torch.fx patches ``nn.Module.__call__``/``__getattr__`` and the globals of the
    traced code (``torch.fx.wrap``-ed functions, autowrapped ``math`` functions): every
    replacement is a :func:`~.patch_window.thread_gate`, so that another thread running
    a module, or the same model's code, gets the original.
    """

    def patch(self, frame_dict, name, new_fn, deduplicate=True) -> None:
        original = frame_dict.get(name, getattr(builtins, name, None))
        if getattr(new_fn, "__yobx_any_thread__", False):
            # right in every thread (the traced code's `int`): a function gate would
            # not answer isinstance(v, int)
            super().patch(frame_dict, name, new_fn, deduplicate)
            return
        if original is None or getattr(original, "__fx_already_patched", False):
            super().patch(frame_dict, name, new_fn, deduplicate)
            return
        super().patch(frame_dict, name, _function_gate(original, new_fn, deduplicate), deduplicate)

    def patch_functions(self, frame_dict: dict[str, Any], function_ids: set[int]) -> None:
        """torch.fx's ``_autowrap_check`` of a dict holding many of the functions to
        wrap (``math.__dict__``): the same patches, made as one ``dict.update``."""
        originals, gates = {}, {}
        for name, value in frame_dict.items():
            if name.startswith("_") or id(value) not in function_ids or not callable(value):
                continue
            if getattr(value, "__fx_already_patched", False):
                # wrapped by an enclosing trace already (torch.fx skips it too)
                continue
            originals[name] = value
            gates[name] = _function_gate(value, _cached_wrapped_func(value), True)
        if gates:
            # torch's patch fields reused: no name, the dicts of originals and gates
            patch = PatchedDictItems(frame_dict, None, originals, gates)  # type: ignore[arg-type]
            self.patches_made.append(patch)
            patch.patch()

    def patch_method(self, cls, name, new_fn, deduplicate=True) -> None:
        if cls is torch.nn.Module:
            # on the traced modules' classes (see module_classes): no slot updates of
            # nn.Module's hundreds of subclasses
            self._patch_classes(class_level_targets(name), name, new_fn, deduplicate)
            return
        original = getattr(cls, name)
        if getattr(original, "__fx_already_patched", False):
            return
        super().patch_method(cls, name, _gate(original, new_fn, deduplicate), deduplicate)

    def _patch_classes(self, classes, name, new_fn, deduplicate) -> None:
        values: list[tuple[type, Any]] = []
        gates: dict[int, Any] = {}
        for cls in classes:
            original = getattr(cls, name)
            if getattr(original, "__fx_already_patched", False):
                continue
            # one gate per original: all of them but under a nested trace
            gate = gates.get(id(original))
            if gate is None:
                gate = gates[id(original)] = _gate(original, new_fn, deduplicate)
            values.append((cls, gate))
        if values:
            patch = PatchedClasses.of(name, values)
            self.patches_made.append(patch)
            patch.patch()


def _create_wrapped_func(original: Any) -> Any:
    """torch.fx's ``_create_wrapped_func``, except that the tracer may answer with a
    number: ``math.exp`` of a dimension has no symbolic form, its value is the
    example's (a decision on the dimension), and torch.fx's wrapper then failed
    marking the number as a node (``'float' object has no attribute 'node'``)."""

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        proxy = _symbolic_trace._find_proxy(args, kwargs)
        if proxy is None:
            return original(*args, **kwargs)
        result = proxy.tracer.create_proxy("call_function", original, args, kwargs)
        if isinstance(result, torch.fx.Proxy):
            result.node.meta["is_wrapped"] = True
        return result

    return wrapped


#: the code of the autowrap replacements (:func:`_create_wrapped_func`'s closure)
_AUTOWRAP_CODE = _create_wrapped_func(len).__code__

#: id(original) -> (original, gate) of torch.fx's autowrap replacement of ``original``
_AUTOWRAP_GATES: dict[int, tuple[Any, Any]] = {}


_FX_AUTOWRAP_CHECK = _symbolic_trace._autowrap_check


def _autowrap_check(patcher: Any, frame_dict: dict[str, Any], function_ids: set[int]) -> None:
    """torch.fx's, with the 55 functions of ``math`` patched as one (see
    :meth:`_ThreadPatcher.patch_functions`): every trace autowraps them."""
    if frame_dict is _MATH_DICT and isinstance(patcher, _ThreadPatcher):
        if patcher.visit_once(frame_dict):
            patcher.patch_functions(frame_dict, function_ids)
        return
    _FX_AUTOWRAP_CHECK(patcher, frame_dict, function_ids)


_MATH_DICT = math.__dict__

#: id(original) -> (original, torch.fx's autowrap wrapper of it)
_WRAPPED_FUNCS: dict[int, tuple[Any, Any]] = {}


def _cached_wrapped_func(original: Any) -> Any:
    """torch.fx's ``_create_wrapped_func``, built once per function: the wrapper closes
    over ``original`` only and finds its tracer from the proxies it is called with."""
    cached = _WRAPPED_FUNCS.get(id(original))
    if cached is not None and cached[0] is original:
        return cached[1]
    wrapper = _create_wrapped_func(original)
    if len(_WRAPPED_FUNCS) >= 1024:
        # `torch.fx.wrap`-ed functions of modules since unloaded
        _WRAPPED_FUNCS.clear()
    _WRAPPED_FUNCS[id(original)] = (original, wrapper)
    return wrapper


def _is_autowrap_of(replacement: Any, original: Any) -> bool:
    # torch.fx's wrapper of ``original``: it closes over ``original`` only and finds the
    # tracer from the proxies it is called with, so one trace's is any trace's
    code = getattr(replacement, "__code__", None)
    closure = getattr(replacement, "__closure__", None)
    return (
        code is _AUTOWRAP_CODE
        and closure is not None
        and len(closure) == 1
        and closure[0].cell_contents is original
    )


def _function_gate(original: Any, replacement: Any, deduplicate: bool) -> Any:
    """The gate of a function patched in the traced code's globals.

    Each trace autowraps every function of ``math`` (55 patches) with a new wrapper of
    the same behaviour: their gates are built once per process (a millisecond of a
    small model's trace). Any other replacement gets its own gate.
    """
    if not (deduplicate and _is_autowrap_of(replacement, original)):
        return _gate(original, replacement, deduplicate)
    cached = _AUTOWRAP_GATES.get(id(original))
    if cached is not None and cached[0] is original:
        return cached[1]
    gate = _gate(original, replacement, deduplicate)
    _AUTOWRAP_GATES[id(original)] = (original, gate)
    return gate


def _gate(original: Any, replacement: Any, deduplicate: bool) -> Any:
    gate = thread_gate(original, replacement)
    # functools.wraps copied the original's attributes: the flag is the patch's own
    # (an attribute of the function object, which torch.fx reads)
    gate.__fx_already_patched = deduplicate  # type: ignore[attr-defined]
    return gate


@contextlib.contextmanager
def _thread_patcher() -> Iterator[Any]:
    """``_new_patcher`` for the tracing thread: the patcher is not published globally."""
    prior = THREAD_STATE.fx_patcher
    patcher = _ThreadPatcher()
    THREAD_STATE.fx_patcher = patcher
    _thread_aware_flag()
    try:
        yield patcher
    finally:
        revert_fx_patches(patcher)
        THREAD_STATE.fx_patcher = prior


@contextlib.contextmanager
def _thread_maybe_revert_all_patches() -> Iterator[None]:
    """``_maybe_revert_all_patches`` (dynamo, around a frame it compiles) for the thread's
    own patcher."""
    patcher = THREAD_STATE.fx_patcher
    if patcher is None:
        yield
        return
    revert_fx_patches(patcher)
    try:
        yield
    finally:
        patcher.reapply_all_patches()


def _in_foreign_code_of_this_thread() -> bool:
    """True when this thread itself runs a torch.fx trace or make_fx (the trace is nested
    in it): its state is not another thread's."""
    codes = {
        _symbolic_trace.Tracer.trace.__code__,
        proxy_tensor._MakefxTracer.trace.__code__,
        proxy_tensor._MakefxTracer.trace_subgraph.__code__,
    }
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def _foreign_trace_running() -> bool:
    return (
        _symbolic_trace.CURRENT_PATCHER is not None
        or proxy_tensor._CURRENT_MAKE_FX_TRACER is not None
    ) and not _in_foreign_code_of_this_thread()


def _wait_for_foreign_trace() -> None:
    """Waits while another thread's torch.fx trace or make_fx, started before the window,
    has its process-wide state installed."""
    deadline = time.monotonic() + FOREIGN_TRACE_TIMEOUT
    while _foreign_trace_running() and time.monotonic() < deadline:
        time.sleep(0.001)


def _waiting(original: Callable) -> Callable:
    """``original``, called in another thread than the window's only once the window is
    closed, and holding the window's lock: no window opens while it runs either.

    An eager higher-order call that was already running when the window opened goes
    through: the window waits for it to return (see :mod:`.eager_hop_calls`)."""

    if hasattr(original, "__wrapped__") and inspect.isgeneratorfunction(original.__wrapped__):
        # a context manager: the lock is held for its whole block

        @functools.wraps(original)
        @contextlib.contextmanager
        def wait_then_enter(*args, **kwargs):
            if THREAD_STATE.window is not None:
                with original(*args, **kwargs) as value:
                    yield value
                return
            with held_unless_in_flight(_WINDOW_LOCK), original(*args, **kwargs) as value:
                yield value

        return any_thread(wait_then_enter)

    @functools.wraps(original)
    def wait_then_call(*args, **kwargs):
        if THREAD_STATE.window is not None:
            return original(*args, **kwargs)
        with held_unless_in_flight(_WINDOW_LOCK):
            return original(*args, **kwargs)

    return any_thread(wait_then_call)


#: the entries of code using torch.fx's and make_fx's process-wide state: another
#: thread waits there while a window is open
_EXCLUSIVE_ENTRIES = (
    (torch.fx.Tracer, "trace"),
    (proxy_tensor._MakefxTracer, "trace"),
    (proxy_tensor._MakefxTracer, "trace_subgraph"),
    # eager torch.cond / while_loop / scan build their subgraphs with make_fx, reading
    # make_fx's current tracer (a global) before entering it...
    (torch._ops.HigherOrderOperator, "__call__"),
    # ... and compile them after saving, clearing, then restoring torch.fx's tracing
    # flag (a global): saved during the trace, it would be restored after it
    (hop_utils, "_set_compilation_env"),
)


@contextlib.contextmanager
def fx_tracing_per_thread() -> Iterator[None]:
    """Inside the block, torch.fx traces of this thread keep their state to themselves
    and other threads' torch.fx traces, make_fx runs and higher-order operators wait
    (see the module's documentation)."""
    with patch_window() as window, patched_attributes(_exclusive_entries()):
        # no foreign trace starts now; one already running is waited for (an eager
        # higher-order call first: it may run make_fx), and the process-wide state to
        # restore is read once it is over
        wait_for_calls_in_flight(FOREIGN_TRACE_TIMEOUT)
        _wait_for_foreign_trace()
        window.recapture_process_state()
        with patched_attributes(_per_thread_state()):
            yield


@memoized_replacements
def _exclusive_entries() -> list[tuple[Any, str, Any]]:
    return [(owner, name, _waiting(vars(owner)[name])) for owner, name in _EXCLUSIVE_ENTRIES]


@memoized_replacements
def _per_thread_state() -> list[tuple[Any, str, Any]]:
    return [
        (_symbolic_trace, "_new_patcher", any_thread(_new_patcher)),
        (
            _symbolic_trace,
            "_maybe_revert_all_patches",
            any_thread(
                thread_gate(
                    _symbolic_trace._maybe_revert_all_patches,
                    _thread_maybe_revert_all_patches,
                )
            ),
        ),
        (_symbolic_trace, "is_fx_tracing", _is_fx_tracing),
        (_symbolic_trace, "is_fx_symbolic_tracing", _is_fx_symbolic_tracing),
        # Tracer.trace restores the value it found: this one
        (_symbolic_trace, "_is_fx_tracing_flag", FX_TRACING_FLAG),
        # torch.fx wraps every function of `math` again in each trace (55 copies of the
        # function's attributes); its wrapper is the same for every trace
        (_symbolic_trace, "_create_wrapped_func", _cached_wrapped_func),
        (_symbolic_trace, "_autowrap_check", _autowrap_check),
    ]


_ORIGINAL_NEW_PATCHER = _symbolic_trace._new_patcher


def _new_patcher():
    # torch.fx's, with its patcher kept to the thread in the window's thread
    if THREAD_STATE.window is not None:
        return _thread_patcher()
    return _ORIGINAL_NEW_PATCHER()


@any_thread
def _is_fx_tracing() -> bool:
    """``is_fx_tracing()`` while a window is open: the flag is global, set by the tracing
    thread (and cleared by it while torch.cond compiles there)."""
    if THREAD_STATE.window is not None:
        return bool(_symbolic_trace._is_fx_tracing_flag)
    # a torch.fx trace of another thread, started before the window and not waited for
    return _symbolic_trace.CURRENT_PATCHER is not None and bool(_symbolic_trace._is_fx_tracing_flag)


@any_thread
def _is_fx_symbolic_tracing() -> bool:
    """``is_fx_symbolic_tracing()`` while a window is open (see :func:`_is_fx_tracing`)."""
    return _is_fx_tracing() and not torch.compiler.is_compiling()


__all__ = [
    "FX_TRACING_FLAG",
    "current_fx_patcher",
    "fx_tracing_per_thread",
]
