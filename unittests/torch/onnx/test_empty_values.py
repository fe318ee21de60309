"""Values a node computes statically empty become constants
(yobx.torch.onnx.empty_values): the model computes the same, without running a kernel
on an empty tensor, and the runtime checks' nodes stay."""

import numpy as np
import onnx_ir as ir

from unittests.torch.onnx._helpers import run_ir_model
from yobx.torch.onnx.empty_values import fold_empty_values
from yobx.torch.onnx.runtime_checks import CHECK_NODE_PREFIX

_FLOAT = ir.DataType.FLOAT


def _model(shape: list) -> ir.Model:
    """``y = InstanceNormalization(x)`` of a static ``x``, and ``z = Reshape(x, [-1])``
    named as a runtime check; ``Shape(y)`` read beside."""
    x = ir.Value(name="x", type=ir.TensorType(_FLOAT), shape=ir.Shape(shape))
    scale = ir.Value(name="scale", const_value=ir.tensor(np.ones(shape[1], np.float32)))
    bias = ir.Value(name="bias", const_value=ir.tensor(np.zeros(shape[1], np.float32)))
    flat = ir.Value(name="flat", const_value=ir.tensor(np.array([-1], np.int64)))
    norm = ir.node("InstanceNormalization", [x, scale, bias], name="norm")
    norm.outputs[0].name, norm.outputs[0].dtype = "y", _FLOAT
    norm.outputs[0].shape = ir.Shape(shape)
    size = ir.node("Shape", [norm.outputs[0]], name="size")
    size.outputs[0].name = "size"
    check = ir.node("Reshape", [x, flat], name=f"{CHECK_NODE_PREFIX}x is empty")
    check.outputs[0].name, check.outputs[0].dtype = "z", _FLOAT
    check.outputs[0].shape = ir.Shape([0] if 0 in shape else [int(np.prod(shape))])
    graph = ir.Graph(
        [x],
        [norm.outputs[0], size.outputs[0], check.outputs[0]],
        nodes=[norm, size, check],
        initializers=[scale, bias, flat],
        opset_imports={"": 18},
        name="g",
    )
    return ir.Model(graph, ir_version=10)


def test_a_static_empty_value_becomes_a_constant_and_the_model_computes_the_same():
    model = _model([2, 3, 0])
    x = np.zeros((2, 3, 0), np.float32)
    assert fold_empty_values(model) == 1
    ops = [node.op_type for node in model.graph]
    assert "Constant" in ops
    # the node computing nothing else is left to the caller's removal of unused nodes
    norm = next(node for node in model.graph if node.name == "norm")
    assert not norm.outputs[0].uses()
    assert model.graph.outputs[0].name == "y"
    ir.passes.common.RemoveUnusedNodesPass()(model)
    assert [node.op_type for node in model.graph] == ["Constant", "Shape", "Reshape"]
    y, size, z = run_ir_model(model, {"x": x})
    assert y.shape == (2, 3, 0) and y.dtype == np.float32
    np.testing.assert_array_equal(size, [2, 3, 0])
    assert z.shape == (0,)


def test_values_with_elements_or_dynamic_sizes_stay():
    for shape in ([2, 3, 4], ["n", 3, 0]):
        model = _model(shape)
        assert fold_empty_values(model) == 0
        assert [node.op_type for node in model.graph] == [
            "InstanceNormalization",
            "Shape",
            "Reshape",
        ]


def test_an_if_returning_an_empty_value_beside_others_stays_valid():
    # the branches' empty outputs become constants; the If still returns its computed
    # value, which must keep a name: a trailing output without one was left out when
    # serialized, and onnxruntime refused an If of 2 outputs whose branches give 3
    # (fuzz_onnx seed 8218)
    x = ir.Value(name="x", type=ir.TensorType(_FLOAT), shape=ir.Shape([2, 0]))
    condition = ir.Value(name="c", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    branches = {}
    for side in ("then_branch", "else_branch"):
        negated = ir.node("Neg", [x], name=f"{side}_neg")
        negated.outputs[0].name, negated.outputs[0].dtype = f"{side}_neg", _FLOAT
        negated.outputs[0].shape = ir.Shape([2, 0])
        size = ir.node("Shape", [x], name=f"{side}_size")
        size.outputs[0].name = f"{side}_size"
        outputs = [size.outputs[0], negated.outputs[0]]
        graph = ir.Graph([], outputs, nodes=[negated, size], name=side)
        branches[side] = ir.AttrGraph(side, graph)
    choice = ir.node("If", [condition], attributes=branches, num_outputs=2, name="choice")
    choice.outputs[0].name = "size"
    choice.outputs[1].name, choice.outputs[1].dtype = "negated", _FLOAT
    choice.outputs[1].shape = ir.Shape([2, 0])
    graph = ir.Graph(
        [x, condition], list(choice.outputs), nodes=[choice], opset_imports={"": 18}, name="g"
    )
    model = ir.Model(graph, ir_version=10)
    assert fold_empty_values(model) == 3
    ir.passes.common.RemoveUnusedNodesPass()(model)
    assert [value.name for value in model.graph.outputs] == ["size", "negated"]
    size, negated = run_ir_model(model, {"x": np.zeros((2, 0), np.float32), "c": np.array(True)})
    np.testing.assert_array_equal(size, [2, 0])
    assert negated.shape == (2, 0)
