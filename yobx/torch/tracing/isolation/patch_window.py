"""The patch window: one trace at a time, patches that hold for the tracing thread only,
and a world left as it was, also after an interrupt.

Tracing replaces functions shared by the whole process (``torch.cat``, ``torch.cond``,
``builtins.max``, ``nn.Module.__call__``...). Three rules keep other code unaffected:

* **one window at a time**: a process-wide lock is held from the first patch of a
  trace to the last restoration, so that two traces in two threads never save each
  other's patches as "the original" (which left them installed for good);
* **patches answer for the tracing thread only**: a replacement installed on a module
  or a class is wrapped by :func:`thread_gate`, which calls the original in every
  other thread, so eager code (``torch.cond`` included) runs as usual beside a trace;
* **undo is journaled**: every change registers an idempotent undo on the window
  before it is made; the window unwinds what its ``with`` blocks could not (an
  interrupt in an ``__exit__``), then restores the :class:`~.world_state.WorldState`
  captured when it opened (fake and proxy modes, dispatch keys, torch.fx's patcher).

``torch.fx.experimental._config`` (``backed_size_oblivious``) is a ``ContextVar`` in
torch >= 2.6: setting it inside the window affects the tracing thread only.
torch.fx's own process-wide state (its patcher, its tracing flag) is handled by
:mod:`.fx_isolation`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

from .world_state import THREAD_STATE, WorldState, clear_interrupted_frames, involves_interrupt

#: held by the thread that has a window open (reentrant: windows nest in that thread)
_WINDOW_LOCK = threading.RLock()


_THREAD = THREAD_STATE


def _dynamo_compile_lock() -> Any:
    # imported with yobx already (torch.cond needs dynamo); its lock is process-wide
    from torch._dynamo import convert_frame

    return convert_frame.compile_lock


@contextlib.contextmanager
def one_trace_at_a_time() -> Iterator[None]:
    """Holds the window's lock (reentrant) for a whole trace, windows opened and
    closed inside included.

    Between its windows a trace still computes on fake tensors (the versions' join
    clones values). Every fake operation enters torch's ``FakeTensorMode``, whose
    ``__enter__``/``__exit__`` save and restore process-wide flags
    (``torch.utils._python_dispatch._is_in_torch_dispatch_mode``): two threads
    interleaving them leave the flag set for good. Two traces run one after the other.
    """
    with _WINDOW_LOCK:
        yield


def in_patch_window() -> bool:
    """True in the thread that has a patch window open (the tracing thread)."""
    return _THREAD.window is not None


def current_window() -> PatchWindow | None:
    """The window open in this thread, None outside one."""
    return _THREAD.window


class PatchWindow:
    """The span of a trace: the lock, the undo journal and the state to restore.

    Use :func:`patch_window` (a context manager) or, where an interrupt must not be
    able to skip the restoration, :meth:`open` and :meth:`close` with a retry loop
    around ``close`` written in the caller's ``finally`` (see ``CustomTracer.trace``).
    """

    def __init__(self) -> None:
        self.undos: list[Callable[[], None]] = []
        self.world: WorldState | None = None
        self.locked = False
        self.compile_lock: Any = None

    def open(self) -> None:
        """Takes the lock (waits for another thread's trace) and captures the world.

        Dynamo's compile lock is held too: a compilation in another thread (an eager
        ``torch.cond`` compiles its branches) reads ``nn.Module``'s attributes and
        torch's functions while it builds guards; it must see them all patched or none.
        """
        compile_lock = _dynamo_compile_lock()
        _WINDOW_LOCK.acquire()
        self.locked = True
        compile_lock.acquire()
        self.compile_lock = compile_lock
        self.world = WorldState.capture()
        _THREAD.window = self

    def recapture_process_state(self) -> None:
        """Reads again the process-wide part of the state to restore (torch.fx's and
        make_fx's globals), once another thread's torch.fx trace running when the
        window opened is over: restoring what it had would install it again."""
        if self.world is not None:
            self.world = self.world.with_process_state()

    def push(self, undo: Callable[[], None]) -> int:
        """Registers an idempotent undo (before making the change); returns its index."""
        self.undos.append(undo)
        return len(self.undos) - 1

    def unwind(self, index: int) -> None:
        """Runs and forgets the undos registered at ``index`` and after, latest first.

        Interrupted, it can run again: the undo it was running runs once more.
        """
        undos = self.undos
        while len(undos) > index:
            undos[-1]()
            undos.pop()

    def close(self, error: BaseException | None = None) -> None:
        """Undoes everything, restores the world, releases the lock (idempotent).

        :param error: the exception ending the trace, if any; after an interrupt, the
            context managers it left suspended are finalized first
        """
        if not self.locked:
            return
        world = self.world
        if error is not None and (
            self.undos or involves_interrupt(error) or (world is not None and not world.intact())
        ):
            clear_interrupted_frames(error)
        self.unwind(0)
        if world is not None:
            world.restore()
        self.release()

    def release(self) -> None:
        """Leaves the window: this thread stops tracing, the lock is released."""
        if _THREAD.window is self:
            _THREAD.window = None
        # each flag is cleared first: released twice, a lock would raise
        compile_lock, self.compile_lock = self.compile_lock, None
        if compile_lock is not None:
            compile_lock.release()
        if self.locked:
            self.locked = False
            _WINDOW_LOCK.release()


@contextlib.contextmanager
def patch_window() -> Iterator[PatchWindow]:
    """The window of this thread, opened (and closed on exit) if there is none.

    Nested in a window (a trace), it adds nothing. Opened here, an interrupt landing in
    this generator's own exit can still leave the window open until the generator is
    collected; ``CustomTracer.trace`` closes its window with :func:`close_window` in
    its own frame, which an interrupt cannot skip.
    """
    window = _THREAD.window
    if window is not None:
        yield window
        return
    window = PatchWindow()
    error: BaseException | None = None
    try:
        window.open()
        yield window
    except BaseException as e:
        error = e
        raise
    finally:
        close_window(window, error)


#: attempts at closing a window before giving up (each interrupt costs one)
CLOSE_ATTEMPTS = 16


def close_window(window: PatchWindow, error: BaseException | None = None) -> None:
    """``window.close(error)``, again until it completes.

    An interrupt (or an exception torch made of one) landing in the restoration is
    retried, then raised once everything is restored. Should the restoration keep
    failing, the lock is released anyway so that other threads are not blocked forever.
    """
    failure = None
    for _ in range(CLOSE_ATTEMPTS):
        try:
            window.close(error)
            break
        except BaseException as e:
            failure = e
    else:
        window.release()
    if failure is not None:
        raise failure


def finish_window(window: PatchWindow, error: BaseException | None = None) -> None:
    """:func:`close_window` until the window is closed, for the ``finally`` of the frame
    that opened it: an interrupt landing in the restoration is raised once the
    restoration is complete."""
    interrupt = None
    while window.locked:
        try:
            close_window(window, error)
        except BaseException as e:
            interrupt = e
    if interrupt is not None:
        raise interrupt


def register_undo(undo: Callable[[], None]) -> Callable[[], None]:
    """Registers ``undo`` on the current window; returns the function that runs it.

    The returned function unwinds the window down to ``undo`` (included); outside a
    window, it just calls ``undo``.
    """
    window = _THREAD.window
    if window is None:
        return undo
    index = window.push(undo)
    return functools.partial(window.unwind, index)


# thread gates


def thread_gate(original: Any, replacement: Callable) -> Callable:
    """A function calling ``replacement`` in the thread of the open window and
    ``original`` in every other thread (and after the window is closed)."""

    @functools.wraps(original)
    def gate(*args, **kwargs):
        if _THREAD.window is not None:
            return replacement(*args, **kwargs)
        return original(*args, **kwargs)

    # an attribute of the function object: what the gate stands between
    gate.__yobx_gate__ = (original, replacement)  # type: ignore[attr-defined]
    return gate


def any_thread(function: Callable) -> Callable:
    """Marks a replacement that is right in every thread (it calls the original for
    anything but the tracer's proxies): it is installed without a gate."""
    # an attribute of the function object, read by the patchers
    function.__yobx_any_thread__ = True  # type: ignore[attr-defined]
    return function


def gated_value(owner: Any, name: str, value: Any) -> Any:
    """What :func:`~.patching.patched_attributes` installs for ``owner.name = value``.

    Functions replacing a module's or a class's attribute are gated; values set on a
    trace's own objects (a fake mode), non-callables and :func:`any_thread`
    replacements are installed as they are.
    """
    if (
        not isinstance(owner, (type, types.ModuleType))
        or not callable(value)
        or getattr(value, "__yobx_any_thread__", False)
        or isinstance(vars(owner).get(name), (staticmethod, classmethod))
    ):
        return value
    original = getattr(owner, name, None)
    if original is None:
        return value
    # The same replacement of the same original (the next trace) reuses its gate:
    # building one copies the original's attributes, a cost paid per patch and per trace.
    # The key holds the replacement: two patches of one attribute stacked in a trace
    # (an indexing patch under a kernel patch) keep a gate each, instead of evicting
    # each other's and rebuilding both every trace.
    key = (id(owner), name, id(value))
    cached = _GATES.get(key)
    if cached is not None and cached[0] is owner and cached[1] is original and cached[2] is value:
        return cached[3]
    if len(_GATES) >= _MAX_GATES:
        # replacements rebuilt after someone else's patch leave stale entries behind
        _GATES.clear()
    gate = thread_gate(original, value)
    _GATES[key] = (owner, original, value, gate)
    return gate


#: (id(owner), name, id(replacement)) -> (owner, original, replacement, gate)
_GATES: dict[tuple[int, str, int], tuple[Any, Any, Any, Callable]] = {}
#: more gates than the patches of a few traces' worth of rebuilt replacement lists
_MAX_GATES = 1024


__all__ = [
    "PatchWindow",
    "any_thread",
    "close_window",
    "current_window",
    "gated_value",
    "in_patch_window",
    "patch_window",
    "register_undo",
    "thread_gate",
]
