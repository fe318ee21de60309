"""Dynamic dimensions get the range their declaration gives, as torch computes it."""

from __future__ import annotations

import math

import pytest
import sympy
import torch
from torch.export import Dim
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.utils._sympy.numbers import int_oo

from yobx.torch.tracing import CustomTracer
from yobx.torch.tracing.constraints.constraints import ConstraintViolationError
from yobx.torch.tracing.symbolic.symbolic import DimensionSource, SymbolicDimensions


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


def test_a_question_torchs_bounds_cannot_answer_is_decided_from_the_sizes():
    """torch's bounds of half a size, written ``(q - (q + 1) % 2 + 1)/2`` (a version of
    Swin's padded patch merging), have fractional ends, and the floor division of such
    bounds raises ``TypeError: cannot determine truth value of Relational`` inside
    torch: a capture of that side of the decision failed. The question now has no
    static answer and is decided from the sizes as any other."""
    from torch.utils._sympy.functions import FloorDiv, Mod

    dims = SymbolicDimensions()
    a = dims.dimension("a", 6).node.expr
    n = dims.dimension("n", 16).node.expr
    half = FloorDiv(n, 2)
    question = sympy.Gt(FloorDiv(a, (half - Mod(half + 1, 2) + 1) / 2), 0)
    with pytest.raises(TypeError, match="truth value"):
        dims.shape_env._maybe_evaluate_static(question)  # torch's own, unanswered
    dims.consult_prover()
    assert dims.shape_env._maybe_evaluate_static(question) is None
    assert dims.shape_env._maybe_evaluate_static(question) is None  # asked again
    # decided from the sizes (6 // 4 = 1 > 0), with a guard that says so
    assert dims.shape_env.evaluate_expr(question) == sympy.true
    assert any(guard.expr == question for guard in dims.shape_env.guards)


class _VersionsWithAConstant(torch.nn.Module):
    """A branch on the batch (two versions) and an item assignment at listed columns:
    removing the in-place write makes an index tensor, a constant of the trace's fake
    mode (its converter keeps a ``StorageWeakRef`` to it)."""

    def forward(self, x):
        y = x.clone()
        y[:, [0, 2]] = 0
        if x.shape[0] > 3:
            return y * 2
        return y + 1


def test_a_deep_copy_of_a_traced_module_keeps_its_dimensions(monkeypatch):
    import copy

    import torch.multiprocessing.reductions as reductions

    from yobx.torch.tracing.constraints.versions import DIMENSIONS_KEY

    model = _VersionsWithAConstant()
    tracer = CustomTracer()
    graph = tracer.trace(
        model,
        concrete_args={"x": torch.randn(5, 4)},
        dynamic_shapes={"x": {0: "batch"}},
        remove_inplace=True,
    )
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    versions = {n: m for n, m in gm.named_modules() if DIMENSIONS_KEY in getattr(m, "meta", {})}
    assert len(versions) == 2, list(versions)
    mapping = versions["version_1"].meta[DIMENSIONS_KEY].fake_mode.fake_tensor_converter
    assert mapping.constant_storage_mapping, "the trace should keep a constant's weak ref"

    def copied(self, protocol):
        # two StorageWeakRef objects with the same reference each release it once
        raise AssertionError("a StorageWeakRef of the trace's fake mode was copied")

    monkeypatch.setattr(reductions.StorageWeakRef, "__reduce_ex__", copied, raising=False)
    clone = copy.deepcopy(gm)
    for name, module in versions.items():
        assert clone.get_submodule(name).meta[DIMENSIONS_KEY] is module.meta[DIMENSIONS_KEY]
    for rows in (2, 3, 5, 8):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(clone(x), model(x))
