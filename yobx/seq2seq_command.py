"""``yobx export hf:<EncoderDecoder> --task text2text-generation -o FILE``: an
encoder-decoder model (T5, BART, Whisper...) exported for generation as two graphs
(:mod:`yobx.models.hf_seq2seq`).

``-o model.onnx`` writes ``model.encoder.onnx`` and ``model.decoder.onnx`` (the
decoder's step with its self- and cross-attention caches). ``hf:<directory>`` exports a
checkpoint written by ``save_pretrained``, loaded with ``from_pretrained``; a bare
architecture gets a tiny model with random weights. ``--validate`` checks that greedy
generation with onnxruntime over the two graphs gives ``model.generate``'s tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from yobx.cli_support import EXIT_MISMATCH, CommandError

#: the graphs of an export for text2text-generation, in the order they run
PARTS = ("encoder", "decoder")


def part_files(output: str) -> dict[str, str]:
    """The file of each graph: ``model.onnx`` gives ``model.encoder.onnx`` and
    ``model.decoder.onnx``."""
    stem = output[: -len(".onnx")] if output.endswith(".onnx") else output
    return {part: f"{stem}.{part}.onnx" for part in PARTS}


def _model(options: argparse.Namespace) -> tuple[str, Any]:
    """The architecture, and the checkpoint's model (None: a tiny random one)."""
    from yobx.models.huggingface import _model_class

    architecture = options.model[3:]
    if options.weights and options.config is None:
        raise CommandError(
            "text2text-generation exports a checkpoint directory (hf:<directory>, "
            "written by save_pretrained), not --weights alone"
        )
    if options.config is None:
        return architecture, None
    if not os.path.isdir(options.config):
        raise CommandError(
            f"text2text-generation needs a checkpoint directory, not {options.config!r}"
        )
    try:
        model_class = _model_class(architecture)
        return architecture, model_class.from_pretrained(options.config).eval()
    except Exception as exc:
        raise CommandError(f"{options.model}: {type(exc).__name__}: {exc}") from exc


def run_seq2seq_export(options: argparse.Namespace) -> int:
    """Runs ``yobx export --task text2text-generation``; returns the exit status."""
    from yobx.export_command import (
        _checkpoint,
        _report,
        _run_stage,
        check_opset_option,
        print_summary,
        warn_about_constraints,
    )
    from yobx.models.hf_seq2seq import hf_seq2seq_generation
    from yobx.torch.onnx import to_onnx

    start = time.perf_counter()
    check_opset_option(options)
    if not options.model.startswith("hf:"):
        raise CommandError("--task text2text-generation applies to hf: models")
    if options.static:
        raise CommandError(
            "--task text2text-generation exports with dynamic sizes: the decoder's step "
            "serves every step of generation; leave out --static"
        )
    _checkpoint(options)
    architecture, model = _model(options)
    try:
        cases = hf_seq2seq_generation(architecture, model=model)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    print(f"yobx: {'load':<14} {time.perf_counter() - start:8.3f} s", file=sys.stderr)
    files = part_files(options.output)
    results = {}
    for part in PARTS:
        module, args, kwargs, shapes = cases[part]
        print(f"yobx: {part}", file=sys.stderr)
        results[part] = _run_stage(
            f"the {part}'s export",
            to_onnx,
            module,
            args,
            kwargs,
            dynamic_shapes=shapes,
            opset=options.opset,
            progress=_report,
            runtime_checks=getattr(options, "runtime_checks", True),
            narrowing=getattr(options, "narrowing", "versions"),
            max_versions=getattr(options, "max_versions", None),
            filename=files[part],
        )
        warn_about_constraints(results[part])
    status = 0
    if options.validate:
        model = cases["decoder"][0].model
        same = _run_stage("generation", same_generation, results, model, cases["encoder"][2])
        status = 0 if same else EXIT_MISMATCH
    for part in PARTS:
        print(f"{part} ", end="")
        print_summary(results[part], time.perf_counter() - start)
    if status:
        print("yobx: error: validation failed", file=sys.stderr)
    return status


def same_generation(results: dict, model: Any, inputs: dict, new_tokens: int = 8) -> bool:
    """Greedy generation over the two exported graphs with onnxruntime against
    ``model.generate`` (greedy search alone: no forced nor suppressed tokens), on the
    example's encoder inputs; prints the verdict."""
    import numpy as np

    from yobx.models.hf_seq2seq import greedy_reference
    from yobx.torch.onnx.generate import generate_seq2seq

    config = model.generation_config
    expected = greedy_reference(model, inputs, new_tokens).numpy()
    got = generate_seq2seq(
        results["encoder"],
        results["decoder"],
        inputs,
        new_tokens,
        config.decoder_start_token_id,
        config.eos_token_id,
        config.pad_token_id,
    )
    # some models' generate (Whisper's) returns the new tokens without the start token
    got = got[:, got.shape[1] - expected.shape[1] :]
    same = expected.shape == got.shape and bool(np.array_equal(expected, got))
    verdict = "the same tokens as" if same else "OTHER tokens than"
    print(f"yobx: generation: {new_tokens} new tokens: {verdict} model.generate", file=sys.stderr)
    return same
