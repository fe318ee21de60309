"""Nodes only one side of an ``If`` reads move into that side
(:mod:`yobx.torch.onnx.branch_sinking`): the model computes the same values, and the
other side runs fewer nodes."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from unittests.torch.onnx._helpers import run_ir_model
from yobx.torch.onnx.branch_sinking import sink_into_branches

_FLOAT = ir.TensorType(ir.DataType.FLOAT)


def _model(nested: bool) -> ir.Model:
    """``If(x.sum() > 0)``: the then side reads ``Exp(Neg(x))`` (inside a nested ``If``
    when ``nested``), the else side ``x + 1``; ``Sqrt(Abs(x))`` is read by both and
    ``Tanh(x)`` is an output as well."""
    x = ir.Value(name="x", type=_FLOAT, shape=ir.Shape(["n"]))
    nodes: list[ir.Node] = []

    def op(op_type, inputs, into, **attributes):
        node = ir.node(op_type, inputs, attributes=attributes or None)
        node.outputs[0].name = f"v{len(names)}"
        names.append(node.outputs[0].name)
        into.append(node)
        return node.outputs[0]

    names: list[str] = []
    one = op("Constant", [], nodes, value=ir.tensor(np.array(1.0, np.float32)))
    negated = op("Exp", [op("Neg", [x], nodes)], nodes)
    shared = op("Sqrt", [op("Abs", [x], nodes)], nodes)
    tanh = op("Tanh", [x], nodes)
    condition = op(
        "Greater", [op("ReduceSum", [x], nodes, keepdims=0), op("Sub", [one, one], nodes)], nodes
    )
    then_nodes: list[ir.Node] = []
    if nested:
        inner_then: list[ir.Node] = []
        inner_else: list[ir.Node] = []
        inner = ir.node(
            "If",
            [condition],
            attributes={
                "then_branch": ir.AttrGraph(
                    "then_branch",
                    ir.Graph(
                        [], [op("Mul", [negated, shared], inner_then)], nodes=inner_then, name="a"
                    ),
                ),
                "else_branch": ir.AttrGraph(
                    "else_branch",
                    ir.Graph([], [op("Mul", [x, shared], inner_else)], nodes=inner_else, name="b"),
                ),
            },
        )
        inner.outputs[0].name = "inner"
        then_nodes.append(inner)
        then_out = op("Identity", [inner.outputs[0]], then_nodes)
    else:
        then_out = op("Mul", [negated, shared], then_nodes)
    else_nodes: list[ir.Node] = []
    else_out = op("Add", [op("Mul", [x, shared], else_nodes), one], else_nodes)
    choice = ir.node(
        "If",
        [condition],
        attributes={
            "then_branch": ir.AttrGraph(
                "then_branch", ir.Graph([], [then_out], nodes=then_nodes, name="c")
            ),
            "else_branch": ir.AttrGraph(
                "else_branch", ir.Graph([], [else_out], nodes=else_nodes, name="d")
            ),
        },
    )
    choice.outputs[0].name = "y"
    nodes.append(choice)
    for value in (choice.outputs[0], tanh):
        value.type, value.shape = _FLOAT, ir.Shape(["n"])
    graph = ir.Graph([x], [choice.outputs[0], tanh], nodes=nodes, opset_imports={"": 18})
    return ir.Model(graph, ir_version=10)


def _run(model: ir.Model, x: np.ndarray) -> list[np.ndarray]:
    return run_ir_model(model, {"x": x})


def test_a_chain_only_one_side_reads_moves_into_it_nested_ifs_included():
    for nested in (False, True):
        model = _model(nested)
        inputs = [np.array(v, np.float32) for v in ([1.0, 2.0, -0.5], [-3.0, 0.5, 0.25])]
        expected = [_run(model, x) for x in inputs]
        # Neg and Exp, then from the side into the nested If's side
        assert sink_into_branches(model) == (4 if nested else 2)
        top = [n.op_type for n in model.graph]
        assert "Neg" not in top and "Exp" not in top
        # read by both sides, or an output: stays
        assert {"Abs", "Sqrt", "Tanh"} <= set(top)
        then_branch = next(n for n in model.graph if n.op_type == "If").attributes["then_branch"]
        if nested:
            inner = next(n for n in then_branch.value if n.op_type == "If")
            assert [n.op_type for n in inner.attributes["then_branch"].value][:2] == ["Neg", "Exp"]
        else:
            assert [n.op_type for n in then_branch.value][:2] == ["Neg", "Exp"]
        for x, before in zip(inputs, expected):
            for got, want in zip(_run(model, x), before):
                np.testing.assert_array_equal(got, want)
        assert sink_into_branches(model) == 0


def test_a_node_moved_into_a_branch_gets_a_name_no_node_of_the_branch_has():
    # names are unique within a graph only: a node named as one of the branch's kept
    # its name, and onnxruntime refused the model ("two nodes with same node name",
    # fuzz_branch_merging seed 8518)
    model = _model(False)
    then_branch = next(n for n in model.graph if n.op_type == "If").attributes["then_branch"]
    next(n for n in model.graph if n.op_type == "Neg").name = "shared"
    next(iter(then_branch.value)).name = "shared"
    x = np.array([1.0, 2.0, -0.5], np.float32)
    expected = _run(model, x)
    assert sink_into_branches(model) == 2
    names = [n.name for n in then_branch.value]
    assert len(names) == len(set(names)), names
    for got, want in zip(_run(model, x), expected):
        np.testing.assert_array_equal(got, want)


def test_a_product_by_a_weight_stays_in_the_main_graph():
    """onnxruntime prepacks a weight, and quantizers find its product, in the main
    graph only: the ``MatMul`` stays, the ``Relu`` after it moves."""
    x = ir.Value(name="x", type=_FLOAT, shape=ir.Shape(["n", 3]))
    weight = ir.Value(name="w", type=_FLOAT, shape=ir.Shape([3, 3]))
    weight.const_value = ir.tensor(np.arange(9, dtype=np.float32).reshape(3, 3) / 10)
    product = ir.node("MatMul", [x, weight])
    relu = ir.node("Relu", [product.outputs[0]])
    condition = ir.node("ReduceSum", [x], attributes={"keepdims": 0})
    zero = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(0.0, np.float32))})
    positive = ir.node("Greater", [condition.outputs[0], zero.outputs[0]])
    nodes = [product, relu, condition, zero, positive]
    for index, node in enumerate(nodes):
        node.outputs[0].name = f"v{index}"
    then_out = ir.node("Identity", [relu.outputs[0]])
    else_out = ir.node("Identity", [x])
    then_out.outputs[0].name, else_out.outputs[0].name = "t", "e"
    choice = ir.node(
        "If",
        [positive.outputs[0]],
        attributes={
            "then_branch": ir.AttrGraph(
                "then_branch", ir.Graph([], [then_out.outputs[0]], nodes=[then_out], name="t")
            ),
            "else_branch": ir.AttrGraph(
                "else_branch", ir.Graph([], [else_out.outputs[0]], nodes=[else_out], name="e")
            ),
        },
    )
    choice.outputs[0].name = "y"
    choice.outputs[0].type, choice.outputs[0].shape = _FLOAT, ir.Shape(["n", 3])
    graph = ir.Graph(
        [x],
        [choice.outputs[0]],
        nodes=[*nodes, choice],
        initializers=[weight],
        opset_imports={"": 18},
    )
    model = ir.Model(graph, ir_version=10)
    # both sides: a positive sum (the product) and a negative one
    inputs = [np.arange(6, dtype=np.float32).reshape(2, 3) - shift for shift in (0, 4)]
    expected = [_run(model, x)[0] for x in inputs]
    assert sink_into_branches(model) == 1
    assert [n.op_type for n in model.graph].count("MatMul") == 1
    assert "Relu" not in [n.op_type for n in model.graph]
    for x, before in zip(inputs, expected):
        np.testing.assert_array_equal(_run(model, x)[0], before)
    assert not np.array_equal(expected[0], inputs[0])  # the then side ran
