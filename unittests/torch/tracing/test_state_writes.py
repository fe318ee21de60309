"""Writes into buffers reached through plain Python objects (transformers' static
cache layers) are recorded, and reads after them read the graph's value."""

import torch

from yobx.torch.onnx import to_onnx
from yobx.torch.tracing.core.state_writes import writes_in_place

from ._helpers import assert_same, trace_module


class Layer:
    """A plain object holding tensors, as a static cache layer does."""

    def __init__(self):
        self.length = torch.tensor(0)
        self.keys = torch.zeros(1, 8, 4)


class StaticCacheLike(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = Layer()
        self.register_buffer("length", self.layer.length, persistent=False)
        self.register_buffer("keys", self.layer.keys, persistent=False)

    def forward(self, x, position):
        layer = self.layer
        layer.length.copy_(position[0])
        positions = torch.arange(x.shape[1]) + layer.length  # read after the write
        layer.keys.index_copy_(1, positions, x)
        layer.length.add_(x.shape[1])  # constant arguments only
        return layer.keys.sum(1) + layer.length


def _fresh_state(model):
    model.layer.length.zero_()
    model.layer.keys.zero_()


def test_writes_through_plain_objects_are_in_the_graph():
    model = StaticCacheLike()
    example = {"x": torch.randn(1, 2, 4), "position": torch.tensor([0])}
    _, graph, gm = trace_module(model, example)
    # tracing wrote nothing into the model
    assert int(model.length) == 0 and not model.keys.any()
    targets = [n.target for n in graph.nodes if n.op == "get_attr"]
    assert "length" in targets and "keys" in targets
    for position in (0, 3):
        x = torch.randn(1, 2, 4)
        _fresh_state(model)
        expected = model(x.clone(), torch.tensor([position]))
        expected_state = model.length.clone(), model.keys.clone()
        _fresh_state(model)
        got = gm(x.clone(), torch.tensor([position]))
        assert_same(expected, got)
        assert_same(expected_state, (model.length, model.keys))


def test_writes_through_plain_objects_export_to_onnx():
    model = StaticCacheLike()
    result = to_onnx(model, (torch.randn(1, 2, 4), torch.tensor([2])), validate=True)
    assert result.validation.ok, result.validation.format()


def test_in_place_names():
    assert writes_in_place(torch.Tensor.add_, {})
    assert writes_in_place(torch.Tensor.__setitem__, {})
    assert writes_in_place(torch.Tensor.__iadd__, {})
    assert writes_in_place(torch.add, {"out": None})
    assert not writes_in_place(torch.Tensor.add, {})
    assert not writes_in_place(torch.Tensor.__index__, {})
