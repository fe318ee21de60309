"""Behaviour 4: Python idioms on shapes and dtypes trace as they run."""

import math

import pytest
import torch
from torch.export import Dim
from torch.fx.proxy import TraceError

from yobx.torch.tracing import ConstraintViolationError, SpecializationError

from ._helpers import check_trace, trace_module

DYN = {"x": {0: "batch", 1: "seq"}}
OTHERS = [{"x": torch.randn(2, 6, 16)}, {"x": torch.randn(5, 3, 16)}]


class Idioms(torch.nn.Module):
    def forward(self, x):
        n = len(x.shape)
        total = 0
        for d in x.shape:
            total = total + d
        half = x.shape[-1] // 2
        a = x.view(x.shape[0], x.shape[1], half, 2).sum(-1)
        b = x.view(*x.shape[:-1], -1, 8).mean(-1)
        scale = math.sqrt(x.shape[-1])
        full = torch.full(x.shape[:2], 1.0)
        zeros = torch.zeros(x.size(0), 4)
        rng = torch.arange(x.shape[1])
        new = x.new_zeros((x.shape[0], 3))
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        as_int = x.to(int)
        if x.dtype == torch.float32:
            a = a * 2
        if isinstance(x, torch.Tensor) and not isinstance(x, (int, float)):
            b = b + 1
        return (
            a.sum(-1) / scale + full + n + rng.sum() + total * 0,
            b,
            zeros + new.sum(),
            causal,
            as_int,
        )


def test_python_idioms():
    check_trace(Idioms(), {"x": torch.randn(3, 5, 16)}, DYN, other_inputs=OTHERS)


class StaticFirst(torch.nn.Module):
    def forward(self, x):
        parts = [row * i for i, row in enumerate(x)]
        return torch.stack(parts) + len(x)


def test_iterate_over_tensor_with_static_first_dimension():
    check_trace(
        StaticFirst(),
        {"x": torch.randn(3, 5)},
        {"x": {1: "seq"}},
        other_inputs=[{"x": torch.randn(3, 8)}],
    )


def test_len_of_dynamic_first_dimension_is_a_clear_error():
    with pytest.raises(TraceError, match="x.shape"):
        trace_module(StaticFirst(), {"x": torch.randn(3, 5)}, {"x": {0: "batch"}})


class Ranged(torch.nn.Module):
    def forward(self, x):
        # the last of a list: no value a scan gives, the loop unrolls
        return [x[i] * 2 for i in range(x.shape[0])][-1]


def test_python_int_needed_from_dynamic_dimension_is_a_clear_error():
    with pytest.raises(SpecializationError, match="Python int.*batch == 3.*Dim.STATIC") as info:
        trace_module(Ranged(), {"x": torch.randn(3, 5)}, {"x": {0: "batch"}})
    assert info.value.location.startswith(__file__)


def test_python_int_needed_from_an_auto_dimension_makes_it_static():
    with pytest.warns(UserWarning, match="x_dim_0.*becomes static"):
        tracer, _, gm = check_trace(Ranged(), {"x": torch.randn(3, 5)}, {"x": {0: Dim.AUTO}})
    assert [(c.expression, c.kind) for c in tracer.constraints] == [("x_dim_0 == 3", "value")]
    with pytest.raises(ConstraintViolationError, match="x_dim_0 == 3"):
        gm(torch.randn(4, 5))


class NegativeIndex(torch.nn.Module):
    def forward(self, x):
        n = x.shape[-2]
        return x[:, : n - 1] + x[:, 1:], x[..., -(x.shape[-1] // 2) :]


def test_slices_with_symbolic_bounds():
    # x[:, :n-1] + x[:, 1:] broadcasts two sizes seq-1: equal for every seq, including
    # seq == 2 where both are 1, so nothing has to be assumed.
    check_trace(
        NegativeIndex(),
        {"x": torch.randn(3, 5, 16)},
        DYN,
        other_inputs=[*OTHERS, {"x": torch.randn(2, 2, 16)}],
    )


class RealTensorSlicedBySymbols(torch.nn.Module):
    """MPT's pattern: a bias built in forward (a real tensor) sliced with dimensions."""

    def forward(self, x):
        bias = torch.arange(64.0).reshape(1, 8, 8)
        start = max(0, bias.size(1) - x.shape[1])
        return x + bias[:, start:, start:][:, :, : x.shape[1]].sum(-1, keepdim=True)


def test_real_tensor_indexed_with_dimensions():
    dyn = {"x": {0: "batch", 1: torch.export.Dim("seq", max=8)}}
    check_trace(
        RealTensorSlicedBySymbols(),
        {"x": torch.randn(2, 5, 3)},
        dyn,
        other_inputs=[{"x": torch.randn(3, 8, 3)}, {"x": torch.randn(1, 2, 3)}],
    )
    assert "__getitem__" not in vars(torch.Tensor)


class ModuleBuiltInForward(torch.nn.Module):
    """CodeGen's pattern: `nn.Softmax(dim=-1)(x)` has no path in the model."""

    def forward(self, x):
        return torch.nn.Softmax(dim=-1)(x) * torch.nn.ReLU()(x)


def test_module_built_in_forward_is_traced_through():
    _, graph, _ = check_trace(
        ModuleBuiltInForward(),
        {"x": torch.randn(2, 5)},
        {"x": {0: "batch"}},
        other_inputs=[{"x": torch.randn(4, 5)}],
    )
    assert not any(n.op == "call_module" for n in graph.nodes)
