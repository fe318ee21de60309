"""What yobx relies on from torch.onnx's private exporter internals, the dimension
names, output names and error messages."""

import pytest
import sympy
import torch
import torch.utils._pytree as pytree

from yobx.torch.onnx import OnnxExportError, UnsupportedOperatorError, to_onnx
from yobx.torch.onnx import _torch_onnx_internals as internals
from yobx.torch.onnx.capture import output_names
from yobx.torch.onnx.dimensions import DimensionRenamer


def test_registry_has_what_we_dispatch_to():
    registry = internals.onnx_registry(18)
    for op in (
        torch.ops.aten.linear.default,
        torch.ops.aten.scaled_dot_product_attention.default,
        torch.ops.aten.layer_norm.default,
        torch.ops.higher_order.cond,
        torch.ops.higher_order.scan,
        torch.ops.yobx.lstm.default,
        torch.ops.yobx.gru.default,
    ):
        assert registry.is_registered(op), op
    table = internals.decomposition_table(18)
    # Decomposed only when torch_lib lacks them.
    assert torch.ops.aten.addmm.default not in table


def test_composite_ops_preserved_and_restored():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        return torch.nn.functional.linear(x, w)

    x, w = torch.randn(2, 3), torch.randn(4, 3)
    with internals.preserve_translatable_composite_ops(18):
        graph = make_fx(f)(x, w).graph
    assert any(n.target is torch.ops.aten.linear.default for n in graph.nodes)
    # Outside the context, make_fx decomposes as usual: the patch was undone.
    graph = make_fx(f)(x, w).graph
    assert not any(n.target is torch.ops.aten.linear.default for n in graph.nodes)


def test_dimension_renamer_simplifies_with_user_names():
    renamer = DimensionRenamer({"s1": "seq", "s2": "past"})
    assert renamer.rename("s1 + s2") in ("past+seq", "seq+past")
    assert renamer.rename("2*s1") == "2*seq"
    assert renamer.rename("s1 + s1") == "2*seq"
    assert renamer.rename("s9") == "s9"
    assert renamer.expression(sympy.Symbol("s2") + 1) == "past+1"


def test_output_names_readable():
    spec = pytree.tree_structure({"logits": 0, "past": [(1, 2)]})
    assert output_names(spec, 3) == ["logits", "past_0_0", "past_0_1"]
    assert output_names(pytree.tree_structure((0, 1)), 2) == ["output_0", "output_1"]
    assert output_names(pytree.tree_structure(0), 1) == ["output"]


def test_unsupported_operator_names_node_and_source_line():
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.special.zeta(x, x + 1)

    with pytest.raises(UnsupportedOperatorError) as info:
        to_onnx(Model(), (torch.rand(3, 4) + 1,), dynamic_shapes={"x": {0: "batch"}})
    assert isinstance(info.value, OnnxExportError)
    message = str(info.value)
    assert "zeta" in message
    assert "node 'special_zeta'" in message
    assert "test_onnx_internals.py" in message
    assert "torch.special.zeta(x, x + 1)" in message


def test_parameters_are_named_initializers_and_profile(tmp_path):
    model = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.ReLU())
    profile = tmp_path / "stages.json"
    result = to_onnx(
        model,
        (torch.randn(2, 4),),
        dynamic_shapes={"input": {0: "batch"}},
        filename=tmp_path / "m.onnx",
        profile=str(profile),
    )
    initializers = {i.name for i in result.model_proto.graph.initializer}
    assert {"0.weight", "0.bias"} <= initializers
    assert (tmp_path / "m.onnx").exists()
    assert profile.exists() and "capture" in profile.read_text()
