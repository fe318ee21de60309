"""Ctrl-C during a trace: raised at the next recorded operation, not inside torch.

A ``KeyboardInterrupt`` lands between any two bytecodes. Inside some of torch's own
code it cannot be undone: raised at the start of ``TorchDispatchMode.__exit__`` while
the fake mode dispatches an operation, it makes a C++ guard of torch throw from its
destructor, and the process aborts (``terminate called after throwing an instance of
'c10::Error'``, torch 2.13). While a trace runs in the main thread with Python's
default SIGINT handler, :func:`deferred_interrupts` installs one that only notes the
first Ctrl-C; the tracer raises it at the next operation it records
(:func:`raise_pending_interrupt`), from its own code, or once the trace is over and
everything is restored. A second Ctrl-C raises at once, as before (a forward that
runs for long without recording anything stays interruptible). A handler of the
user's own, and traces in other threads, are left as they are.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

#: ``[True]`` once a Ctrl-C arrived during the trace and was not raised yet (read by the
#: tracer at each operation: a list, so that the check is one index)
PENDING = [False]


def _note_interrupt(signum: int, frame: Any) -> None:
    if PENDING[0]:
        # the second Ctrl-C: the user insists
        PENDING[0] = False
        raise KeyboardInterrupt
    PENDING[0] = True


def raise_pending_interrupt() -> None:
    """Raises the Ctrl-C noted during the trace, if there is one (a safe point)."""
    if PENDING[0]:
        PENDING[0] = False
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Inside the block, a Ctrl-C is noted and raised at :func:`raise_pending_interrupt`
    or on exit, after the block's own cleanup.

    Only in the main thread, and only over Python's default handler; nested blocks
    belong to the outermost.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    PENDING[0] = False
    signal.signal(signal.SIGINT, _note_interrupt)
    try:
        yield
    finally:
        _restore_default_handler()
        # a Ctrl-C noted meanwhile stops the caller now, also when the block raised
        # (the error is then the interrupt's context)
        raise_pending_interrupt()


def _restore_default_handler() -> None:
    """Puts Python's handler back, again if a second Ctrl-C interrupts the restoration
    (that interrupt is raised once the handler is back)."""
    interrupt = None
    while signal.getsignal(signal.SIGINT) is _note_interrupt:
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        except KeyboardInterrupt as e:
            interrupt = e
    if interrupt is not None:
        PENDING[0] = False
        raise interrupt
