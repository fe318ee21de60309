"""Coverage report: tiny Hugging Face architectures through yobx, dynamic shapes, validated.

Each architecture is built from a tiny random configuration (``yobx.models``), exported
with ``yobx.torch.to_onnx(..., validate=True)`` with dynamic batch and sequence, and the
report prints whether eager runs, whether the export validated against eager
(onnxruntime, several sizes), the time, and the first line of any error::

    python _scripts/coverage_hf.py [ARCHITECTURE ...]
"""

from __future__ import annotations

import sys
import time
import warnings

ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "PhiForCausalLM",
    "Phi3ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "StableLmForCausalLM",
    "Starcoder2ForCausalLM",
    "GPT2LMHeadModel",
    "GPTJForCausalLM",
    "GPTNeoXForCausalLM",
    "GPTBigCodeForCausalLM",
    "CodeGenForCausalLM",
    "OPTForCausalLM",
    "BloomForCausalLM",
    "FalconForCausalLM",
    "MptForCausalLM",
    "MixtralForCausalLM",
    "BertModel",
    "DistilBertModel",
    "RobertaModel",
    "XLMRobertaModel",
    "AlbertModel",
    "ElectraModel",
    "DebertaV2Model",
    "ModernBertModel",
)


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:110]


def check(architecture: str) -> tuple[str, str, float, str]:
    """Returns (eager status, export status, seconds, first error line)."""
    from yobx.models import load_model
    from yobx.torch import to_onnx

    model, args, kwargs, dynamic_shapes = load_model(f"hf:{architecture}")
    try:
        model(*args, **kwargs)
    except Exception as e:  # the tiny configuration itself does not run
        return "fails", "-", 0.0, _first_line(e)
    start = time.perf_counter()
    try:
        result = to_onnx(model, args, kwargs, dynamic_shapes=dynamic_shapes, validate=True)
    except Exception as e:
        return "ok", "FAIL", time.perf_counter() - start, _first_line(e)
    elapsed = time.perf_counter() - start
    if not result.validation.ok:
        return "ok", "WRONG", elapsed, f"max abs error {result.validation.max_abs_error:.2e}"
    return "ok", "ok", elapsed, f"max abs error {result.validation.max_abs_error:.1e}"


def main(argv: list[str]) -> None:
    warnings.filterwarnings("ignore")
    names = argv or list(ARCHITECTURES)
    print(f"{'architecture':24s} {'eager':6s} {'export':7s} {'time s':>7s}  detail")
    counts = {"ok": 0}
    for name in names:
        eager, export, seconds, detail = check(name)
        counts[export] = counts.get(export, 0) + 1
        print(f"{name:24s} {eager:6s} {export:7s} {seconds:7.2f}  {detail}", flush=True)
    runnable = sum(v for k, v in counts.items() if k != "-")
    print(f"exported and validated: {counts['ok']} of {runnable} architectures that run eagerly")


if __name__ == "__main__":
    main(sys.argv[1:])
