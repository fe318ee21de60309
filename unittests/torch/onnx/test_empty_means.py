"""Means over axes that may be empty are NaN in onnxruntime as in eager
(yobx.torch.onnx.empty_means), a mean over static axes stays one ``ReduceMean``, and
the validation counts NaN in both as equal."""

import numpy as np
import onnxruntime
import pytest
import torch

from unittests.torch.onnx._helpers import export_and_validate
from yobx.torch.onnx.validation import validate


class PooledTail(torch.nn.Module):
    """``adaptive_avg_pool1d`` of ``y[..., 2:]``: a mean of no element where the last
    axis is 2 (fuzz_onnx seed 8971)."""

    def forward(self, y):
        return torch.nn.functional.adaptive_avg_pool1d(y[..., 2:], 1)


class MeanOfRows(torch.nn.Module):
    def forward(self, x):
        return x.mean(0), x.mean(), x.mean((0, -1), keepdim=True, dtype=torch.float64)


class SpreadOfRows(torch.nn.Module):
    """Variances and deviations over the rows (torch_lib's gave ``-0`` over none)."""

    def forward(self, x):
        var_mean = torch.var_mean(x, 0, correction=0)
        std_mean = torch.std_mean(x, 0, keepdim=True)
        return x.var(0), x.std(0, keepdim=True), x.var(), *var_mean, *std_mean


class NormedRows(torch.nn.Module):
    """A mean over the static last axis (an RMS normalization), and a variance."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) + x.var(-1, keepdim=True)


def _op_types(result) -> list[str]:
    return [node.op_type for node in result.model_proto.graph.node]


@pytest.mark.parametrize(
    "model, shape, dims, empty",
    [
        (PooledTail, (7, 6, 7), {0: "width", 1: "batch", 2: "width"}, (2, 5, 2)),
        (MeanOfRows, (5, 3), {0: "rows"}, (0, 3)),
        (SpreadOfRows, (5, 3), {0: "rows"}, (0, 3)),
    ],
)
def test_a_mean_of_no_element_is_nan_as_in_eager(model, shape, dims, empty):
    # onnxruntime's ReduceMean of no element is 0, torch's mean is 0 / 0: the exported
    # model returned zeros where eager returns NaN
    model = model()
    result = export_and_validate(model, (torch.randn(*shape),), dynamic_shapes=(dims,))
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    x = torch.randn(*empty)
    expected = model(x)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    for e, g in zip(expected, got):
        assert torch.isnan(e).all() and e.numel() > 0
        assert g.shape == tuple(e.shape) and g.dtype == e.numpy().dtype
        assert np.isnan(g).all()
    report = validate(model, result, [((x,), {})])
    assert report.ok, report.reasons()


def test_a_mean_over_a_static_axis_stays_torch_lib_s_reduce_mean():
    result = export_and_validate(
        NormedRows(), (torch.randn(2, 5, 8),), dynamic_shapes=({0: "batch", 1: "seq"},)
    )
    assert "ReduceMean" in _op_types(result)
    assert "ReduceSum" not in _op_types(result)
