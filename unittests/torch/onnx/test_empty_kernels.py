"""Kernels onnxruntime cannot run on an empty tensor are skipped where their input is
statically empty (yobx.torch.onnx.empty_kernels): the model computes the same empty
tensor without crashing its caller."""

import numpy as np
import onnx_ir as ir

from unittests.torch.onnx._helpers import run_ir_model
from yobx.torch.onnx.empty_kernels import skip_empty_kernels

_FLOAT = ir.DataType.FLOAT


def _normalization(x: ir.Value, name: str) -> ir.Node:
    channels = x.shape[1]
    scale = ir.Value(name=f"{name}_scale", const_value=ir.tensor(np.ones(channels, np.float32)))
    bias = ir.Value(name=f"{name}_bias", const_value=ir.tensor(np.zeros(channels, np.float32)))
    node = ir.node("InstanceNormalization", [x, scale, bias], name=name)
    node.outputs[0].name, node.outputs[0].dtype = name, _FLOAT
    return node


def _model(shape: list, in_branches: bool = False) -> ir.Model:
    """``InstanceNormalization(x)`` returned by the graph, or by both branches of an
    ``If`` on ``c`` beside ``Shape(x)``."""
    x = ir.Value(name="x", type=ir.TensorType(_FLOAT), shape=ir.Shape(shape))
    if not in_branches:
        norm = _normalization(x, "norm")
        graph = ir.Graph([x], [norm.outputs[0]], nodes=[norm], opset_imports={"": 18}, name="g")
        for value in norm.inputs[1:]:
            graph.register_initializer(value)
        return ir.Model(graph, ir_version=10)
    condition = ir.Value(name="c", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    branches = {}
    for side in ("then_branch", "else_branch"):
        norm = _normalization(x, f"{side}_norm")
        scale, bias = (
            ir.node("Constant", [], attributes={"value": v.const_value}, name=f"{v.name}_node")
            for v in norm.inputs[1:]
        )
        norm.replace_input_with(1, scale.outputs[0])
        norm.replace_input_with(2, bias.outputs[0])
        size = ir.node("Shape", [x], name=f"{side}_size")
        size.outputs[0].name = f"{side}_size"
        outputs = [size.outputs[0], norm.outputs[0]]
        graph = ir.Graph([], outputs, nodes=[scale, bias, norm, size], name=side)
        branches[side] = ir.AttrGraph(side, graph)
    choice = ir.node("If", [condition], attributes=branches, num_outputs=2, name="choice")
    choice.outputs[0].name = "size"
    choice.outputs[1].name, choice.outputs[1].dtype = "normalized", _FLOAT
    graph = ir.Graph(
        [x, condition], list(choice.outputs), nodes=[choice], opset_imports={"": 18}, name="g"
    )
    return ir.Model(graph, ir_version=10)


def test_a_normalization_of_a_static_empty_tensor_is_its_input():
    # onnxruntime's InstanceNormalization crashed the process on a (3, 1, 0) input
    model = _model([3, 1, 0])
    assert skip_empty_kernels(model) == 1
    assert [node.op_type for node in model.graph] == ["Identity"]
    assert model.graph.outputs[0].name == "norm"
    (got,) = run_ir_model(model, {"x": np.zeros((3, 1, 0), np.float32)})
    assert got.shape == (3, 1, 0) and got.dtype == np.float32


def test_in_the_branches_of_an_if_the_outputs_keep_their_names():
    model = _model([2, 3, 0], in_branches=True)
    assert skip_empty_kernels(model) == 2
    (choice,) = model.graph
    for side in ("then_branch", "else_branch"):
        branch = choice.attributes[side].as_graph()
        assert "InstanceNormalization" not in [node.op_type for node in branch]
        assert [value.name for value in branch.outputs] == [f"{side}_size", f"{side}_norm"]
    feeds = {"x": np.zeros((2, 3, 0), np.float32), "c": np.array(False)}
    size, normalized = run_ir_model(model, feeds)
    np.testing.assert_array_equal(size, [2, 3, 0])
    assert normalized.shape == (2, 3, 0)


def test_inputs_with_elements_or_dynamic_sizes_keep_their_kernel():
    for shape in ([2, 3, 4], ["n", 3, 0]):
        model = _model(shape)
        assert skip_empty_kernels(model) == 0
        assert [node.op_type for node in model.graph] == ["InstanceNormalization"]
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    (got,) = run_ir_model(_model([2, 3, 4]), {"x": x})
    expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
