"""The ``yobx`` command: ``yobx export``, ``yobx trace`` and ``yobx inspect``.

Bad input (unknown model, failing factory, unwritable output) exits with status 2 and
one line on stderr; a model that cannot be exported or fails validation exits with
status 1. ``--verbose`` adds the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

#: Exit status for bad command line input.
EXIT_BAD_INPUT = 2
#: Exit status when the export or the validation fails.
EXIT_FAILURE = 1


class _CommandError(Exception):
    def __init__(self, message: str, status: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.status = status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="yobx",
        description="Capture PyTorch models as torch.fx graphs and export them to ONNX.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    model_help = (
        "a built-in demo (tiny-llm, tiny-cnn, tiny-lstm, tiny-gru, transformer-encoder), "
        "package.module:factory returning (model, args[, kwargs[, dynamic_shapes]]), "
        "or hf:<Architecture> (tiny random Hugging Face model)"
    )

    export = commands.add_parser("export", help="export a model to ONNX")
    export.add_argument("model", help=model_help)
    export.add_argument("-o", "--output", required=True, help="ONNX file to write")
    export.add_argument(
        "--dynamic",
        action="store_true",
        help="keep the model's dynamic dimensions (batch, seq, ...) dynamic in the ONNX model",
    )
    export.add_argument(
        "--opset",
        type=int,
        default=None,
        help="ONNX opset (default 18; from 18 to the newest onnxscript converts to)",
    )
    export.add_argument(
        "--validate",
        action="store_true",
        help="compare onnxruntime with eager PyTorch, also on other sizes when --dynamic",
    )
    export.add_argument("--profile", default=None, help="write a Chrome trace of the stages")
    export.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")

    trace = commands.add_parser("trace", help="print the captured graph and its guards")
    trace.add_argument("model", help=model_help)
    trace.add_argument(
        "--dynamic", action="store_true", help="trace with the model's dynamic dimensions"
    )
    trace.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")

    inspect = commands.add_parser(
        "inspect", help="run the captured graph and ONNX model, compare node by node"
    )
    inspect.add_argument("model", help=model_help)
    inspect.add_argument("--onnx", default=None, help="ONNX model to compare with")
    inspect.add_argument("--profile", default=None, help="write a Chrome trace there")
    inspect.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    return parser


def _load(name: str):
    from yobx.models import ModelLoadError, load_model

    try:
        return load_model(name)
    except ModelLoadError as exc:
        raise _CommandError(str(exc)) from exc


def _check_writable(path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise _CommandError(f"cannot write {path!r}: directory {directory!r} does not exist")
    if os.path.isdir(path):
        raise _CommandError(f"cannot write {path!r}: it is a directory")
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise _CommandError(f"cannot write {path!r}: permission denied")


def _format_size(n_bytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n_bytes < 1024 or unit == "GB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
    return f"{n_bytes} B"


def _dynamic_shapes_from_roles(name: str, model: Any, args: tuple, kwargs: dict) -> dict:
    """``--dynamic`` for a model that declares no dynamic shapes: derived from the
    inputs' roles (``input_ids``...), or an error saying how to declare them."""
    from yobx.models.roles import UnknownRoleError, dynamic_shapes_from_roles

    try:
        shapes = dynamic_shapes_from_roles(model, args, kwargs, repr(name))
    except UnknownRoleError as exc:
        raise _CommandError(str(exc)) from exc
    derived = ", ".join(f"{k}: {v}" for k, v in shapes.items() if v)
    print(f"  dynamic shapes derived from the inputs' roles: {derived}", flush=True)
    return shapes


def _export(options: argparse.Namespace) -> int:
    _check_writable(options.output)
    if options.opset is not None:
        from yobx.torch.onnx.export import check_opset

        try:
            check_opset(options.opset)
        except ValueError as exc:
            raise _CommandError(str(exc)) from exc
    start = time.perf_counter()
    print(f"yobx export {options.model}", flush=True)
    model, args, kwargs, dynamic_shapes = _load(options.model)
    if options.dynamic and dynamic_shapes is None:
        dynamic_shapes = _dynamic_shapes_from_roles(options.model, model, args, kwargs)
    print(f"  {'load':<10} {time.perf_counter() - start:7.3f} s", flush=True)

    from yobx.torch.onnx import OnnxExportError, to_onnx

    def progress(stage) -> None:
        print(f"  {stage.name:<10} {stage.duration_s:7.3f} s", flush=True)

    try:
        result = to_onnx(
            model,
            args,
            kwargs,
            dynamic_shapes=dynamic_shapes if options.dynamic else None,
            filename=options.output,
            opset=options.opset,
            validate=options.validate,
            profile=options.profile,
            progress=progress,
        )
    except OnnxExportError as exc:
        raise _CommandError(f"export failed: {exc}", EXIT_FAILURE) from exc
    except Exception as exc:
        raise _CommandError(
            f"export failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}",
            EXIT_FAILURE,
        ) from exc
    dims = ", ".join(result.dynamic_dimensions) or "none" + (
        "" if options.dynamic else " (use --dynamic)"
    )
    print("summary")
    print(f"  graph nodes         {result.n_graph_nodes}")
    print(f"  onnx nodes          {result.n_onnx_nodes}")
    print(f"  dynamic dimensions  {dims}")
    print(f"  guards              {len(result.guards)}")
    print(f"  constraints         {len(result.constraints)}")
    for constraint in result.constraints:
        print(f"    {constraint}")
    status = 0
    if result.validation is not None:
        report = result.validation
        verdict = "OK" if report.ok else "FAILED"
        print(
            f"  validation          {verdict}: {report.n_checked} input sets, "
            f"max abs error {report.max_abs_error:.3g}, "
            f"max rel error {report.max_rel_error:.3g}"
        )
        if not report.ok:
            print(report.format())
            status = EXIT_FAILURE
    size = os.path.getsize(options.output)
    print(f"  total time          {time.perf_counter() - start:.3f} s")
    print(f"wrote {options.output} ({_format_size(size)})")
    if status:
        print("yobx: error: validation failed", file=sys.stderr)
    return status


def _trace(options: argparse.Namespace) -> int:
    model, args, kwargs, dynamic_shapes = _load(options.model)
    if options.dynamic and dynamic_shapes is None:
        dynamic_shapes = _dynamic_shapes_from_roles(options.model, model, args, kwargs)
    from yobx.torch.onnx.capture import capture

    try:
        captured = capture(model, args, kwargs, dynamic_shapes if options.dynamic else None)
    except Exception as exc:
        raise _CommandError(
            f"trace failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}",
            EXIT_FAILURE,
        ) from exc
    graph_module = captured.graph_module
    print(graph_module.print_readable(print_output=False, include_stride=False))
    if captured.dimension_names:
        names = ", ".join(f"{k} -> {v}" for k, v in sorted(captured.dimension_names.items()))
        print(f"dimensions: {names}")
    print(f"guards ({len(captured.guards)}):")
    for guard in captured.guards:
        print(f"  {guard}")
    print(f"constraints ({len(captured.constraints)}):")
    for constraint in captured.constraints:
        print(f"  {constraint}")
    if captured.range_constraints:
        ranges = ", ".join(
            f"{name} in [{low}, {high}]" for name, (low, high) in captured.range_constraints.items()
        )
        print(f"ranges: {ranges}")
    return 0


def _inspect(options: argparse.Namespace) -> int:
    from yobx.torch.inspect.command import run_inspect

    return run_inspect(options.model, options.onnx, options.profile, int(options.verbose))


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``yobx`` command, returns the exit status."""
    options = _parser().parse_args(argv)
    handlers = {"export": _export, "trace": _trace, "inspect": _inspect}
    try:
        return handlers[options.command](options)
    except _CommandError as exc:
        if options.verbose:
            traceback.print_exc()
        print(f"yobx: error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print("yobx: interrupted", file=sys.stderr)
        return 130
