"""Memoized symbolic arithmetic: shared results inside a trace, nothing left patched."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.sym_node import SymNode
from torch.fx.proxy import TraceError

from yobx.torch.tracing import CustomTracer
from yobx.torch.tracing.symbolic import symbolic_memo
from yobx.torch.tracing.symbolic.symbolic import SymbolicDimensions
from yobx.torch.tracing.symbolic.symbolic_memo import memoized_symbolic_arithmetic


def _originals():
    return {name: SymNode.__dict__[name] for name in ("_mul", "_add", "_eq", "_sym_max")}


@pytest.fixture
def counted_mul(monkeypatch):
    """An empty process-wide memo and a count of the multiplications torch computes."""
    monkeypatch.setattr(symbolic_memo, "_RESULTS", {})
    calls = []
    original = SymNode.__dict__["_mul"]

    def counting(self, other):
        calls.append(1)
        return original(self, other)

    monkeypatch.setattr(SymNode, "_mul", counting)
    return calls


def test_same_operation_is_computed_once(counted_mul):
    calls = counted_mul
    counting = SymNode.__dict__["_mul"]
    dims = SymbolicDimensions()
    seq = dims.dimension("seq", 5)
    with memoized_symbolic_arithmetic():
        first, second = seq * 8, seq * 8
        third = seq * 4
    assert len(calls) == 2
    # equal values, distinct objects: make_fx tracks SymNode objects
    assert first.node is not second.node
    assert first.node.expr == second.node.expr
    assert str(third) != str(first)
    assert SymNode.__dict__["_mul"] is counting


def test_memo_is_removed_after_a_trace_and_after_a_failure():
    before = _originals()

    class Model(torch.nn.Module):
        def forward(self, x):
            if x.shape[0] > 4:  # not provable: a named Dim refuses, the trace raises
                return x * 2
            return x

    x = torch.rand(3, 4)
    CustomTracer().trace(torch.nn.Linear(4, 2), concrete_args={"input": x})
    assert _originals() == before
    with pytest.raises(TraceError):
        CustomTracer().trace(
            Model(), concrete_args={"x": x}, dynamic_shapes={"x": {0: torch.export.Dim("b")}}
        )
    assert _originals() == before


def test_results_serve_the_next_trace_with_the_same_example_sizes(counted_mul):
    # a ShapeEnv names its symbols after their sources: the next trace asks again
    for _ in range(2):
        dims = SymbolicDimensions()
        seq = dims.dimension("seq", 5)
        with memoized_symbolic_arithmetic():
            product = seq * 8
        assert product.node.shape_env is dims.shape_env
        assert product.node.hint == 40
    assert len(counted_mul) == 1


def test_another_example_size_is_computed_again(counted_mul):
    # the hint is part of the result: an example of another size has its own
    hints = []
    for size in (5, 7):
        dims = SymbolicDimensions()
        seq = dims.dimension("seq", size)
        with memoized_symbolic_arithmetic():
            hints.append((seq * 8).node.hint)
    assert hints == [40, 56]
    assert len(counted_mul) == 2


def test_traces_at_two_sizes_give_the_graphs_of_each_size():
    class Model(torch.nn.Module):
        def forward(self, x):
            return x.reshape(x.shape[0] * x.shape[1], -1) * 2

    for batch in (3, 5, 3):
        x = torch.rand(batch, 4, 6)
        tracer = CustomTracer()
        graph = tracer.trace(Model(), concrete_args={"x": x}, dynamic_shapes={"x": {0: "b"}})
        gm = torch.fx.GraphModule(tracer.traced_model, graph)
        output = next(n for n in graph.nodes if n.op == "output").args[0]
        assert output.meta["val"].shape[0].node.hint == batch * 4
        for other in (2, 7):
            y = torch.rand(other, 4, 6)
            torch.testing.assert_close(gm(y), Model()(y))
