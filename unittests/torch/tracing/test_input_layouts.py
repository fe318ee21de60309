"""Inputs whose layout a traced graph depends on (``input_layouts``): a non-contiguous
example is refused, a non-contiguous input at run time raises, and graphs that do not
depend on layouts take any."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
import torch

from yobx.torch.onnx import to_onnx
from yobx.torch.tracing import CustomTracer, TracingError
from yobx.torch.tracing.constraints.input_layouts import InputLayoutError, check_contiguous

DYNAMIC = {"x": {0: "a", 1: "b"}}


class WritesThroughContiguous(torch.nn.Module):
    def forward(self, x):
        y = x.contiguous()  # x itself when contiguous, a copy otherwise
        y[:, :1] = 0
        return x + 1


class WritesThroughReshape(torch.nn.Module):
    def forward(self, x):
        y = x.reshape(-1)  # a view when contiguous, a copy otherwise
        y.mul_(2)
        return x * 1


class ReadsStrides(torch.nn.Module):
    def forward(self, x):
        return x.as_strided(x.shape, (x.stride()[0], x.stride()[1])) + 0


class ReadsStridesOfAResult(torch.nn.Module):
    def forward(self, x):
        y = x * 2  # laid out as x
        return torch.tensor(y.stride()[1], dtype=torch.float32) + y.sum()


class LayoutFree(torch.nn.Module):
    def forward(self, x):
        return (x.t() @ x).relu() + x.sum(0)


def _transposed(rows: int, columns: int) -> torch.Tensor:
    return torch.arange(float(rows * columns)).reshape(columns, rows).t()


def _trace(model, example):
    tracer = CustomTracer()
    graph = tracer.trace(model, concrete_args={"x": example}, dynamic_shapes=DYNAMIC)
    return graph, torch.fx.GraphModule(tracer.traced_model, graph)


@pytest.mark.parametrize(
    "model", [WritesThroughContiguous, WritesThroughReshape, ReadsStrides, ReadsStridesOfAResult]
)
def test_non_contiguous_example_of_a_layout_dependent_input_is_refused(model):
    # the trace takes every input as contiguous: with this example, the graph would
    # compute for another layout than eager's (it wrote into x, or baked stride 1)
    with pytest.raises(TracingError) as info:
        _trace(model(), _transposed(3, 5))
    message = str(info.value)
    assert "test_input_layouts.py:" in message and "x.contiguous()" in message, message


@pytest.mark.parametrize("model", [WritesThroughContiguous, WritesThroughReshape, ReadsStrides])
def test_layout_dependent_graph_matches_eager_and_checks_its_input(model):
    graph, gm = _trace(model(), torch.randn(3, 5))
    assert any(n.target is check_contiguous for n in graph.nodes)
    for shape in ((3, 5), (4, 2), (6, 7)):
        x = torch.randn(*shape)
        x_eager, x_graph = x.clone(), x.clone()
        torch.testing.assert_close(gm(x_graph), model()(x_eager))
        torch.testing.assert_close(x_graph, x_eager)  # what the model wrote into x
    with pytest.raises(InputLayoutError, match="not contiguous"):
        gm(_transposed(3, 5))


def test_layout_free_graph_takes_any_layout():
    x = _transposed(3, 5)
    graph, gm = _trace(LayoutFree(), x)
    assert not any(n.target is check_contiguous for n in graph.nodes)
    for value in (x, _transposed(4, 2), torch.randn(6, 7)):
        torch.testing.assert_close(gm(value), LayoutFree()(value))


class WritesDirectly(torch.nn.Module):
    def forward(self, x):
        x.add_(1)  # into x whatever its layout
        x.t()[0].mul_(2)  # through a view: the same
        return x * 2


def test_direct_writes_into_an_input_take_any_layout():
    x = _transposed(3, 5)
    graph, gm = _trace(WritesDirectly(), x.clone())
    assert not any(n.target is check_contiguous for n in graph.nodes)
    for value in (x, _transposed(4, 2), torch.randn(6, 7)):
        x_eager, x_graph = value.clone(), value.clone()
        torch.testing.assert_close(gm(x_graph), WritesDirectly()(x_eager))
        torch.testing.assert_close(x_graph, x_eager)


def test_onnx_of_a_layout_dependent_graph_matches_eager():
    # ONNX inputs are always dense: the check goes, the model computes as eager
    model = WritesThroughReshape()
    x = torch.randn(3, 5)
    result = to_onnx(model, (x,), dynamic_shapes=DYNAMIC)
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for shape in ((3, 5), (4, 2)):
        x = torch.randn(*shape)
        expected = model(x.clone())
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-6)
