"""Trees of nested If nodes run as one If choosing between their distinct leaves
(:mod:`yobx.torch.onnx.if_trees`)."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import onnxruntime
import pytest

from yobx.torch.onnx.if_trees import collapse_if_trees


def _leaf(name: str, op: str, source: str, factor: str | None = None) -> onnx.GraphProto:
    """``op(source) * factor``; the factor a constant of the leaf when not given."""
    nodes = []
    if factor is None:
        factor = f"{name}_two"
        two = onnx.numpy_helper.from_array(np.array(2.0, np.float32))
        nodes.append(oh.make_node("Constant", [], [factor], value=two))
    nodes += [
        oh.make_node(op, [source], [f"{name}_op"]),
        oh.make_node("Mul", [f"{name}_op", factor], [f"{name}_out"]),
    ]
    info = [oh.make_tensor_value_info(f"{name}_out", onnx.TensorProto.FLOAT, None)]
    return oh.make_graph(nodes, name, [], info)


def _tree(
    index: int, source: str, output: str, inner_condition: str = "c2", inner_else: str = "Exp"
) -> list:
    """``If(c1, then=[two, If(c2, then=Neg(z)*two, else=Exp(z)*two)], else=Neg(z)*2)``:
    the then side's leaf reads a constant of the dispatch level, the else side's leaf
    computes the same with a constant of its own (``inner_else`` replaces ``Exp``)."""
    prefix = f"t{index}"
    inner = oh.make_node(
        "If",
        [inner_condition],
        [f"{prefix}_inner"],
        then_branch=_leaf(f"{prefix}_a", "Neg", source, factor=f"{prefix}_two"),
        else_branch=_leaf(f"{prefix}_b", inner_else, source, factor=f"{prefix}_two"),
        name=f"{prefix}_inner_if",
    )
    two = onnx.numpy_helper.from_array(np.array(2.0, np.float32))
    level = oh.make_graph(
        [oh.make_node("Constant", [], [f"{prefix}_two"], value=two), inner],
        f"{prefix}_level",
        [],
        [oh.make_tensor_value_info(f"{prefix}_inner", onnx.TensorProto.FLOAT, None)],
    )
    return [
        oh.make_node(
            "If",
            ["c1"],
            [output],
            then_branch=level,
            else_branch=_leaf(f"{prefix}_c", "Neg", source),
            name=f"{prefix}_tree",
        )
    ]


def _layers(count: int, inner_else: str = "Exp", last: str = "Tanh") -> onnx.ModelProto:
    """``count`` trees one after the other, each followed by ``last`` (the graph's
    output ``y_tanh``; the last tree's output itself when ``last`` is empty)."""
    nodes, source = [], "x"
    for index in range(count):
        output = "y" if index == count - 1 else f"z{index}"
        if index == count - 1 and not last:
            output = "y_tanh"
        nodes += _tree(index, source, output, inner_else=inner_else)
        if output != "y_tanh":
            nodes.append(oh.make_node(last or "Tanh", [output], [f"{output}_tanh"]))
        source = f"{output}_tanh"
    graph = oh.make_graph(
        nodes,
        "layers",
        [
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4]),
            oh.make_tensor_value_info("c1", onnx.TensorProto.BOOL, []),
            oh.make_tensor_value_info("c2", onnx.TensorProto.BOOL, []),
        ],
        [oh.make_tensor_value_info("y_tanh", onnx.TensorProto.FLOAT, ["n", 4])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def _collapsed(proto: onnx.ModelProto) -> tuple[int, onnx.ModelProto]:
    model = ir.serde.deserialize_model(copy.deepcopy(proto))
    count = collapse_if_trees(model)
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after)
    return count, after


def _same_outputs(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    sessions = [
        onnxruntime.InferenceSession(p.SerializeToString(), providers=["CPUExecutionProvider"])
        for p in (before, after)
    ]
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for c1, c2 in itertools.product((True, False), repeat=2):
        feeds = {"x": x, "c1": np.array(c1), "c2": np.array(c2)}
        expected, got = (s.run(None, feeds)[0] for s in sessions)
        np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=f"c1={c1} c2={c2}")


@pytest.mark.parametrize("layers", [2, 3])
def test_trees_sharing_their_conditions_choose_between_distinct_leaves(layers):
    proto = _layers(layers)
    count, after = _collapsed(proto)
    assert count == layers
    ifs = [n for n in after.graph.node if n.op_type == "If"]
    # one selector for all the trees, then one If per tree (two distinct leaves)
    assert len(ifs) == layers + 1, [n.name for n in ifs]
    for choice in ifs[1:]:
        branches = {a.name: a.g for a in choice.attribute}
        assert not any(n.op_type == "If" for g in branches.values() for n in g.node)
        # the leaf reading the dispatch level's constant has a copy of it
        ops = sorted(n.op_type for n in branches["then_branch"].node)
        assert ops == ["Constant", "Mul", "Neg"], ops
    _same_outputs(proto, after)


def test_trees_of_one_distinct_leaf_whose_output_is_the_graph_s():
    # every leaf computes Neg(z) * 2: the trees become their leaf's nodes, and the
    # last one's values become the graph's output (they were its leaf graph's outputs,
    # which onnx-ir refused to move: fuzz_branch_merging seed 6195)
    proto = _layers(2, inner_else="Neg", last="")
    count, after = _collapsed(proto)
    assert count == 2
    # the selector of the paths is left, unused, for the removal of unused nodes
    ifs = [n.name for n in after.graph.node if n.op_type == "If"]
    assert all(name.startswith("yobx_path") for name in ifs), ifs
    _same_outputs(proto, after)


def test_a_tree_no_other_tree_shares_is_left():
    proto = _layers(1)
    count, after = _collapsed(proto)
    assert count == 0
    assert [n.op_type for n in after.graph.node] == ["If", "Tanh"]


def test_a_condition_computed_inside_the_tree_is_left():
    # the inner condition comes from the dispatch level itself: the selector, outside
    # the tree, could not read it
    proto = _layers(2)
    for node in proto.graph.node:
        if node.op_type != "If":
            continue
        level = next(a.g for a in node.attribute if a.name == "then_branch")
        inner = next(n for n in level.node if n.op_type == "If")
        level.node.insert(0, oh.make_node("Not", ["c2"], [f"{node.name}_not"]))
        inner.input[0] = f"{node.name}_not"
    count, after = _collapsed(proto)
    assert count == 0
    _same_outputs(proto, after)
