"""The optimizer of exported models: onnxscript's rules, tried only where they can match."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import torch
from onnx import TensorProto, helper

from yobx.torch.onnx.optimize import _linear_rules, _operators, _root_operator, optimize_model

from ._helpers import export_and_validate


def _model(nodes, inputs, outputs) -> ir.Model:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return ir.serde.deserialize_model(proto)


def _run(model: ir.Model, feeds: dict) -> list:
    proto = ir.serde.serialize_model(model)
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def test_every_default_rule_is_anchored_on_a_known_operator():
    # a rule whose anchor cannot be read is always tried (correct, only slower): the
    # anchors of onnxscript's default rules must stay readable
    roots = [_root_operator(rule) for rule in _linear_rules()]
    assert roots and all(root is not None for root in roots), roots


def test_rules_rewrite_what_the_model_has_and_results_do_not_change():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        # two transposes that cancel: onnxscript's rule removes both
        helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 1]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 2, 1]),
        helper.make_node("Relu", ["t2"], ["y"]),
    ]
    model = _model(nodes, [x], [y])
    assert ("", "Transpose") in _operators(model)
    feeds = {"x": np.random.randn(2, 3, 4).astype(np.float32)}
    expected = _run(model, feeds)
    optimize_model(model)
    assert [n.op_type for n in model.graph] == ["Relu"]
    for batch in (2, 5):
        feeds = {"x": np.random.randn(batch, 3, 4).astype(np.float32)}
        got = _run(model, feeds)
        np.testing.assert_array_equal(got[0], np.maximum(feeds["x"], 0))
    assert expected[0].shape == (2, 3, 4)
    onnx.checker.check_model(ir.serde.serialize_model(model))


def test_anchored_rules_rewrite_as_onnxscript_does(monkeypatch):
    """Each rule tried only on its root operator's nodes gives the model onnxscript's
    own rule set gives (same nodes, same order), on an exported transformer block."""
    from onnxscript import rewriter

    from yobx.models import load_model
    from yobx.torch.onnx import export as export_module
    from yobx.torch.onnx import optimize as optimize_module
    from yobx.torch.onnx import to_onnx

    before_optimization = []

    def recording(ir_model, *args, **kwargs):
        before_optimization.append(ir.serde.serialize_model(ir_model))
        return optimize_model(ir_model, *args, **kwargs)

    monkeypatch.setattr(export_module, "optimize_model", recording)
    model, args, kwargs, dynamic_shapes = load_model("transformer-encoder")
    to_onnx(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    (proto,) = before_optimization
    ours, theirs = (ir.serde.deserialize_model(proto) for _ in range(2))
    rules = _linear_rules()
    anchored = optimize_module._RewritePresentOperators(rules)(ours)
    plain = rewriter.RewritePass(rules)(theirs)
    assert anchored.modified and plain.modified

    def nodes(m):
        return [(n.op_type, n.domain, [v.name if v else "" for v in n.inputs]) for n in m.graph]

    assert nodes(ours) == nodes(theirs)


def test_shape_inference_skipped_only_where_it_adds_nothing(monkeypatch):
    """Values with a complete type and shape skip the folding's ONNX shape inference:
    the model is the same, node for node and value type for value type."""
    from yobx.models import load_model
    from yobx.torch.onnx import folding, to_onnx

    def export():
        model, args, kwargs, dynamic_shapes = load_model("transformer-encoder")
        proto = to_onnx(model, args, kwargs, dynamic_shapes=dynamic_shapes).model_proto
        values = [*proto.graph.value_info, *proto.graph.output]
        return (
            [(n.op_type, n.domain, list(n.input)) for n in proto.graph.node],
            {v.name: str(v.type) for v in values},
        )

    skipping = export()
    monkeypatch.setattr(folding, "fully_known", lambda value: False)
    monkeypatch.setattr(folding, "_INFERRED", {})
    inferring = export()
    assert skipping == inferring
    assert len(skipping[1]) > 100


def test_operators_of_subgraphs_are_seen():
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    branch_out = helper.make_tensor_value_info("o", TensorProto.FLOAT, None)
    then_branch = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["o"], perm=[0])], "then", [], [branch_out]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["o"])], "else", [], [branch_out]
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)
    model = _model([node], [cond, x], [y])
    assert {("", "If"), ("", "Transpose"), ("", "Neg")} <= _operators(model)


class _ChunkOfADynamicDimension(torch.nn.Module):
    # the chunk size is computed from the dimension: onnxscript's SplitToSequence
    # evaluator fails on it (fuzz_onnx seed 22), the node must stay unfolded
    def forward(self, x):
        first, second = x.chunk(2, 0)
        swapped = torch.cat([second, first], 0)
        return swapped + torch.full_like(swapped, swapped.shape[-1]), x - swapped.mean()


def test_a_node_onnxscript_cannot_fold_is_kept_and_the_model_validates():
    result = export_and_validate(
        _ChunkOfADynamicDimension(), (torch.randn(4, 3),), dynamic_shapes=({0: "n", 1: "m"},)
    )
    # (in the branches too: an empty `n` is a version of its own, where chunk returns
    # two empty pieces instead of ceil(n / ceil(n / 2)))
    ops = {node.op_type for node in _all_nodes(result.model_proto.graph)}
    assert ops & {"SplitToSequence", "Split"}, ops


def _all_nodes(graph):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.g.node:
                yield from _all_nodes(attribute.g)
