"""Encoder-decoder generation through transformers' exporters: yobx's backend against
transformers' own ``OnnxExporter``.

For each architecture (tiny random model): ``export_for_generation`` with each exporter
(time), then every component (``prefill``, ``decode``) run by transformers' runner on
the inputs ``decompose_for_generation`` gives for other prompts (batch and length),
against eager (largest absolute difference of the logits)::

    python _scripts/compare_encoder_decoder_generation.py
    python _scripts/compare_encoder_decoder_generation.py BartForConditionalGeneration
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ARCHITECTURES = (
    "BartForConditionalGeneration",
    "MarianMTModel",
    "PegasusForConditionalGeneration",
    "MBartForConditionalGeneration",
    "WhisperForConditionalGeneration",
    "T5ForConditionalGeneration",
)
#: (batch, prompt length) of the example, then of the other prompts compared
PROMPTS = ((2, 5), (3, 7), (1, 4))


def _model(architecture: str):
    import torch
    import transformers

    from yobx.models.hf_configs import tiny_config

    config = tiny_config(getattr(transformers, architecture))
    config.use_cache = True
    for name in ("decoder_start_token_id", "pad_token_id"):
        if getattr(config, name, None) is None:
            setattr(config, name, 0)
    torch.manual_seed(0)
    return getattr(transformers, architecture)(config).eval()


def _prompt(model, batch: int, length: int) -> dict:
    import torch

    generator = torch.Generator().manual_seed(batch * 10 + length)
    config = model.config
    if "input_features" in model.main_input_name:
        frames = 2 * config.max_source_positions
        features = torch.randn(batch, config.num_mel_bins, frames, generator=generator)
        return {"input_features": features}
    ids = torch.randint(3, config.vocab_size, (batch, length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def compare(model, exporter, config) -> str:
    """``ok <seconds> s, max diff <d>``, or why it failed."""
    import torch
    from transformers.exporters.utils import decompose_for_generation

    start = time.perf_counter()
    try:
        exported = exporter.export_for_generation(model, _prompt(model, *PROMPTS[0]), config)
    except Exception as exc:
        cause = exc.__cause__ or exc
        return f"export fails: {type(cause).__name__}: {str(cause).splitlines()[0][:150]}"
    seconds = time.perf_counter() - start
    worst = 0.0
    try:
        for batch, length in PROMPTS:
            prompt = _prompt(model, batch, length)
            components = decompose_for_generation(model, prompt, multi_token_decode=True)
            for name, (submodel, inputs) in components.items():
                with torch.no_grad():
                    expected = submodel(**copy.deepcopy(inputs)).logits
                got = exported.runners[name](**copy.deepcopy(inputs))
                worst = max(worst, float((torch.as_tensor(got.logits) - expected).abs().max()))
    except Exception as exc:
        return f"exports in {seconds:.1f} s, fails at other sizes: {str(exc).splitlines()[0][:150]}"
    return f"ok, {seconds:.1f} s, max diff {worst:.2g}"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="architectures (default: a set of six)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from transformers.exporters import OnnxConfig, OnnxExporter

    from yobx.integrations.transformers import YobxExportConfig, YobxExporter

    exporters = (
        ("yobx", YobxExporter(), YobxExportConfig()),
        ("OnnxExporter", OnnxExporter(), OnnxConfig(dynamic=True)),
    )
    print("| model | " + " | ".join(label for label, _, _ in exporters) + " |")
    print("| --- |" + " --- |" * len(exporters))
    for name in args.names or ARCHITECTURES:
        model = _model(name)
        cells = [compare(model, exporter, config) for _, exporter, config in exporters]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
