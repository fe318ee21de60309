"""``yobx inspect MODEL [--onnx model.onnx] [--profile trace.json]``: record and compare.

Exit codes: 0 every stage agrees, 1 a divergence was found (it is printed), 2 bad input
(unknown model, missing file), 3 the model failed to run or trace.
"""

from __future__ import annotations

import itertools
import os
import sys
import traceback
from typing import Any, TextIO

import torch

from .compare import DEFAULT_ATOL, DEFAULT_RTOL, compare
from .recording import record_run

EXIT_OK = 0
EXIT_DIVERGENCE = 1
EXIT_BAD_INPUT = 2
EXIT_FAILURE = 3


def _error(message: str) -> None:
    print(f"yobx inspect: {message}", file=sys.stderr)


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
    :return: exit code, see the module's docstring
    """
    stream = stream or sys.stdout
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
        if verbose:
            traceback.print_exc()
        _error(f"{type(e).__name__}: {e}".splitlines()[0])
        return EXIT_BAD_INPUT
    except Exception as e:
        if verbose:
            traceback.print_exc()
        _error(f"recording failed: {type(e).__name__}: {e}".splitlines()[0])
        return EXIT_FAILURE

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
            code = EXIT_DIVERGENCE
            # Later stages inherit the difference: the first pair is the one to look at.
            break
    if result.profile_path:
        print(f"profile written to {result.profile_path}", file=stream)
    return code


def run_inspect(
    model_name: str, onnx_path: str | None, profile_path: str | None, verbose: int
) -> int:
    """Entry point of ``yobx inspect``: load a named model and run :func:`inspect_model`.

    :param model_name: a name known to ``yobx.models.load_model`` (``tiny-llm``...)
    :param onnx_path: ONNX file exported from that model, to compare with the FX graph
    :param profile_path: Chrome trace file to write
    :param verbose: verbosity
    :return: exit code (0 ok, 1 divergence, 2 bad input, 3 failure while running)
    """
    try:
        from yobx.models import load_model
    except ImportError as e:
        _error(f"cannot load models by name ({e})")
        return EXIT_BAD_INPUT
    if onnx_path is not None and not os.path.isfile(onnx_path):
        _error(f"ONNX file {onnx_path!r} does not exist")
        return EXIT_BAD_INPUT
    if profile_path is not None:
        directory = os.path.dirname(os.path.abspath(profile_path))
        if not os.path.isdir(directory):
            _error(f"directory {directory!r} of the profile file does not exist")
            return EXIT_BAD_INPUT
    try:
        model, args, kwargs, dynamic_shapes = load_model(model_name)
    except (KeyError, ValueError) as e:
        message = str(e).splitlines()[0] if str(e) else f"unknown model {model_name!r}"
        _error(message if model_name in message else f"{model_name!r}: {message}")
        return EXIT_BAD_INPUT
    return inspect_model(
        model,
        tuple(args or ()),
        dict(kwargs or {}),
        onnx_model=onnx_path,
        profile_path=profile_path,
        dynamic_shapes=dynamic_shapes,
        verbose=verbose,
    )
