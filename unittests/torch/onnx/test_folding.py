"""The constant folding of the optimizer: ONNX's shape inference kept per kind of node
gives the model inferring every node gives, and a branch leaves the shapes of the
values it reads from the enclosing graph alone."""

from __future__ import annotations

import onnx_ir as ir
import torch

from yobx.models import load_model
from yobx.torch.onnx import folding, to_onnx


def _export(name: str) -> tuple[list, dict]:
    model, args, kwargs, dynamic_shapes = load_model(name)
    proto = to_onnx(model, args, kwargs, dynamic_shapes=dynamic_shapes).model_proto
    values = [*proto.graph.value_info, *proto.graph.output]
    return (
        [(n.op_type, n.domain, list(n.input), list(n.output)) for n in proto.graph.node],
        {v.name: str(v.type) for v in values},
    )


def test_kept_inferences_give_the_model_inferring_every_node_gives(monkeypatch):
    monkeypatch.setattr(folding, "_INFERRED", folding.BoundedCache(20_000))
    kept = _export("tiny-llm")
    # a second export finds every inference kept by the first
    assert _export("tiny-llm") == kept
    assert len(folding._INFERRED) > 0
    monkeypatch.setattr(folding, "_inference_key", lambda node, opset: None)
    inferred = _export("tiny-llm")
    assert kept == inferred
    assert len(kept[1]) > 50


def _branch_model() -> ir.Model:
    """``If(c)`` whose then-branch holds ``Identity(x)`` typed ``[batch, 1]`` (what a
    version for one token knows of ``x``) and whose else-branch negates ``x``."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", "seq"]))
    c = ir.Value(name="c", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    identity = ir.node("Identity", [x])
    identity.outputs[0].shape = ir.Shape(["batch", 1])
    identity.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    negation = ir.node("Neg", [x])
    branches = {
        "then_branch": ir.Graph([], [identity.outputs[0]], nodes=[identity], name="then"),
        "else_branch": ir.Graph([], [negation.outputs[0]], nodes=[negation], name="else"),
    }
    choice = ir.node("If", [c], attributes={k: ir.AttrGraph(k, g) for k, g in branches.items()})
    choice.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    graph = ir.Graph([x, c], [choice.outputs[0]], nodes=[choice], opset_imports={"": 18})
    return ir.Model(graph, ir_version=10)


def test_a_branch_leaves_the_shapes_of_the_enclosing_graph_alone():
    model = _branch_model()
    folding.folding_pass(shape_inference=True, input_size_limit=1024, output_size_limit=1024)(model)
    assert list(model.graph.inputs[0].shape) == [ir.SymbolicDim("batch"), ir.SymbolicDim("seq")]
    # onnxscript's own pass narrows the input to what the branch knows
    from onnxscript.optimizer import _constant_folding

    model = _branch_model()
    _constant_folding.FoldConstantsPass(
        shape_inference=True, input_size_limit=1024, output_size_limit=1024
    )(model)
    assert list(model.graph.inputs[0].shape)[1] == 1


def test_an_export_through_folding_still_matches_eager():
    class Mask(torch.nn.Module):
        def forward(self, x):
            positions = torch.arange(x.shape[1])
            keep = positions[None, :] < x.shape[1] - 1
            return x.masked_fill(~keep, 0.0).cumsum(-1)

    x = torch.randn(2, 5)
    result = to_onnx(Mask(), (x,), dynamic_shapes=({0: "batch", 1: "seq"},), validate=True)
    assert result.validation.ok, result.validation.format()
