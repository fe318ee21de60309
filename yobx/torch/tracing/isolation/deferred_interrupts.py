"""Ctrl-C during a trace: raised at the next recorded operation, not inside torch.

A ``KeyboardInterrupt`` lands between any two bytecodes. Inside some of torch's own
code it cannot be undone: raised at the start of a dispatch mode's ``__exit__`` while
the fake mode dispatches an operation, it makes a C++ guard of torch throw from its
destructor, and the process aborts (``terminate called after throwing an instance of
'c10::Error'``, torch 2.13). While a trace runs in the main thread with Python's
default SIGINT handler, :class:`deferred_interrupts` installs one that only notes the
first Ctrl-C; the tracer raises it at the next operation it records in that thread
(:func:`raise_pending_interrupt`), from its own code, or when the block ends. A second
Ctrl-C raises at once, as before (a forward that runs for long without recording
anything stays interruptible). A handler of the user's own, and traces in other
threads, are left as they are.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Literal

from .patch_window import register_undo

#: ``[True]`` once a Ctrl-C arrived during the trace and was not raised yet (read by the
#: tracer at each operation: a list, so that the check is one index)
PENDING = [False]
#: the thread whose trace the noted Ctrl-C stops (the main thread's ident)
_OWNER: list[int | None] = [None]
#: ``[True]`` while a block has its handler installed (a handler found installed
#: otherwise was left by a block an interrupt cut short: it is replaced)
_ACTIVE = [False]


def _note_interrupt(signum: int, frame: Any) -> None:
    if PENDING[0]:
        # the second Ctrl-C: the user insists
        PENDING[0] = False
        raise KeyboardInterrupt
    PENDING[0] = True


def raise_pending_interrupt() -> None:
    """Raises the Ctrl-C noted during the trace, if there is one and this thread is the
    one tracing (a safe point)."""
    if PENDING[0] and threading.get_ident() == _OWNER[0]:
        PENDING[0] = False
        raise KeyboardInterrupt


class deferred_interrupts:
    """Inside the block, a Ctrl-C is noted and raised at :func:`raise_pending_interrupt`
    or on exit, after the block's own cleanup; nested blocks belong to the outermost.

    Python's handler is put back by an undo registered on the trace's patch window: an
    interrupt skipping this block's exit (or landing in it) leaves it to the window,
    which completes its undo journal whatever happens.
    """

    def __enter__(self) -> deferred_interrupts:
        self._undo = None
        if threading.current_thread() is not threading.main_thread():
            return self
        current = signal.getsignal(signal.SIGINT)
        if current is _note_interrupt and _ACTIVE[0]:
            # an enclosing block (a nested trace)
            return self
        if current is not signal.default_int_handler and current is not _note_interrupt:
            # the user's own handler
            return self
        PENDING[0] = False
        _OWNER[0] = threading.get_ident()
        # registered before the change: an interrupt in between is undone too
        self._undo = register_undo(_restore_default_handler)
        _ACTIVE[0] = True
        signal.signal(signal.SIGINT, _note_interrupt)
        return self

    def __exit__(self, *error: Any) -> Literal[False]:
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()
            # a Ctrl-C noted meanwhile stops the caller now, also when the block raised
            # (the error is then the interrupt's context)
            raise_pending_interrupt()
        return False


def _restore_default_handler() -> None:
    """Puts Python's handler back (idempotent: the window may run it again)."""
    if _ACTIVE[0] or signal.getsignal(signal.SIGINT) is _note_interrupt:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _ACTIVE[0] = False
