"""``list(range(n))`` over a dynamic size keeps its length symbolic through a reversal,
``len``, ``torch.tensor`` and a loop (``core.range_lists``); anything else makes the list
for real, as the builtin does. torch.export refuses the first model (it fixes ``s``)."""

from __future__ import annotations

import builtins

import pytest
import torch

from yobx.torch.onnx import to_onnx
from yobx.torch.tracing import SpecializationError

from ._helpers import assert_same, trace_module

SIZES = [(2, 7), (3, 4), (1, 2), (2, 1), (4, 12)]


class BackwardPositions(torch.nn.Module):
    """CPM-Ant's mask of left padding, and the other forms of the same list."""

    def forward(self, x, length):
        n = x.size(1)
        backward = torch.tensor(list(range(n - 2))[::-1], device=x.device)
        mask = backward[None, :].repeat(x.size(0), 1) < length[:, None]
        forward = torch.as_tensor(list(range(1, n)), dtype=torch.float32)
        total = torch.zeros_like(x[:, 0])
        for i in list(range(n))[::-1]:
            total = total * 0.5 + x[:, i]
        return mask, forward * 2, len(list(range(n))[:]), total


def _inputs(batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, seq), torch.randint(0, 6, (batch,))


def test_positions_listed_backwards_at_every_size():
    model = BackwardPositions()
    x, length = _inputs(2, 7)
    dims = {"x": {0: "b", 1: "s"}, "length": {0: "b"}}
    _, _, gm = trace_module(model, {"x": x, "length": length}, dims)
    graphs = [m.graph for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]
    assert any(n.target is torch.arange for graph in graphs for n in graph.nodes)
    for batch, seq in SIZES:
        x, length = _inputs(batch, seq)
        assert_same(model(x, length), gm(x, length))


def test_positions_listed_backwards_in_onnx():
    result = to_onnx(
        BackwardPositions(),
        _inputs(2, 7),
        dynamic_shapes=({0: "b", 1: "s"}, {0: "b"}),
        validate=True,
    )
    assert result.validation.ok, result.validation.format()
    assert result.validation.n_checked >= 5


class AppendsToIt(torch.nn.Module):
    def forward(self, x):
        positions = list(range(x.shape[1]))
        assert isinstance(positions, list)
        positions.append(0)
        return x * torch.tensor(positions[1:], dtype=x.dtype)


def test_anything_else_makes_the_list_for_real():
    """``append`` needs the real list: its length is the example's, which a dynamic
    declaration refuses with the user's line, and ``Dim.AUTO`` makes static."""
    model = AppendsToIt()
    x = torch.randn(2, 5)
    with pytest.raises(SpecializationError, match="test_range_lists.py"):
        trace_module(model, {"x": x}, {"x": {0: "b", 1: "s"}})
    auto = torch.export.Dim.AUTO
    with pytest.warns(UserWarning, match="becomes static"):
        _, _, gm = trace_module(model, {"x": x}, {"x": {0: "b", 1: auto}})
    assert_same(model(torch.ones(3, 5)), gm(torch.ones(3, 5)))


class ListsOfOtherThings(torch.nn.Module):
    def forward(self, x):
        sizes: list[int] = list(x.shape)
        empty = list()
        pair = list((1, 2))
        assert type(pair) is builtins.list and isinstance(pair, list)
        return x.reshape(sizes[0], -1) * (len(pair) + len(empty))


def test_list_of_anything_else_is_the_builtin():
    model = ListsOfOtherThings()
    _, _, gm = trace_module(model, {"x": torch.randn(2, 3, 4)}, {"x": {0: "b"}})
    assert_same(model(torch.ones(5, 3, 4)), gm(torch.ones(5, 3, 4)))
    # the names patched into the traced module's globals for the trace are gone
    assert "list" not in globals() and "range" not in globals()
