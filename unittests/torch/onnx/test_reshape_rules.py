"""onnxscript's MaterializeReshapeShape wrote ``[-1, 0]`` under ``allowzero=1`` for a
version captured at an empty size, which onnxruntime refuses to load
(yobx.torch.onnx.reshape_rules)."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
import torch

from yobx.torch.onnx import to_onnx


class _FlattenThenBranch(torch.nn.Module):
    def forward(self, x):
        y = x.view(x.shape[0], -1) * 2
        if x.shape[1] < 2:
            return y + 1
        return y


@pytest.mark.parametrize("optimize", ["default", "ort"])
def test_a_version_at_an_empty_size_loads_and_runs(optimize):
    """The version at ``n == 0`` reshapes to ``(batch, 0)``: the model loads in
    onnxruntime and matches eager at every size, 0 and 1 included."""
    model = _FlattenThenBranch()
    result = to_onnx(
        model,
        (torch.randn(3, 4),),
        dynamic_shapes={"x": {0: "batch", 1: "n"}},
        optimize=optimize,
    )
    assert any("< 1" in v.when for v in result.versions), [v.when for v in result.versions]
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for shape in [(3, 4), (2, 1), (2, 0), (5, 0), (1, 7)]:
        x = torch.randn(*shape)
        (got,) = session.run(None, {"x": x.numpy()})
        expected = model(x).numpy()
        assert got.shape == expected.shape, shape
        np.testing.assert_allclose(got, expected, atol=1e-6)
