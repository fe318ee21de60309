"""Dynamic dimensions get the range their declaration gives, as torch computes it."""

from __future__ import annotations

import math

import pytest
import torch
from torch.export import Dim
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.utils._sympy.numbers import int_oo

from yobx.torch.tracing import CustomTracer
from yobx.torch.tracing.constraints import ConstraintViolationError
from yobx.torch.tracing.symbolic import DimensionSource, SymbolicDimensions


def _torchs_range(hint: int, low: int, high: int | None):
    """The range of a size symbol constrained by torch's own intersection."""
    env = ShapeEnv(specialize_zero_one=False, duck_shape=False)
    symbol = env.create_symbol(hint, source=DimensionSource("dim"), dynamic_dim=DimDynamic.DYNAMIC)
    env.constrain_symbol_range(
        symbol, compiler_min=low, compiler_max=int_oo if high is None else high
    )
    return env.var_to_range[symbol]


@pytest.mark.parametrize(
    "hint,low,high", [(3, None, None), (3, 0, None), (1, 1, 10), (5, 3, 7), (4, 2, 2**40)]
)
def test_declared_range_is_torchs_intersection(hint, low, high):
    dims = SymbolicDimensions()
    size = dims.dimension("n", hint, low, high)
    expected = _torchs_range(hint, 2 if low is None else low, high)
    assert dims.shape_env.var_to_range[size.node.expr] == expected
    lower, upper = dims.range_of(size.node.expr)
    assert (lower, upper) == (expected.lower, math.inf if high is None else high)


def test_traced_graph_checks_the_declared_range():
    class Model(torch.nn.Module):
        def forward(self, x):
            return x.sum(0) * x.shape[0]

    batch = Dim("batch", min=3, max=7)
    tracer = CustomTracer()
    graph = tracer.trace(
        Model(), concrete_args={"x": torch.rand(5, 2)}, dynamic_shapes={"x": {0: batch}}
    )
    assert tracer.range_constraints["batch"] == (3, 7)
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    for size in (3, 6, 7):
        x = torch.rand(size, 2)
        torch.testing.assert_close(gm(x), Model()(x))
    for size in (2, 8):
        with pytest.raises(ConstraintViolationError):
            gm(torch.rand(size, 2))
