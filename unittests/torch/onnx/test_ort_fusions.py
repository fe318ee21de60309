"""``yobx.torch.onnx.ort_fusions``: the fusions of ``optimize="ort"`` reach inside the
branches of ``If`` nodes (the versions of a model), whose weights live in the main
graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
from onnx import TensorProto, helper

from yobx.torch.onnx.ort_fusions import fusions_for_ort, outer_values_aliased

HIDDEN = 8


def _rms_norm_nodes(x: str, weight: str, out: str, prefix: str) -> list[onnx.NodeProto]:
    """``weight * x / sqrt(mean(x**2) + eps)``, as the export writes an RMS norm."""
    return [
        helper.make_node("Pow", [x, "two"], [f"{prefix}_sq"]),
        helper.make_node(
            "ReduceMean",
            [f"{prefix}_sq", "last_axis"],
            [f"{prefix}_mean"],
            keepdims=1,
            noop_with_empty_axes=0,
        ),
        helper.make_node("Add", [f"{prefix}_mean", "eps"], [f"{prefix}_var"]),
        helper.make_node("Sqrt", [f"{prefix}_var"], [f"{prefix}_std"]),
        helper.make_node("Reciprocal", [f"{prefix}_std"], [f"{prefix}_inv"]),
        helper.make_node("Mul", [x, f"{prefix}_inv"], [f"{prefix}_normed"]),
        helper.make_node("Mul", [weight, f"{prefix}_normed"], [out]),
    ]


def _model_with_versions() -> onnx.ModelProto:
    """An ``If`` choosing between two versions that both normalize ``x + skip`` with a
    weight of the main graph (then double it, or not)."""
    then_nodes = [
        helper.make_node("Add", ["x", "skip"], ["then_sum"]),
        *_rms_norm_nodes("then_sum", "weight", "then_norm", "then"),
        helper.make_node("Add", ["then_norm", "then_norm"], ["then_out"]),
    ]
    else_nodes = [
        helper.make_node("Add", ["x", "skip"], ["else_sum"]),
        *_rms_norm_nodes("else_sum", "weight", "else_out", "else"),
    ]
    output = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)

    def branch(name: str, nodes: list, result: str) -> onnx.GraphProto:
        return helper.make_graph(
            nodes, name, [], [helper.make_tensor_value_info(result, TensorProto.FLOAT, None)]
        )

    nodes = [
        helper.make_node("ReduceSum", ["flag"], ["flag_sum"], keepdims=0),
        helper.make_node("Greater", ["flag_sum", "zero"], ["cond"]),
        helper.make_node(
            "If",
            ["cond"],
            ["out"],
            then_branch=branch("then", then_nodes, "then_out"),
            else_branch=branch("else", else_nodes, "else_out"),
        ),
    ]
    rng = np.random.default_rng(0)
    initializers = [
        onnx.numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "weight"),
        onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        onnx.numpy_helper.from_array(np.array([-1], np.int64), "last_axis"),
        onnx.numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
        helper.make_tensor_value_info("skip", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
        helper.make_tensor_value_info("flag", TensorProto.FLOAT, [1]),
    ]
    graph = helper.make_graph(nodes, "versions", inputs, [output], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(proto: onnx.ModelProto, feeds: dict) -> np.ndarray:
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)[0]


def _branches(model: ir.Model) -> list[ir.Graph]:
    (node,) = [n for n in model.graph if n.op_type == "If"]
    return [node.attributes["then_branch"].value, node.attributes["else_branch"].value]


def test_a_branch_reads_the_main_graph_through_its_own_aliases_inside_the_block():
    model = ir.from_proto(_model_with_versions())
    before = ir.to_proto(model).SerializeToString()
    weight = model.graph.initializers["weight"]
    with outer_values_aliased(model) as count:
        # x, skip and the weight in each branch; the scalar constants are read directly
        assert count == 6
        for branch in _branches(model):
            readers = [node for node in branch if weight in node.inputs]
            assert [node.op_type for node in readers] == ["Identity"]
            norm_mul = [n for n in branch if n.op_type == "Mul"][-1]
            assert norm_mul.inputs[0].graph is branch
            assert any(n.inputs[1].name == "two" for n in branch if n.op_type == "Pow")
    # every alias is gone and the model is what it was
    assert ir.to_proto(model).SerializeToString() == before


def test_fusions_apply_inside_the_branches_with_the_same_outputs():
    proto = _model_with_versions()
    model = ir.from_proto(proto)
    counts = fusions_for_ort(model, attention=False)
    assert counts["rms_normalization"] == 2, counts
    assert counts["skip_rms_normalization"] == 2, counts
    fused = ir.to_proto(model)
    ops = {node.op_type for branch in _branches(model) for node in branch}
    assert "SkipSimplifiedLayerNormalization" in ops, ops
    assert "Identity" not in ops, ops
    rng = np.random.default_rng(1)
    for batch, seq in ((2, 3), (1, 5)):
        for flag in (1.0, -1.0):
            feeds = {
                "x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
                "skip": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
                "flag": np.array([flag], np.float32),
            }
            expected = _run(proto, feeds)
            np.testing.assert_allclose(_run(fused, feeds), expected, rtol=1e-5, atol=1e-5)
