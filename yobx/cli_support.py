"""What the ``yobx`` commands share: errors, exit statuses, dynamic shapes, sizes.

One table of exit statuses for every command (:data:`EXIT_STATUS_HELP`): 0 success,
1 the result disagrees with eager PyTorch, 2 bad input, 3 the model could not be
traced, exported or run, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

#: Exit status: the command did what it was asked, the results agree.
EXIT_OK = 0
#: Exit status: the result disagrees with eager PyTorch (``yobx export --validate``
#: found an error beyond tolerance, ``yobx inspect`` found a divergence).
EXIT_MISMATCH = 1
#: Exit status: bad input (command line, unknown model, missing file, unwritable output).
EXIT_BAD_INPUT = 2
#: Exit status: the model could not be traced, exported or run.
EXIT_FAILURE = 3
#: Exit status: interrupted (Ctrl-C).
EXIT_INTERRUPTED = 130

#: The exit statuses, as ``yobx --help`` and the documentation show them.
EXIT_STATUS_HELP = f"""\
exit status (every command):
  {EXIT_OK:<4} success; with --validate or for inspect, the results agree with eager
  {EXIT_MISMATCH:<4} the result disagrees with eager PyTorch (export validation failed,
       inspect found a divergence)
  {EXIT_BAD_INPUT:<4} bad input: command line, unknown model, missing file, unwritable output
  {EXIT_FAILURE:<4} the model could not be traced, exported or run
  {EXIT_INTERRUPTED:<4} interrupted
"""


class CommandError(Exception):
    """An error reported on stderr (``yobx: error: ...``, every line of its message),
    with an exit status."""

    def __init__(self, message: str, status: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.status = status


def error_message(exc: BaseException, prefix: str = "") -> str:
    """What the command prints of an error: yobx's own errors in full (their last lines
    say what to do), other errors by their first line (``-v`` shows the rest and the
    traceback)."""
    text = str(exc).strip()
    module = type(exc).__module__ or ""
    if module == "yobx" or module.startswith("yobx."):
        return f"{prefix}{text}" if text else f"{prefix}{type(exc).__name__}"
    lines = text.splitlines()
    message = f"{prefix}{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    if len(lines) > 1:
        message += " [...] (-v shows the whole error)"
    return message


def add_inspect_arguments(inspect: argparse.ArgumentParser) -> None:
    """Declares the options of ``yobx inspect``."""
    inspect.add_argument("--onnx", default=None, help="ONNX model to compare with")
    inspect.add_argument("--profile", default=None, help="write a Chrome trace there")
    inspect.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")


def check_writable(path: str) -> None:
    """Raises a :class:`CommandError` when ``path`` cannot be written."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise CommandError(f"cannot write {path!r}: directory {directory!r} does not exist")
    if os.path.isdir(path):
        raise CommandError(f"cannot write {path!r}: it is a directory")
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise CommandError(f"cannot write {path!r}: permission denied")


def format_size(n_bytes: float) -> str:
    """``1.5 MB``: a size in bytes, readable."""
    for unit in ("B", "KB", "MB", "GB"):
        if n_bytes < 1024 or unit == "GB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
    return f"{n_bytes} B"


def resolve_dynamic_shapes(
    options: argparse.Namespace, model: Any, args: tuple, kwargs: dict, declared: Any
) -> Any:
    """The dynamic shapes to export with: none with ``--static``, else those the model
    declares, else those its input roles give (or an error saying how to declare them).
    """
    if getattr(options, "static", False):
        return None
    if declared is not None:
        return declared
    from yobx.models.roles import UndeclaredDynamicShapesError, derive_dynamic_shapes

    try:
        return derive_dynamic_shapes(model, args, kwargs, repr(options.model))
    except UndeclaredDynamicShapesError as exc:
        raise CommandError(str(exc)) from exc


__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_MISMATCH",
    "EXIT_OK",
    "EXIT_STATUS_HELP",
    "CommandError",
    "add_inspect_arguments",
    "check_writable",
    "error_message",
    "format_size",
    "resolve_dynamic_shapes",
]
