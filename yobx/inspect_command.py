"""``yobx inspect MODEL [--onnx model.onnx] [--profile trace.json]``: record and compare.

Runs the eager model, its captured graph (and the ONNX model), prints a summary of each
stage and the comparison of consecutive stages. Exit statuses are those of every
``yobx`` command (:data:`yobx.cli_support.EXIT_STATUS_HELP`): 0 every stage agrees,
1 a divergence was found (it is printed), 2 bad input (unknown model, missing file,
unwritable profile), 3 the model failed to trace or run.
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import Any, TextIO

import torch

from yobx.cli_support import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_MISMATCH,
    EXIT_OK,
    CommandError,
    add_inspect_arguments,
    check_writable,
    error_message,
)
from yobx.torch.inspect.compare import DEFAULT_ATOL, DEFAULT_RTOL, compare
from yobx.torch.inspect.recording import record_run
from yobx.torch.onnx.mistakes import ModelRaisesOnExampleError, raise_if_eager_fails


def inspect_model(
    model: torch.nn.Module,
    args: tuple = (),
    kwargs: dict[str, Any] | None = None,
    *,
    onnx_model: Any = None,
    profile_path: str | None = None,
    dynamic_shapes: Any = None,
    graph_module: torch.fx.GraphModule | None = None,
    verbose: int = 0,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    stream: TextIO | None = None,
) -> int:
    """Record ``eager``, ``graph`` (and ``onnx``) for one input set, print and compare them.

    :param model: the model
    :param args: positional inputs
    :param kwargs: keyword inputs
    :param onnx_model: ONNX model (proto, path or object with ``.model_proto``) to check
    :param profile_path: write a Chrome trace file of the recorded run there
    :param dynamic_shapes: given to the tracer
    :param graph_module: the traced graph, traced here if missing
    :param verbose: 0 prints stage summaries, 1 adds the first calls of each stage, 2 and
        more all calls
    :param atol: absolute tolerance of the comparisons
    :param rtol: relative tolerance of the comparisons
    :param stream: where to print, default ``sys.stdout``
    :return: :data:`~yobx.cli_support.EXIT_OK` (0) when every stage agrees,
        :data:`~yobx.cli_support.EXIT_MISMATCH` (1) when a divergence was found
    :raises CommandError: with status :data:`~yobx.cli_support.EXIT_BAD_INPUT` (2) for
        bad input (missing file, wrong inputs), :data:`~yobx.cli_support.EXIT_FAILURE`
        (3) when the model fails to trace or run; the cause is chained
    """
    stream = stream or sys.stdout
    try:
        # a first eager call outside the recording (state restored after it): lazy
        # initialisations would otherwise be timed as the first call's duration
        raise_if_eager_fails(model, tuple(args), dict(kwargs or {}))
    except ModelRaisesOnExampleError as e:
        raise CommandError(str(e), EXIT_FAILURE) from e
    busy = _busy_machine()
    try:
        result = record_run(
            model,
            inputs=[(tuple(args), dict(kwargs or {}))],
            graph_module=graph_module,
            onnx_model=onnx_model,
            profile=profile_path,
            dynamic_shapes=dynamic_shapes,
        )
    except (FileNotFoundError, TypeError, ValueError) as e:
        raise CommandError(error_message(e), EXIT_BAD_INPUT) from e
    except Exception as e:
        raise CommandError(error_message(e, "recording failed: "), EXIT_FAILURE) from e

    if busy:
        print(f"note: {busy}: the durations below may be inflated", file=stream)
    rows = 0 if verbose <= 0 else (20 if verbose == 1 else 10**9)
    for stage in result:
        print(stage.summary_line(), file=stream)
        for note in stage.notes:
            print(f"  note: {note}", file=stream)
        if rows:
            print("\n".join("  " + line for line in stage.table(rows).splitlines()), file=stream)
        slow = [c for c in stage.slowest(3) if c.duration_ns]
        if slow:
            text = ", ".join(f"{c.name} {c.duration_ns / 1000:.1f} us" for c in slow)
            print(f"  slowest: {text}", file=stream)

    code = EXIT_OK
    names = result.keys()
    for before, after in itertools.pairwise(names):
        comparison = compare(result[before], result[after], atol=atol, rtol=rtol)
        print(repr(comparison), file=stream)
        if not comparison.ok:
            code = EXIT_MISMATCH
            # Later stages inherit the difference: the first pair is the one to look at.
            break
    if result.profile_path:
        print(f"profile written to {result.profile_path}", file=stream)
    return code


def _busy_machine() -> str:
    """Why timings measured now are unreliable (other processes take the cores torch's
    threads would use), or an empty string."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return ""
    cores = os.cpu_count() or 1
    if load > cores - 0.5:
        return f"the machine is busy (load {load:.1f} on {cores} cores)"
    return ""


def run_inspect(
    model_name: str, onnx_path: str | None, profile_path: str | None, verbose: int
) -> int:
    """Entry point of ``yobx inspect``: load a named model and run :func:`inspect_model`.

    :param model_name: a name :func:`yobx.models.load_model` knows (``tiny-llm``,
        ``module:factory``...)
    :param onnx_path: ONNX file exported from that model, to compare with the FX graph
    :param profile_path: Chrome trace file to write
    :param verbose: verbosity
    :return: the exit status, 0 when every stage agrees, 1 when a divergence was found
    :raises CommandError: with the exit status of bad input (2) or of a model that
        fails to trace or run (3), see the module's docstring
    """
    from yobx.models import ModelLoadError, load_model

    if onnx_path is not None and not os.path.isfile(onnx_path):
        raise CommandError(f"ONNX file {onnx_path!r} does not exist")
    if profile_path is not None:
        check_writable(profile_path)
    try:
        model, args, kwargs, dynamic_shapes = load_model(model_name)
    except ModelLoadError as e:
        raise CommandError(str(e)) from e
    return inspect_model(
        model,
        tuple(args or ()),
        dict(kwargs or {}),
        onnx_model=onnx_path,
        profile_path=profile_path,
        dynamic_shapes=dynamic_shapes,
        verbose=verbose,
    )


__all__ = ["add_inspect_arguments", "inspect_model", "run_inspect"]
