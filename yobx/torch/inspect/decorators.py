"""Decorators adding a user's own functions and model methods to a recorded run.

Outside :func:`~yobx.torch.inspect.record_run` the wrapper only reads one module attribute
and calls the function: nothing is summarised, timed or stored.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from . import recording
from .results import TraceCall

F = TypeVar("F", bound=Callable[..., Any])


def _record_call(
    recorder: recording.Recorder,
    func: Callable,
    name: str,
    stage_name: str | None,
    args: tuple,
    kwargs: dict,
    kind: str,
    skip_first: bool,
) -> Any:
    stage = recorder.stage(stage_name) if stage_name else recorder.current_stage
    if stage is None:
        # Called by the recording thread between stages: nothing to attach it to.
        return func(*args, **kwargs)
    named = recording._signature_names(func, args, kwargs) or recording._positional(args, kwargs)
    if skip_first and named:
        named.pop(next(iter(named)))
    params = {k: recorder.summarize(v) for k, v in named.items()}
    start = time.perf_counter_ns()
    output = func(*args, **kwargs)
    end = time.perf_counter_ns()
    recorder.add(
        stage,
        TraceCall(
            name,
            getattr(func, "__qualname__", name),
            params,
            recorder.summarize(output),
            end - start,
            kind,
            run=recorder.current_run,
            start_ns=start,
        ),
    )
    return output


def trace_func(
    func: F | None = None, *, stage_name: str | None = None, name: str | None = None
) -> F | Callable[[F], F]:
    """Record the calls of a function while :func:`record_run` runs.

    .. code-block:: python

        @trace_func(stage_name="preprocess")
        def normalize(x):
            return (x - x.mean()) / x.std()

    :param func: the function (when used as ``@trace_func`` without parentheses)
    :param stage_name: stage receiving the calls (created if needed); None means the stage
        being recorded when the function is called (``eager`` when the model calls it)
    :param name: display name of the calls, default the function's qualified name
    :return: the wrapped function; it behaves exactly as the original outside recording
    """

    def decorate(f: F) -> F:
        display = name or f.__qualname__

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            recorder = recording.active_recorder()
            if recorder is None:
                return f(*args, **kwargs)
            return _record_call(recorder, f, display, stage_name, args, kwargs, "function", False)

        wrapper.__yobx_traced__ = True
        return wrapper  # type: ignore[return-value]

    return decorate(func) if func is not None else decorate


def trace_model_func(
    func: F | None = None, *, stage_name: str | None = None, name: str | None = None
) -> F | Callable[[F], F]:
    """Record the calls of a method of a model (``self`` is not captured).

    The call is named after the module's path in the recorded model plus the method
    name (``layers.0.attn.rotate``), or the class name when the module is not part of it.

    :param func: the method (when used without parentheses)
    :param stage_name: stage receiving the calls, None for the stage being recorded
    :param name: method part of the display name, default the function's name
    :return: the wrapped method
    """

    def decorate(f: F) -> F:
        method_name = name or f.__name__

        @functools.wraps(f)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            recorder = recording.active_recorder()
            if recorder is None:
                return f(self, *args, **kwargs)
            owner = (
                recorder.module_names.get(id(self)) if isinstance(self, torch.nn.Module) else None
            )
            prefix = owner if owner else type(self).__name__
            display = f"{prefix}.{method_name}"
            return _record_call(
                recorder, f, display, stage_name, (self, *args), kwargs, "method", True
            )

        wrapper.__yobx_traced__ = True
        return wrapper  # type: ignore[return-value]

    return decorate(func) if func is not None else decorate
