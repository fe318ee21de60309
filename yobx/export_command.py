"""``yobx export MODEL -o FILE``: the main job.

Dynamic batch and sequence dimensions by default (``--static`` opts out); each stage
is reported on stderr with its time as it ends; the summary goes to stdout: inputs and
outputs with their dimension names, constraints, the files written and the
validation table. Exit statuses: 0 exported (and, with ``--validate``, in agreement
with eager PyTorch), 1 the validation found an error beyond tolerance, 2 bad input, 3
the model could not be exported (see :mod:`yobx.cli`).

With ``--weights`` (and, for ``hf:<Architecture>``, ``--config``), the model is built
without its weights (parameters on the meta device), its graph is exported, and the
weights are streamed from the checkpoint into the ONNX file's external data.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from yobx.cli_support import (
    EXIT_FAILURE,
    EXIT_MISMATCH,
    CommandError,
    error_message,
    format_size,
    resolve_dynamic_shapes,
)


def add_export_arguments(export: argparse.ArgumentParser) -> None:
    """Declares the options of ``yobx export``."""
    export.add_argument("-o", "--output", required=True, help="ONNX file to write")
    shapes = export.add_mutually_exclusive_group()
    shapes.add_argument(
        "--static",
        action="store_true",
        help="export with the example's sizes (by default, batch and sequence "
        "dimensions are dynamic and named)",
    )
    shapes.add_argument(
        "--dynamic", action="store_true", help="the default: named dynamic dimensions"
    )
    export.add_argument("--opset", type=int, default=None, help="ONNX opset (default 18)")
    export.add_argument(
        "--validate",
        action="store_true",
        help="compare onnxruntime with eager PyTorch, on the example and on other sizes",
    )
    export.add_argument(
        "--config",
        default=None,
        help="with hf:<Architecture>, a config.json (or its directory): the model is "
        "built at its real size with parameters on the meta device (default: the "
        "config.json next to --weights)",
    )
    export.add_argument(
        "--weights",
        nargs="+",
        default=None,
        help="weights to export with: a .safetensors file, shards, a "
        "model.safetensors.index.json or a directory; streamed into the ONNX file",
    )
    export.add_argument(
        "--external-data",
        choices=("auto", "yes", "no"),
        default="auto",
        help="weights in FILE.data: 'auto' past 2 GB (default), 'yes' always, 'no' never",
    )
    export.add_argument(
        "--no-runtime-checks",
        dest="runtime_checks",
        action="store_false",
        help="leave out the nodes checking the constraints the model assumes of its "
        "inputs' sizes: onnxruntime then returns wrong values outside them instead of "
        "failing with an error naming the constraint",
    )
    export.add_argument(
        "--task",
        choices=(
            "feature-extraction",
            "text-generation",
            "text2text-generation",
            "image-classification",
            "automatic-speech-recognition",
        ),
        default=None,
        help="with hf:<Architecture>: 'feature-extraction' exports the model's "
        "outputs without a cache; 'text-generation' exports one generation step with its "
        "cache (past_key_values.<layer>.key|value in, present.<layer>.key|value out), "
        "which serves prefill and decode; 'text2text-generation' exports an "
        "encoder-decoder model (T5, BART, Whisper) as FILE's stem + .encoder.onnx and "
        ".decoder.onnx (the decoder's step with its self- and cross-attention caches); "
        "--validate then also checks that greedy generation with onnxruntime gives "
        "model.generate's tokens; 'image-classification' and "
        "'automatic-speech-recognition' export the model's outputs (a speech "
        "encoder-decoder's: text2text-generation), checked to be what the architecture "
        "does. Default: from the architecture, text-generation for a causal LM, "
        "text2text-generation for an encoder-decoder, else feature-extraction",
    )
    add_quantize_arguments(export)
    add_narrowing_argument(export)
    export.add_argument("--profile", default=None, help="write a Chrome trace of the stages")
    export.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")


def add_quantize_arguments(export: argparse.ArgumentParser) -> None:
    """``--quantize`` and ``--block-size``, for ``yobx export``."""
    export.add_argument(
        "--quantize",
        choices=("int4",),
        default=None,
        help="'int4': the weights of the linear layers become 4-bit (onnxruntime's "
        "MatMulNBits, symmetric blocks along the input); --validate then compares with "
        "the eager model on the dequantized weights. Reads every weight into memory",
    )
    export.add_argument(
        "--block-size",
        type=int,
        default=32,
        help="with --quantize: the weights sharing a scale (a power of two, from 16; default 32)",
    )
    export.add_argument(
        "--accuracy-level",
        type=int,
        choices=(0, 1, 2, 3, 4),
        default=0,
        help="with --quantize: the type the products compute in: 0 (default) the inputs' "
        "float type, exact on the dequantized weights; 4 int8 activations, faster on a "
        "decode step, not exact (--validate checks the same graph at level 0)",
    )


def add_narrowing_argument(parser: argparse.ArgumentParser) -> None:
    """``--narrowing``, for the commands that capture a model."""
    parser.add_argument(
        "--narrowing",
        choices=("versions", "constraints"),
        default="versions",
        help="what a decision on dynamic sizes the example cannot settle becomes: "
        "'versions' (default) captures both sides and the model chooses from the "
        "inputs' sizes; 'constraints' keeps the example's side and checks it",
    )
    parser.add_argument(
        "--max-versions",
        type=int,
        default=None,
        help="with --narrowing versions: the most versions captured (default 8); each "
        "costs about one more capture, lowering and validation; the sides where a size "
        "is 0 or 1 (an empty cache, one token) come first",
    )


def _report(stage: Any) -> None:
    extra = ""
    if "rss_bytes" in stage.args:
        extra = f"  (rss {format_size(stage.args['rss_bytes'])})"
    print(f"yobx: {stage.name:<14} {stage.duration_s:8.3f} s{extra}", file=sys.stderr, flush=True)


def _weights_source(weights: list[str] | None) -> Any:
    if not weights:
        return None
    return weights[0] if len(weights) == 1 else list(weights)


def _config_next_to(weights: str, model: str) -> str:
    """The ``config.json`` of a Hugging Face checkpoint, next to its weights: the tiny
    configuration of ``hf:<Architecture>`` has other shapes than a real checkpoint."""
    directory = weights if os.path.isdir(weights) else os.path.dirname(os.path.abspath(weights))
    config = os.path.join(directory, "config.json")
    if not os.path.isfile(config):
        raise CommandError(
            f"{model} with --weights needs the checkpoint's configuration: no config.json "
            f"next to {weights!r}, give --config path/to/config.json"
        )
    print(f"yobx: config     {config}", file=sys.stderr)
    return config


def _checkpoint(options: argparse.Namespace) -> None:
    """``hf:<directory>`` or ``hf:<model id>`` (in the local cache): the architecture
    its config.json names, built from that configuration with the directory's weights
    (as ``hf:<Architecture> --config DIR --weights DIR``)."""
    from yobx.models.hf_checkpoints import CheckpointNotFoundError, resolve_checkpoint

    if not options.model.startswith("hf:"):
        return
    try:
        architecture, directory = resolve_checkpoint(options.model[3:])
    except CheckpointNotFoundError as exc:
        raise CommandError(str(exc)) from exc
    if directory is None:
        return
    if options.weights or options.config:
        raise CommandError(
            f"{options.model} is a checkpoint: its config.json and weights are used, "
            "leave out --config and --weights"
        )
    print(f"yobx: checkpoint {directory} ({architecture})", file=sys.stderr)
    options.model = f"hf:{architecture}"
    options.weights, options.config = [directory], directory


def _load(options: argparse.Namespace) -> tuple[Any, tuple, dict, Any]:
    from yobx.models import ModelLoadError, load_model
    from yobx.torch.onnx.weight_sources import (
        WeightSourceError,
        dominant_dtype,
        open_weight_source,
    )

    _checkpoint(options)
    source = _weights_source(options.weights)
    if options.config is not None and source is None:
        raise CommandError("--config builds the model without weights: give --weights")
    if options.model.startswith("hf:") and source is not None and options.config is None:
        options.config = _config_next_to(options.weights[0], options.model)
    dtype = None
    try:
        if source is not None:
            # only the headers are read: a bad source fails before the export
            dtype = dominant_dtype(open_weight_source(source))
        task = getattr(options, "task", None)
        try:
            return load_model(options.model, config=options.config, dtype=dtype, task=task)
        except ModelLoadError as exc:
            if task != "text-generation" or not getattr(options, "task_by_default", False):
                raise
            # a causal LM whose cache layers are neither plain nor sliding-window ones
            # (linear-attention states...): its outputs without the cache, said so,
            # rather than nothing
            print(
                f"yobx: warning: {exc}; exporting {options.model} without its cache "
                "(--task feature-extraction)",
                file=sys.stderr,
            )
            options.task = "feature-extraction"
            return load_model(options.model, config=options.config, dtype=dtype)
    except (ModelLoadError, WeightSourceError) as exc:
        raise CommandError(str(exc)) from exc


def choose_task(options: argparse.Namespace) -> None:
    """Sets ``options.task`` to what the asked task exports of an ``hf:`` architecture
    (see :func:`yobx.models.huggingface.export_kind`); without ``--task``, from the
    architecture, said on stderr when it is a generation task.

    :raises CommandError: the architecture does not serve the asked task
    """
    asked = getattr(options, "task", None)
    if not options.model.startswith("hf:"):
        return  # load_model refuses a task for any other model
    _checkpoint(options)
    from yobx.models.huggingface import export_kind

    try:
        task = export_kind(options.model[3:], asked)
    except ValueError as exc:
        if asked is None:
            return  # not a transformers architecture: loading the model says so
        raise CommandError(str(exc)) from exc
    options.task = task
    if asked is None and task != "feature-extraction":
        options.task_by_default = True
        print(
            f"yobx: task {task}, the default for {options.model[3:]} (--task "
            "feature-extraction exports the model's outputs without a cache)",
            file=sys.stderr,
        )


def _run_stage(label: str, function, *args, **kwargs):
    from yobx.torch.onnx import OnnxExportError
    from yobx.torch.onnx.weights import WeightsMismatchError

    try:
        return function(*args, **kwargs)
    except (CommandError, KeyboardInterrupt):
        raise
    except ImportError as exc:
        if "onnxruntime" in str(exc):
            raise CommandError(
                "--validate needs onnxruntime, a dependency of yobx: pip install onnxruntime"
            ) from exc
        raise
    except WeightsMismatchError as exc:
        raise CommandError(str(exc)) from exc
    except OnnxExportError as exc:
        raise CommandError(f"{label} failed: {exc}", EXIT_FAILURE) from exc
    except Exception as exc:
        raise CommandError(error_message(exc, f"{label} failed: "), EXIT_FAILURE) from exc


def check_opset_option(options: argparse.Namespace) -> None:
    """Refuses an ``--opset`` yobx cannot export to, before anything is loaded."""
    if options.opset is not None:
        from yobx.torch.onnx.export import check_opset

        try:
            check_opset(options.opset)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc


def run_export(options: argparse.Namespace) -> int:
    """Runs ``yobx export``; returns the exit status."""
    start = time.perf_counter()
    check_opset_option(options)
    if getattr(options, "quantize", None):
        from yobx.torch.onnx.quantize import check_block_size

        try:
            check_block_size(options.block_size)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
    loaded = _load(options)
    model, args, kwargs, declared = loaded
    dynamic_shapes = resolve_dynamic_shapes(options, model, args, kwargs, declared)

    from yobx.torch.onnx import to_onnx

    print(f"yobx: {'load':<14} {time.perf_counter() - start:8.3f} s", file=sys.stderr)

    result = _run_stage(
        "export",
        to_onnx,
        model,
        args,
        kwargs,
        dynamic_shapes=dynamic_shapes,
        opset=options.opset,
        progress=_report,
        runtime_checks=getattr(options, "runtime_checks", True),
        narrowing=getattr(options, "narrowing", "versions"),
        max_versions=getattr(options, "max_versions", None),
    )
    warn_about_constraints(result)
    source = _weights_source(options.weights)
    if source is not None:
        _run_stage("weights", result.apply_weights, source)
        _report(result.stages[-1])
    if getattr(options, "quantize", None):
        _run_stage("quantize", result.quantize, options.block_size, options.accuracy_level)
        _report(result.stages[-1])
    external = {"auto": None, "yes": True, "no": False}[options.external_data]
    _run_stage("save", result.save, options.output, external_data=external)
    _report(result.stages[-1])
    status = 0
    if options.validate:
        if source is not None:
            from yobx.torch.onnx.weights import load_weights_into

            _run_stage("loading the weights into the model", load_weights_into, model, source)
        given = getattr(loaded, "validation_inputs", [])
        _run_stage("validation", result.validate, model, args, kwargs, given)
        _report(result.stages[-1])
        status = 0 if result.validation.ok else EXIT_MISMATCH
        if getattr(options, "task", None) == "text-generation":
            # a quantized step generates as the model on its dequantized weights
            with result.computing_as(model):
                same = _run_stage("generation", _same_generation, result, model, kwargs)
            status = status or (0 if same else EXIT_MISMATCH)
    if options.profile:
        from yobx.torch.chrome_trace import write_stage_profile

        write_stage_profile(result.stages, options.profile)
    print_summary(result, time.perf_counter() - start)
    if status:
        print("yobx: error: validation failed", file=sys.stderr)
    return status


def _same_generation(result: Any, model: Any, kwargs: dict, new_tokens: int = 8) -> bool:
    """Greedy generation with the exported step and onnxruntime against
    ``model.generate(do_sample=False)``, from prompts of one and of several tokens;
    prints the verdict."""
    import numpy as np
    import torch

    from yobx.torch.onnx.generate import generate

    eos = getattr(model.generation_config, "eos_token_id", None)
    same = True
    for seq in (1, 4):
        ids = kwargs["input_ids"][:, :1].repeat(1, seq) + torch.arange(seq)
        with torch.no_grad():
            expected = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                do_sample=False,
            ).numpy()
        got = generate(result, ids, new_tokens, eos_token_id=eos)
        agree = expected.shape == got.shape and bool(np.array_equal(expected, got))
        same = same and agree
        verdict = "the same tokens as" if agree else "OTHER tokens than"
        print(
            f"yobx: generation: prompts of {seq} token(s), {new_tokens} new: {verdict} "
            "model.generate",
            file=sys.stderr,
        )
    return same


def warn_about_constraints(result: Any) -> None:
    """Says on stderr what the model assumes of its inputs beyond their declarations
    (the constraints adopted from the example), and whether the model checks it."""
    constraints = result.constraints
    if not constraints:
        return
    checked = {check.expression for check in result.runtime_checks}
    # a version's constraint is checked when the model selects the version
    unchecked = [
        c
        for c in constraints
        if (f"{c.expression} when {c.when}" if c.when else c.expression) not in checked
    ]
    if unchecked:
        how = (
            "NOT checked by the model (--no-runtime-checks): onnxruntime returns wrong "
            "values for inputs outside them"
        )
    else:
        how = "checked by the model: onnxruntime refuses inputs outside them, naming them"
    print(
        f"yobx: warning: the model is exact only for inputs satisfying "
        f"{len(constraints)} constraint(s) taken from the example, {how}:",
        file=sys.stderr,
    )
    for constraint in constraints:
        print(f"yobx: warning:   {constraint}", file=sys.stderr)


def _dims(value: Any) -> str:
    if value.shape is None:
        return "?"
    parts = []
    for dim in value.shape:
        parts.append(str(dim.value) if hasattr(dim, "value") else str(dim))
    return "[" + ", ".join(parts) + "]"


def _dtype(value: Any) -> str:
    if value.dtype is None:
        return "?"
    try:
        return value.dtype.numpy().name
    except (TypeError, ValueError):
        return value.dtype.name.lower()


def _print_values(title: str, values: Any, width: int) -> None:
    print(title)
    for value in values:
        print(f"  {value.name:<{width}}  {_dtype(value):<8} {_dims(value)}")


def _print_validation(report: Any) -> None:
    rows = [("case", "output", "shape", "max abs", "max rel", "status")]
    for case in report.cases:
        if case.check is not None:
            status = f"WRONG: {case.error}" if case.error else "refused, naming the check"
            rows.append((case.description, "-", "-", "-", "-", status))
            continue
        if case.skipped or case.error is not None:
            status = "skipped" if case.skipped else "FAILED"
            rows.append((case.description, "-", "-", "-", "-", f"{status}: {case.error}"))
            continue
        for out in case.outputs:
            ok = out.error is None and out.within_tolerance
            rows.append(
                (
                    case.description,
                    out.name,
                    str(list(out.shape)),
                    f"{out.max_abs_error:.3g}",
                    f"{out.max_rel_error:.3g}",
                    "ok" if ok else (out.error or "FAILED"),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)]
        print("  " + "  ".join([*cells, row[5]]).rstrip())
    verdict = "OK" if report.ok else "FAILED"
    fired = f", {report.n_checks_fired} runtime checks enforced" if report.n_checks_fired else ""
    print(
        f"  {verdict}: {report.n_checked} input sets{fired}, max abs error "
        f"{report.max_abs_error:.3g}, max rel error {report.max_rel_error:.3g}"
    )
    for problem in report.problems:
        print(f"  - {problem}")


def _with_range(name: str, bounds: Any) -> str:
    """``seq in [2, 32]`` for a dimension with a declared or adopted maximum, ``batch``
    for one unbounded above."""
    from yobx.torch.tracing.dynamic_shapes import UNBOUNDED

    if bounds is None or bounds[1] in (None, float("inf")) or bounds[1] >= UNBOUNDED:
        return name
    return f"{name} in [{bounds[0]}, {bounds[1]}]"


def print_summary(result: Any, total_s: float) -> None:
    """Prints what was exported: inputs, outputs, constraints, files, validation."""
    graph = result.model.graph
    print("summary")
    width = max((len(v.name) for v in [*graph.inputs, *graph.outputs]), default=0)
    _print_values("inputs", graph.inputs, width)
    _print_values("outputs", graph.outputs, width)
    dims = ", ".join(
        _with_range(name, result.range_constraints.get(name)) for name in result.dynamic_dimensions
    )
    print(f"dynamic dimensions  {dims or 'none (static)'}")
    print(f"constraints         {len(result.constraints) or 'none'}")
    for constraint in result.constraints:
        print(f"  {constraint}")
    print(f"runtime checks      {len(result.runtime_checks) or 'none'}")
    for check in result.runtime_checks:
        print(f"  {check.expression}")
    versions, notes = result.versions, result.version_notes
    if versions or notes:
        from yobx.torch.tracing.constraints.versions import describe_versions

        print(f"versions            {len(versions) or 1} (an If on the inputs' sizes)")
        for line in describe_versions(versions, notes):
            print(line)
    print(f"graph nodes         {result.n_graph_nodes}")
    print(f"onnx nodes          {result.n_onnx_nodes}")
    print(f"weights             {format_size(result.weight_bytes)}")
    if result.validation is not None:
        print("validation")
        _print_validation(result.validation)
    print(f"total time          {total_s:.3f} s")
    for path in result.files:
        print(f"wrote {os.path.abspath(path)} ({format_size(os.path.getsize(path))})")


__all__ = ["add_export_arguments", "add_narrowing_argument", "print_summary", "run_export"]
