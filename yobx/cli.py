"""The ``yobx`` command: ``yobx export``, ``yobx trace`` and ``yobx inspect``.

Every command exits with one table of statuses (:mod:`yobx.cli_support`, also shown by
``yobx --help``):

====  =====================================================================================
0     success; with ``--validate`` or for ``inspect``, the results agree with eager PyTorch
1     the result disagrees with eager PyTorch (``export --validate`` found an error beyond
      tolerance, ``inspect`` found a divergence)
2     bad input: command line, unknown model, missing file, unwritable output
3     the model could not be traced, exported or run
130   interrupted
====  =====================================================================================

An error goes to stderr (``yobx: error: ...``): yobx's own errors in full, their fix
included, other errors by their first line; ``--verbose`` adds the traceback. ``yobx
--help`` and ``yobx --version`` do not import torch. Output cut short by a closed pipe
(``yobx trace ... | head``) ends quietly.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Sequence

from yobx import __version__
from yobx.cli_support import (
    EXIT_BAD_INPUT,  # noqa: F401 - part of this module's interface
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_STATUS_HELP,
    CommandError,
    add_inspect_arguments,
    check_writable,
    error_message,
    resolve_dynamic_shapes,
)
from yobx.export_command import (
    add_export_arguments,
    add_narrowing_argument,
    choose_task,
    run_export,
)

# kept for callers of the previous private names
_CommandError = CommandError


class _ListArchitectures(argparse.Action):
    """``yobx export --list``: prints the table and exits, as ``--version`` does (the
    model and the output are not needed)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from yobx.models.hf_families import KNOWN_TO_EXPORT

        lines = ["Hugging Face architectures whose export is tested (yobx export hf:<name>):"]
        for family, names in KNOWN_TO_EXPORT.items():
            lines.append(f"  {family + ':':16s} {', '.join(names)}")
        lines.append("Other architectures of these families build the same inputs and may work.")
        print("\n".join(lines))  # a listing, on stdout as --version's
        parser.exit(0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="yobx",
        description="Capture PyTorch models as torch.fx graphs and export them to ONNX.",
        epilog=EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"yobx {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    model_help = (
        "a built-in demo (tiny-llm, tiny-cnn, tiny-lstm, tiny-gru, transformer-encoder), "
        "module:factory (a module of the current directory, or path/to/file.py:factory) "
        "returning (model, args[, kwargs[, dynamic_shapes]]), or hf:<Architecture> "
        "(tiny random Hugging Face model of any family, `yobx export --list` shows those "
        "tested; or a real one with --config and --weights), hf:<directory> (written by "
        "save_pretrained) or hf:<org/name> (from the local Hugging Face cache, offline)"
    )

    # every command shows the exit statuses in its own --help too
    status = {"epilog": EXIT_STATUS_HELP, "formatter_class": argparse.RawDescriptionHelpFormatter}
    export = commands.add_parser("export", help="export a model to ONNX", **status)
    export.add_argument("model", help=model_help)
    export.add_argument(
        "--list",
        action=_ListArchitectures,
        help="print the Hugging Face architectures whose hf: export is tested, by family",
    )
    add_export_arguments(export)

    trace = commands.add_parser("trace", help="print the captured graph and its guards", **status)
    trace.add_argument("model", help=model_help)
    shapes = trace.add_mutually_exclusive_group()
    shapes.add_argument("--static", action="store_true", help="trace with the example's sizes")
    shapes.add_argument(
        "--dynamic", action="store_true", help="the default: the model's dynamic dimensions"
    )
    add_narrowing_argument(trace)
    trace.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")

    inspect = commands.add_parser(
        "inspect", help="run the captured graph and ONNX model, compare node by node", **status
    )
    inspect.add_argument("model", help=model_help)
    add_inspect_arguments(inspect)
    return parser


def _load(name: str):
    from yobx.models import ModelLoadError, load_model

    try:
        return load_model(name)
    except ModelLoadError as exc:
        raise CommandError(str(exc)) from exc


def _export(options: argparse.Namespace) -> int:
    check_writable(options.output)
    choose_task(options)
    if getattr(options, "task", None) == "text2text-generation":
        from yobx.seq2seq_command import run_seq2seq_export

        # two graphs, an encoder and a decoder step: their own command
        return run_seq2seq_export(options)
    return run_export(options)


def _trace(options: argparse.Namespace) -> int:
    model, args, kwargs, declared = _load(options.model)
    dynamic_shapes = resolve_dynamic_shapes(options, model, args, kwargs, declared)
    from yobx.torch.onnx.capture import capture

    try:
        captured = capture(
            model,
            args,
            kwargs,
            dynamic_shapes,
            narrowing=options.narrowing,
            max_versions=options.max_versions,
        )
    except Exception as exc:
        raise CommandError(error_message(exc, "trace failed: "), EXIT_FAILURE) from exc
    graph_module = captured.graph_module
    text = graph_module.print_readable(print_output=False, include_stride=False)
    print(_with_dimension_names(text, captured.dimension_names))
    if captured.dimension_names:
        names = ", ".join(f"{k} -> {v}" for k, v in sorted(captured.dimension_names.items()))
        print(f"dimensions: {names}")
    print(f"guards ({len(captured.guards)}):")
    for guard in captured.guards:
        print(f"  {guard}")
    print(f"constraints ({len(captured.constraints)}):")
    for constraint in captured.constraints:
        print(f"  {constraint}")
    _print_versions(captured.tracer)
    if captured.range_constraints:
        ranges = ", ".join(
            f"{name} in [{low}, {high}]" for name, (low, high) in captured.range_constraints.items()
        )
        print(f"ranges: {ranges}")
    return 0


def _with_dimension_names(text: str, names: dict[str, str]) -> str:
    """``f32[s59, s14]`` written ``f32[batch, seq]``: the ShapeEnv's symbols of the
    printed graph replaced by the user's dimension names."""
    if not names:
        return text

    def rename(annotation: re.Match) -> str:
        # only inside the annotations ("i64[s59, s14]", "Sym(s14)"), never in the code
        return re.sub(
            r"\b[su]\d+\b", lambda m: names.get(m.group(0), m.group(0)), annotation.group(0)
        )

    return re.sub(r'"(?:[a-z]+\d*\[[^"\n]*\]|Sym\([^"\n]*\))"', rename, text)


def _print_versions(tracer) -> None:
    """The versions the graph chooses between, and the decisions left constraints."""
    from yobx.torch.tracing.constraints.versions import describe_versions

    versions, notes = list(tracer.versions), list(tracer.version_notes)
    if versions or notes:
        print(f"versions ({len(versions) or 1}, chosen from the inputs' sizes):")
        for line in describe_versions(versions, notes):
            print(line)


def _inspect(options: argparse.Namespace) -> int:
    from yobx.inspect_command import run_inspect

    return run_inspect(options.model, options.onnx, options.profile, int(options.verbose))


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``yobx`` command, returns the exit status (0 success, 1 the result
    disagrees with eager PyTorch, 2 bad input, 3 the model could not be traced, exported
    or run, 130 interrupted; see :mod:`yobx.cli`).

    :param argv: the arguments after ``yobx``, default ``sys.argv[1:]``
    :raises SystemExit: for ``--help`` (status 0) and a command line argparse rejects
        (status 2), as argparse does
    """
    options = _parser().parse_args(argv)
    handlers = {"export": _export, "trace": _trace, "inspect": _inspect}
    try:
        return handlers[options.command](options)
    except BrokenPipeError:
        # the reader stopped (`yobx trace ... | head`): what it wanted was printed; stdout
        # goes nowhere from now on, so that the interpreter's last flush cannot fail
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except CommandError as exc:
        if options.verbose:
            traceback.print_exc()
        print(f"yobx: error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print("yobx: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
