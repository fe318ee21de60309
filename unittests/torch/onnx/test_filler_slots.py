"""Outputs of an If never needed on the same side become one output
(:mod:`yobx.torch.onnx.filler_slots`), and the stretches reading them merge."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import onnxruntime

from yobx.torch.onnx.branch_merging import FILLER_KEY
from yobx.torch.onnx.filler_slots import merge_filler_slots
from yobx.torch.onnx.optimize import merge_branches


def _empty(name: str) -> onnx.NodeProto:
    value = onnx.numpy_helper.from_array(np.zeros([0], np.int64))
    return oh.make_node("Constant", [], [name], value=value, name=name)


def _two_stretches() -> onnx.ModelProto:
    """What the merge leaves of two versions computing the same shape in two places:
    ``If(c)`` exports ``s_then`` (a filler on the else side) and ``s_else`` (a filler on
    the then side); a later ``If(c)`` reshapes ``x`` by one or the other."""
    shape = [oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Neg", ["s"], ["neg"])]

    def first(side: str) -> onnx.GraphProto:
        if side == "then":
            nodes = [*copy.deepcopy(shape), _empty("filler_then")]
            outs = ["neg", "filler_then"]
        else:
            nodes = [
                oh.make_node("Shape", ["x"], ["s2"]),
                oh.make_node("Neg", ["s2"], ["neg2"]),
                _empty("filler_else"),
            ]
            outs = ["filler_else", "neg2"]
        info = [oh.make_tensor_value_info(o, onnx.TensorProto.INT64, [2]) for o in outs]
        return oh.make_graph(nodes, f"first_{side}", [], info)

    def second(side: str, read: str) -> onnx.GraphProto:
        nodes = [
            oh.make_node("Neg", [read], [f"pos_{side}"]),
            oh.make_node("Reshape", ["x", f"pos_{side}"], [f"r_{side}"]),
            oh.make_node("Relu", [f"r_{side}"], [f"y_{side}"]),
        ]
        info = [oh.make_tensor_value_info(f"y_{side}", onnx.TensorProto.FLOAT, ["n", 4])]
        return oh.make_graph(nodes, f"second_{side}", [], info)

    graph = oh.make_graph(
        [
            oh.make_node(
                "If",
                ["c"],
                ["a", "b"],
                then_branch=first("then"),
                else_branch=first("else"),
                name="first",
            ),
            oh.make_node(
                "If",
                ["c"],
                ["y"],
                then_branch=second("then", "a"),
                else_branch=second("else", "b"),
                name="second",
            ),
        ],
        "two_stretches",
        [
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4]),
            oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
        ],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def _marked(proto: onnx.ModelProto) -> ir.Model:
    """The model in onnx-ir, its fillers marked as the merge marks them."""
    model = ir.serde.deserialize_model(copy.deepcopy(proto))
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.name.startswith("filler"):
            node.meta[FILLER_KEY] = True
    return model


def _run(proto: onnx.ModelProto, x: np.ndarray, condition: bool) -> np.ndarray:
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"x": x, "c": np.array(condition)})[0]


def test_outputs_filled_on_opposite_sides_become_one_and_the_readers_merge():
    proto = _two_stretches()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    model = _marked(proto)
    merge_branches(model)
    merged = ir.serde.serialize_model(model)
    onnx.checker.check_model(merged)
    ifs = [n for n in merged.graph.node if n.op_type == "If"]
    # the first If returns one value; the second, reading it on both sides, is gone
    assert len(ifs) == 1 and len(ifs[0].output) == 1, [n.op_type for n in merged.graph.node]
    assert [n.op_type for n in merged.graph.node][-3:] == ["Neg", "Reshape", "Relu"]
    for condition in (True, False):
        np.testing.assert_array_equal(_run(merged, x, condition), _run(proto, x, condition))


def test_outputs_without_fillers_stay_apart():
    # unmarked, the empty constants are values like any other: nothing is merged
    model = ir.serde.deserialize_model(copy.deepcopy(_two_stretches()))
    assert merge_filler_slots(model) == 0
    first = next(n for n in model.graph if n.name == "first")
    assert len(first.outputs) == 2


def test_an_output_real_on_both_sides_stays_apart_from_another():
    proto = _two_stretches()
    model = _marked(proto)
    # the else side now computes a real value for the first output too
    first = next(n for n in model.graph if n.name == "first")
    else_branch = first.attributes["else_branch"].value
    filler = next(n for n in else_branch if n.name == "filler_else")
    filler.meta.pop(FILLER_KEY)
    assert merge_filler_slots(model) == 0
    assert len(next(n for n in model.graph if n.name == "first").outputs) == 2
