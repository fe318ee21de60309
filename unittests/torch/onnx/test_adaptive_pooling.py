"""Adaptive pooling over dynamic heights and widths: exact at every size, no constraint
(torch's decompositions ask whether the size is a multiple of the output's, which made
the model refuse the other sizes; torch.onnx keeps the example's kernel, silently wrong
at other sizes)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from yobx.torch.onnx import to_onnx

SIZES = [(6, 4), (7, 5), (9, 11), (3, 2), (4, 3), (13, 17), (24, 24)]


class _AvgPool(torch.nn.Module):
    def forward(self, x):
        return F.adaptive_avg_pool2d(x, (3, 2))


class _AvgPoolModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool2d((7, 7))

    def forward(self, x):
        return self.pool(x).flatten(1)


class _MaxPoolWithIndices(torch.nn.Module):
    def forward(self, x):
        values, indices = F.adaptive_max_pool2d(x, (3, 2), return_indices=True)
        return values, indices


class _AvgPool1d(torch.nn.Module):
    def forward(self, x):
        return F.adaptive_avg_pool1d(x, 5)


def _run(result, x: torch.Tensor) -> list[np.ndarray]:
    session = ort.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"x": x.numpy()})


def _expected(model, x) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(x)
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.parametrize("model", [_AvgPool(), _AvgPoolModule(), _MaxPoolWithIndices()])
def test_adaptive_pooling_2d_is_exact_at_every_size(model):
    shapes = {"x": {0: "batch", 2: "height", 3: "width"}}
    result = to_onnx(model, (torch.randn(2, 3, 6, 4),), dynamic_shapes=shapes)
    assert not result.model_proto.metadata_props or all(
        p.key != "yobx.constraints" for p in result.model_proto.metadata_props
    ), "the export adopted a constraint"
    for batch, (height, width) in zip([1, 2, 3] * 3, SIZES):
        x = torch.randn(batch, 3, height, width)
        for got, expected in zip(_run(result, x), _expected(model, x)):
            assert got.shape == expected.shape, (height, width)
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_adaptive_avg_pool_1d_over_a_dynamic_length():
    model = _AvgPool1d()
    result = to_onnx(model, (torch.randn(2, 4, 10),), dynamic_shapes={"x": {2: "length"}})
    for length in (10, 11, 5, 7, 23, 1):
        x = torch.randn(2, 4, length)
        np.testing.assert_allclose(_run(result, x)[0], _expected(model, x)[0], rtol=1e-5, atol=1e-6)


def test_static_sizes_keep_torch_decomposition():
    # the example's sizes only: avg_pool2d, as torch decomposes it, and no gather
    result = to_onnx(_AvgPool(), (torch.randn(2, 3, 6, 4),))
    ops = {node.op_type for node in result.model_proto.graph.node}
    assert "AveragePool" in ops and "GatherND" not in ops and "Gather" not in ops, ops
    x = torch.randn(2, 3, 6, 4)
    # averages of 4 floats: one near zero differs from torch by an ulp of its terms
    np.testing.assert_allclose(
        _run(result, x)[0], _expected(_AvgPool(), x)[0], rtol=1e-6, atol=1e-6
    )
