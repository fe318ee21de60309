"""torch's uninteresting files, listed without importing them (``torch_frames``)."""

from __future__ import annotations

import subprocess
import sys

import torch.fx.experimental.symbolic_shapes as symbolic_shapes

from yobx.torch.tracing.isolation.torch_frames import cheap_uninteresting_files, uninteresting_files

_FIRST_TRACE = """
import sys
import torch
import torch.fx.experimental.symbolic_shapes as symbolic_shapes
from yobx.torch.tracing import CustomTracer

class Model(torch.nn.Module):
    def forward(self, x):
        return x[: x.shape[0] // 2] * 2

graph = CustomTracer().trace(
    Model(), concrete_args={"x": torch.ones(6, 3)}, dynamic_shapes={"x": {0: "batch"}}
)
assert len(graph.nodes) > 3
assert symbolic_shapes.uninteresting_files.cache_info().currsize == 0
print(sorted(m for m in ("torch.export._trace", "torch._inductor.sizevars") if m in sys.modules))
"""


def test_same_files_as_torch():
    assert uninteresting_files() == frozenset(symbolic_shapes.uninteresting_files())


def test_first_trace_imports_none_of_them_and_restores_torch():
    result = subprocess.run(
        [sys.executable, "-c", _FIRST_TRACE], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
    original = symbolic_shapes.uninteresting_files
    # torch's set is built in this process: nothing to replace
    with cheap_uninteresting_files():
        assert symbolic_shapes.uninteresting_files is original
    assert symbolic_shapes.uninteresting_files is original
