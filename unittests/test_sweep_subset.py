"""A fast subset of ``_scripts/sweep_transformers.py``: architectures nobody here wrote,
each standing for a mechanism the sweep found, built tiny from their configuration
class, captured at one size and compared with eager at another, as the sweep does.

The whole sweep (every class of the installed transformers, side by side with
torch.export and torch.onnx) runs in minutes per architecture family and stays a script.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

pytest.importorskip("transformers")

_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "_scripts", "sweep_transformers.py")

#: (class, path) -> why it is here
SUBSET = {
    ("LlamaForCausalLM", "yobx"): "the reference decoder",
    ("LlamaForCausalLM", "yobx-onnx"): "the reference decoder",
    ("MambaForCausalLM", "yobx"): "a state-space model, which torch.export refuses",
    ("MambaForCausalLM", "yobx-onnx"): "a state-space model, which torch.onnx refuses",
    ("HeliumForCausalLM", "yobx-onnx"): "an epsilon of 1e-8 that onnxscript's tolerant "
    "rules took for 0 (NaN on zero rows)",
    ("ProphetNetForCausalLM", "yobx-onnx"): "a Python number where an aten schema wants a tensor",
    ("DeepseekV4ForCausalLM", "yobx-onnx"): "block-wise windows: checks dividing by a "
    "window count that is 0 outside their version",
}


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("sweep_transformers", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("name", "path"), list(SUBSET))
def test_architecture_is_exact_at_another_size(sweep, name, path):
    model_type = next(t for t, n in sweep.architectures("causal-lm") if n == name)
    model, example, other, dims = sweep.build(model_type, name)
    assert sweep._run_path(path, model, example, other, dims) == "ok", SUBSET[name, path]
