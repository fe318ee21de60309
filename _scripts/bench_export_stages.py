"""Where the time of yobx's ``export_for_generation`` goes, stage by stage.

Builds the tiny causal LM of :mod:`compare_hf_exporters` (``LlamaForCausalLM`` by
default), exports it for generation with :class:`~yobx.integrations.transformers.YobxExporter`
from a left-padded prompt of (2, 5) tokens, ``--repeat`` times in one process, and
prints the first export's time (imports, byte-compiled first as ``pip install`` leaves
them, and caches included) and the median of the
others, in all and for each stage of ``to_onnx`` (``capture``, ``lower``,
``translate``, ``optimize``...)::

    python _scripts/bench_export_stages.py [--repeat 5] [--root DIR] [--after-onnx] [NAME ...]

``--after-onnx`` first runs what ``compare_hf_exporters`` runs before it times yobx
(a greedy generation, then transformers' ``OnnxExporter``), which imports and warms
part of what yobx's first export uses.
``--root`` imports yobx from another checkout (its ``_scripts`` must hold
``compare_hf_exporters.py`` too): two runs compare two versions of the code.
"""

from __future__ import annotations

import argparse
import collections
import compileall
import os
import statistics
import sys
import time
import warnings


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=["LlamaForCausalLM"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(__file__)))
    parser.add_argument(
        "--after-onnx",
        action="store_true",
        help="first generate eagerly and export with transformers' OnnxExporter, as "
        "compare_hf_exporters does before timing yobx",
    )
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    sys.path[:0] = [root, os.path.join(root, "_scripts")]
    warnings.filterwarnings("ignore")
    from compare_hf_exporters import build_generator, prompt
    from sweep_transformers import architectures

    # the bytecode pip install writes (compare_hf_exporters.byte_compiled_yobx)
    compileall.compile_dir(os.path.join(root, "yobx"), quiet=1)

    types = {name: model_type for model_type, name in architectures("causal-lm")}
    for name in args.names:
        model = build_generator(types[name], name)
        ids, mask = prompt(min(int(model.config.vocab_size), 128), 2, 5, padded=True)
        if args.after_onnx:
            _as_compare_does(model, ids, mask)
        totals, stages = _exports(model, ids, mask, args.repeat)
        warm = {k: statistics.median(v[1:]) for k, v in stages.items() if len(v) > 1}
        print(
            f"{name}: first {totals[0]:.2f} s (import included), warm median "
            f"{statistics.median(totals[1:]):.2f} s over {len(totals) - 1}"
        )
        print("   first: " + "  ".join(f"{k} {v[0]:.3f}" for k, v in stages.items()))
        print("   warm:  " + "  ".join(f"{k} {v:.3f}" for k, v in warm.items()))


def _as_compare_does(model, ids, mask) -> None:
    """What ``compare_hf_exporters`` runs in the process before it times yobx."""
    from transformers.exporters import OnnxConfig, OnnxExporter

    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, do_sample=False)
    OnnxExporter().export_for_generation(
        model, {"input_ids": ids, "attention_mask": mask}, OnnxConfig(dynamic=True)
    )


def _exports(model, ids, mask, repeat: int) -> tuple[list[float], dict[str, list[float]]]:
    """The time of each export (the first imports yobx) and of each stage."""
    totals: list[float] = []
    stages: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(repeat + 1):
        seconds, result = _export_once(model, ids, mask)
        totals.append(seconds)
        for stage in result.stages:
            stages[stage.name].append((stage.end_ns - stage.start_ns) / 1e9)
    return totals, stages


def _export_once(model, ids, mask):
    """The time of one ``export_for_generation`` and the ``to_onnx`` result of its
    decode step (the prefill is made from it)."""
    start = time.perf_counter()
    # imported in the timed region, as compare_hf_exporters times it
    import yobx.integrations.transformers as integration

    results = []
    to_onnx = integration.to_onnx

    def recording(*args, **kwargs):
        results.append(to_onnx(*args, **kwargs))
        return results[-1]

    integration.to_onnx = recording
    try:
        exporter = integration.YobxExporter()
        exporter.export_for_generation(
            model, {"input_ids": ids, "attention_mask": mask}, integration.YobxExportConfig()
        )
    finally:
        integration.to_onnx = to_onnx
    return time.perf_counter() - start, results[-1]


if __name__ == "__main__":
    main(sys.argv[1:])
