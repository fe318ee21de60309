"""Aten-level fake values from shape rules while lowering: exact, scoped, checked."""

from __future__ import annotations

import onnxruntime
import pytest
import torch

from unittests.torch.onnx._helpers import export_and_validate
from yobx.torch.onnx.aten_fake_rules import RULES, aten_fake_rules
from yobx.torch.tracing import shape_rules
from yobx.torch.tracing.shape_rules._base import TensorFactory
from yobx.torch.tracing.symbolic.symbolic import SymbolicDimensions

aten = torch.ops.aten


@pytest.fixture(scope="module")
def env():
    dims = SymbolicDimensions()
    b, s = dims.dimension("batch", 3), dims.dimension("seq", 5)
    with dims.fake_mode:
        x = torch.empty(b, s, 32)
        values = {
            "x": x,
            "q": x.view(b, s, 4, 8).transpose(1, 2),
            "mask": torch.empty(b, 1, s, s, dtype=torch.bool),
            "scores": torch.empty(b, 4, s, s),
            "ids": torch.empty(b, s, dtype=torch.int64),
        }
    values["w"] = dims.from_real(torch.empty(16, 32))
    values["table"] = dims.from_real(torch.empty(10, 32))
    values["b"], values["s"] = b, s
    return dims, values


CALLS = [
    (aten.add.Tensor, ("x", "x"), {}),
    (aten.add.Tensor, ("x", 1.0), {"alpha": 1}),
    (aten.mul.Tensor, ("q", "q")),
    (aten.neg.default, ("q",)),
    (aten.pow.Tensor_Scalar, ("x", 2)),
    (aten.gelu.default, ("x",), {"approximate": "tanh"}),
    (aten.lt.Scalar, ("x", 0.0)),
    (aten.where.self, ("mask", "scores", "scores")),
    (aten.mean.dim, ("x", [-1], True)),
    (aten.cat.default, (["x", "x"], -1)),
    (aten.linear.default, ("x", "w")),
    (aten.matmul.default, ("q", "q")),
    (aten.layer_norm.default, ("x", [32], None, None, 1e-5, True)),
    (aten.embedding.default, ("table", "ids")),
    (aten.view.default, ("x", ["b", "s", 4, 8])),
    (aten.transpose.int, ("x", 1, 2)),
    (aten.permute.default, ("q", [0, 2, 1, 3])),
    (aten.unsqueeze.default, ("x", 1)),
    (aten.expand.default, ("mask", ["b", 4, "s", "s"])),
    (aten.slice.Tensor, ("x", 2, 0, 16)),
    (aten.slice.Tensor, ("x", -1, 8, 9223372036854775807)),
    (aten.select.int, ("x", 1, 0)),
    (aten.triu.default, ("mask", 1)),
]


def _resolve(value, values):
    if isinstance(value, str):
        return values[value]
    if isinstance(value, list):
        return [_resolve(v, values) for v in value]
    return value


@pytest.mark.parametrize("call", CALLS, ids=lambda c: f"{c[0]}-{c[1][1:]}")
def test_aten_rule_matches_torch(env, call):
    dims, values = env
    op, names, kwargs = (*call, {})[:3]
    if op is aten.matmul.default:
        names = ("q", "q_t")
        with dims.fake_mode:
            values["q_t"] = values["q"].transpose(-1, -2)
    args = [_resolve(n, values) for n in names]
    # The rule applies (no fallback to torch) and gives torch's value. It is called
    # directly: through the fake mode, a cache hit of the first call would answer.
    with torch.no_grad():
        value = RULES[op](TensorFactory(dims.fake_mode), tuple(args), dict(kwargs))
        with dims.fake_mode:
            expected = op(*args, **kwargs)
    shape_rules.compare(value, expected, list(torch.utils._pytree.tree_leaves(args)), str(op))


def test_dispatch_goes_through_the_rules_and_is_restored(env, monkeypatch):
    dims, values = env
    calls = []
    rule = RULES[aten.neg.default]
    monkeypatch.setitem(RULES, aten.neg.default, lambda *a: calls.append(1) or rule(*a))
    dims.fake_mode.cache_enabled = False
    try:
        with torch.no_grad(), dims.fake_mode, aten_fake_rules(dims.fake_mode):
            aten.neg.default(values["q"])
    finally:
        dims.fake_mode.cache_enabled = True
    assert calls == [1]
    assert "_dispatch_impl" not in dims.fake_mode.__dict__


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.proj(self.norm(x))
        return (h @ h.transpose(-1, -2)).softmax(-1) @ h[..., :8]


def test_export_compares_every_rule(monkeypatch):
    compared = []
    original = shape_rules.compare

    def counting(value, expected, inputs, what, prove=None):
        compared.append(what)
        return original(value, expected, inputs, what, prove)

    monkeypatch.setenv("YOBX_CHECK_SHAPE_RULES", "1")
    monkeypatch.setattr(shape_rules, "compare", counting)
    inputs = (torch.randn(2, 5, 16),)
    # the make_fx path, where the aten operators go through the fake mode (the direct
    # lowering checks its own values: test_direct_lowering.py)
    export_and_validate(
        Block().eval(), inputs, dynamic_shapes=({0: "batch", 1: "seq"},), direct_lowering=False
    )
    lowered = {what for what in compared if what.startswith("aten.")}
    assert {"aten.linear.default", "aten.layer_norm.default", "aten.slice.Tensor"} <= lowered


class WriteTheFirstColumns(torch.nn.Module):
    def forward(self, x, y):
        x = x * 1
        x[:, : y.shape[1]] = y
        return x


def test_a_write_into_a_slice_decides_nothing_about_its_density():
    """``x[:, :4] = y`` is ``aten.copy`` of the slice: torch's fake kernel asked whether
    the slice is dense (``seq != 4``), and the lowering adopted it as a constraint,
    refusing the one size where the write covers ``x``; the rule gives the copy the
    slice's strides without asking."""
    model = WriteTheFirstColumns()
    result = export_and_validate(
        model, (torch.randn(3, 6), torch.randn(3, 4)), dynamic_shapes=({1: "seq"}, None)
    )
    # what eager needs too (4 columns to write into), and nothing of their density
    assert [c.expression for c in result.constraints] == ["seq >= 4"]
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for seq in (4, 5, 9):
        x, y = torch.randn(3, seq), torch.randn(3, 4)
        (got,) = session.run(None, {"x": x.numpy(), "y": y.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), model(x, y))
