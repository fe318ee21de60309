"""Control flow (``torch.cond`` -> If, scan -> Scan) and recurrent leaf modules
(``nn.LSTM``/``nn.GRU`` -> ONNX LSTM/GRU) keep their dynamic dimensions."""

import onnx
import pytest
import torch
from torch._higher_order_ops.scan import scan

from unittests.torch.onnx._helpers import export_and_validate, onnx_dims
from yobx.models import tiny_gru, tiny_lstm


@torch.fx.wrap
def _cond(x):
    return torch.cond(x.sum() > 0, lambda x: x.cos(), lambda x: x.sin() + 1, (x,))


@torch.fx.wrap
def _cumulative(init, xs):
    def combine(carry, x):
        carry = carry + x
        return carry, carry * 2

    return scan(combine, init, xs, dim=0)


class CondModel(torch.nn.Module):
    def forward(self, x):
        return _cond(x)


class ScanModel(torch.nn.Module):
    def forward(self, init, xs):
        return _cumulative(init, xs)


def _op_types(model_proto: onnx.ModelProto) -> set[str]:
    types = set()
    for node in model_proto.graph.node:
        types.add(node.op_type)
    for function in model_proto.functions:
        types.update(node.op_type for node in function.node)
    return types


@pytest.mark.parametrize("tracer", ["custom", "fx"])
def test_cond_becomes_if_both_branches(tracer):
    # CustomTracer records a CondCCOp node; symbolic_trace keeps the wrapped call whole
    # and make_fx turns it into the cond higher-order operator; both branches must be
    # right for any batch.
    x = torch.randn(3, 5)
    result = export_and_validate(
        CondModel(), (x,), dynamic_shapes={"x": {0: "batch"}}, tracer=tracer
    )
    assert "If" in _op_types(result.model_proto)
    from yobx.torch.onnx import validate

    report = validate(CondModel(), result, [(x.abs(),), (-x.abs(),), (torch.randn(7, 5),)])
    assert report.ok, report.format()


@pytest.mark.parametrize("tracer", ["custom", "fx"])
def test_scan_becomes_scan_with_dynamic_steps(tracer):
    init, xs = torch.randn(3, 5), torch.randn(7, 3, 5)
    result = export_and_validate(
        ScanModel(),
        (init, xs),
        dynamic_shapes={"init": {0: "batch"}, "xs": {0: "steps", 1: "batch"}},
        tracer=tracer,
    )
    assert "Scan" in _op_types(result.model_proto)
    assert onnx_dims(result.model_proto)["xs"] == ["steps", "batch", 5]


@pytest.mark.parametrize(
    ("factory", "op_type", "tracer"),
    [
        (tiny_lstm, "LSTM", "fx"),
        (tiny_gru, "GRU", "fx"),
        (tiny_lstm, "LSTM", "custom"),
        (tiny_gru, "GRU", "custom"),
    ],
    ids=["lstm-fx", "gru-fx", "lstm-custom", "gru-custom"],
)
def test_rnn_leaf_becomes_onnx_operator(factory, op_type, tracer):
    model, args, kwargs, dynamic_shapes = factory()
    result = export_and_validate(model, args, kwargs, dynamic_shapes=dynamic_shapes, tracer=tracer)
    assert op_type in _op_types(result.model_proto)
    dims = onnx_dims(result.model_proto)
    assert dims["tokens"] == ["batch", "seq"]
    assert dims["output"] == ["batch", "seq", 4]


class _InnerCond(torch.nn.Module):
    def forward(self, x, y):
        return torch.cond(x.sum() > 1, lambda x, y: x * y, lambda x, y: x + y, [x, y])


class NestedCondModel(torch.nn.Module):
    """A cond inside each branch of a cond, one through a submodule (the subgraph
    ``true_graph_0.false_graph_0`` once exported lost its values: KeyError 'val')."""

    def __init__(self):
        super().__init__()
        self.inner = _InnerCond()

    def forward(self, x, y):
        def true_fn(x, y):
            return self.inner(x, y)

        def false_fn(x, y):
            return torch.cond(x.mean() < -0.5, lambda x, y: x - y, lambda x, y: x / 2, [x, y])

        return torch.cond(x.sum() > 0, true_fn, false_fn, [x, y])


def test_nested_cond_exports_every_branch():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    dims = {"x": {0: "batch"}, "y": {0: "batch"}}
    result = export_and_validate(NestedCondModel(), (x, y), dynamic_shapes=dims)
    from yobx.torch.onnx import validate

    # each of the four leaves of the two levels of branches
    inputs = [
        (x.abs() + 1, y),
        (x.abs() / 100, y),
        (-x.abs() - 1, y),
        (-x.abs() / 100, torch.randn(5, 4)),
    ]
    report = validate(NestedCondModel(), result, inputs)
    assert report.ok, report.format()


_DEFINED_ON_FIRST_USE = """
import torch
import yobx.integrations.transformers  # noqa: F401 (what an export for generation imports)
from yobx.torch.ops import checks, rnn
from yobx.torch.onnx import to_onnx
from yobx.models import tiny_lstm

assert not rnn.defined() and not checks.defined()
# the registry is built by a first export without any recurrent module
x = torch.randn(2, 3)
to_onnx(torch.nn.Linear(3, 4), (x,), dynamic_shapes=({0: "batch"},))
assert not rnn.defined()
model, args, kwargs, shapes = tiny_lstm()
result = to_onnx(model, args, kwargs, dynamic_shapes=shapes, validate=True)
assert result.validation.ok, result.validation.format()
assert "LSTM" in {node.op_type for node in result.model_proto.graph.node}
print("ok")
"""


def test_the_recurrent_operators_are_defined_and_translated_when_first_needed():
    """Defining a custom operator costs a first export 0.1 s (torch looks up the caller's
    source): yobx defines its own when a model needs them, after the registry of
    translations was built, which then learns their translations."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _DEFINED_ON_FIRST_USE], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
