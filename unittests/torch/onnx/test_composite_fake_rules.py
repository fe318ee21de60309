"""Fast fake values of linear/matmul/layer_norm while lowering: exact, then removed."""

from __future__ import annotations

import torch
from torch._subclasses import fake_impls

from unittests.torch.onnx._helpers import export_and_validate
from yobx.torch.onnx.composite_fake_rules import composite_fake_rules
from yobx.torch.tracing import shape_rules

OPS = (torch.ops.aten.linear.default, torch.ops.aten.matmul.default)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.proj(self.norm(x))
        return (h @ h.transpose(-1, -2)).softmax(-1) @ h


def test_rules_are_compared_and_removed(monkeypatch):
    before = {op: fake_impls._is_op_registered_to_fake_rule(op) for op in OPS}
    compared = []
    original = shape_rules.compare

    def counting(value, expected, inputs, what):
        compared.append(what)
        return original(value, expected, inputs, what)

    monkeypatch.setenv("YOBX_CHECK_SHAPE_RULES", "1")
    monkeypatch.setattr(shape_rules, "compare", counting)
    inputs = (torch.randn(2, 5, 16),)
    export_and_validate(Block().eval(), inputs, dynamic_shapes=({0: "batch", 1: "seq"},))
    assert {"aten.linear.default", "aten.matmul.default", "aten.layer_norm.default"} <= set(
        compared
    )
    assert {op: fake_impls._is_op_registered_to_fake_rule(op) for op in OPS} == before


def test_registration_is_scoped():
    op = torch.ops.aten.linear.default
    assert not fake_impls._is_op_registered_to_fake_rule(op)
    with composite_fake_rules([op]):
        assert fake_impls._is_op_registered_to_fake_rule(op)
    assert not fake_impls._is_op_registered_to_fake_rule(op)
