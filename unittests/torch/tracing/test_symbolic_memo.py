"""Memoized symbolic arithmetic: shared results inside a trace, nothing left patched."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.sym_node import SymNode
from torch.fx.proxy import TraceError

from yobx.torch.tracing import CustomTracer
from yobx.torch.tracing.symbolic import SymbolicDimensions
from yobx.torch.tracing.symbolic_memo import memoized_symbolic_arithmetic


def _originals():
    return {name: SymNode.__dict__[name] for name in ("_mul", "_add", "_eq", "_sym_max")}


def test_same_operation_is_computed_once(monkeypatch):
    dims = SymbolicDimensions()
    seq = dims.dimension("seq", 5)
    calls = []
    original = SymNode.__dict__["_mul"]

    def counting(self, other):
        calls.append(1)
        return original(self, other)

    monkeypatch.setattr(SymNode, "_mul", counting)
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
