"""The branches of an If merged: what both compute runs once outside, the model computes
what it computed (random programs, a hand-written If, a decoder choosing between
versions)."""

import copy

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import onnxruntime
import pytest
import torch

from unittests.torch.onnx.branch_program_generator import check_merge
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.branch_merging import merge_if_branches

PROGRAMS = 40


def test_random_programs_compute_the_same_after_the_merge():
    outcomes = [check_merge(seed) for seed in range(PROGRAMS)]
    wrong = [o for o in outcomes if o.wrong]
    assert not wrong, wrong
    # the programs share parts between their branches: most merge something
    assert sum(o.merged > 0 for o in outcomes) >= PROGRAMS * 3 // 4
    # and some leave trees of If nodes that run as one If, checked the same way
    assert any(o.collapsed for o in outcomes)


def _session(proto: onnx.ModelProto) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )


def _docstring_model() -> onnx.ModelProto:
    """If(c, then=[a, b, x, d], else=[a, b, y, z, d]): d multiplies what x and z
    compute by a weight."""

    def branch(name: str, middle: list) -> onnx.GraphProto:
        nodes = [
            oh.make_node("Relu", ["x"], ["a"]),
            oh.make_node("MatMul", ["a", "W"], ["b"]),
            *middle,
            oh.make_node("MatMul", ["m", "W"], ["d"]),
        ]
        out = [oh.make_tensor_value_info("d", onnx.TensorProto.FLOAT, ["n", 4])]
        return oh.make_graph(nodes, name, [], out)

    then_branch = branch("then", [oh.make_node("Neg", ["b"], ["m"])])
    else_branch = branch(
        "else", [oh.make_node("Exp", ["b"], ["e"]), oh.make_node("Sqrt", ["e"], ["m"])]
    )
    weight = onnx.numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 10, "W")
    graph = oh.make_graph(
        [oh.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        "docstring",
        [
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4]),
            oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
        ],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])],
        [weight],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_only_what_differs_stays_in_an_if_on_the_same_condition():
    proto = _docstring_model()
    model = ir.serde.deserialize_model(copy.deepcopy(proto))
    assert merge_if_branches(model) == 3
    merged = ir.serde.serialize_model(model)
    onnx.checker.check_model(merged)
    graph = merged.graph
    # the output keeps its name without a copy
    assert [n.op_type for n in graph.node] == ["Relu", "MatMul", "If", "MatMul"]
    (choice,) = [n for n in graph.node if n.op_type == "If"]
    assert choice.input == ["c"]
    branches = {a.name: [n.op_type for n in a.g.node] for a in choice.attribute}
    assert branches == {"then_branch": ["Neg"], "else_branch": ["Exp", "Sqrt"]}
    assert [o.name for o in graph.output] == ["y"]
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for condition in (True, False):
        feeds = {"x": x, "c": np.array(condition)}
        expected = _session(proto).run(None, feeds)[0]
        np.testing.assert_allclose(_session(merged).run(None, feeds)[0], expected, rtol=1e-6)


def _nested_versions_model() -> onnx.ModelProto:
    """Three versions nested two deep, as a capture choosing between versions writes
    them: ``If(c1, then=If(c2, then=V1, else=V2), else=V3)``; each version computes
    ``present = Concat(past, f(x @ W))`` with its own ``f`` (a decode step's cache,
    which its attention computes differently in each version) and ``y = present @ W``."""

    def version(name: str, op: str, suffix: str) -> onnx.GraphProto:
        nodes = [
            oh.make_node("MatMul", ["x", "W"], [f"h{suffix}"]),
            oh.make_node(op, [f"h{suffix}"], [f"f{suffix}"]),
            oh.make_node("Concat", ["past", f"f{suffix}"], [f"present{suffix}"], axis=0),
            oh.make_node("MatMul", [f"present{suffix}", "W"], [f"y{suffix}"]),
        ]
        out = [
            oh.make_tensor_value_info(f"y{suffix}", onnx.TensorProto.FLOAT, None),
            oh.make_tensor_value_info(f"present{suffix}", onnx.TensorProto.FLOAT, None),
        ]
        return oh.make_graph(nodes, name, [], out)

    inner_out = [
        oh.make_tensor_value_info("yi", onnx.TensorProto.FLOAT, None),
        oh.make_tensor_value_info("pi", onnx.TensorProto.FLOAT, None),
    ]
    inner = oh.make_node(
        "If",
        ["c2"],
        ["yi", "pi"],
        then_branch=version("v1", "Neg", "1"),
        else_branch=version("v2", "Exp", "2"),
    )
    outer_then = oh.make_graph([inner], "outer_then", [], inner_out)
    weight = onnx.numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 10, "W")
    graph = oh.make_graph(
        [
            oh.make_node(
                "If",
                ["c1"],
                ["y", "present"],
                then_branch=outer_then,
                else_branch=version("v3", "Relu", "3"),
            )
        ],
        "nested_versions",
        [
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4]),
            oh.make_tensor_value_info("past", onnx.TensorProto.FLOAT, ["p", 4]),
            oh.make_tensor_value_info("c1", onnx.TensorProto.BOOL, []),
            oh.make_tensor_value_info("c2", onnx.TensorProto.BOOL, []),
        ],
        [
            oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["m", 4]),
            oh.make_tensor_value_info("present", onnx.TensorProto.FLOAT, ["m", 4]),
        ],
        [weight],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_nested_versions_return_what_their_stretches_compute_without_copies():
    # a value a version returns passes from the innermost stretch to the outputs as
    # it is: no Identity copying it at each level (a decode step's whole cache, copied
    # once per level of nesting, made eight versions twice as slow as four)
    proto = _nested_versions_model()
    model = ir.serde.deserialize_model(copy.deepcopy(proto))
    assert merge_if_branches(model) == 4  # the MatMuls of both levels
    merged = ir.serde.serialize_model(model)
    onnx.checker.check_model(merged)
    everything = [n.op_type for n in ir.traversal.RecursiveGraphIterator(model.graph)]
    assert "Identity" not in everything, everything
    assert [n.op_type for n in merged.graph.node] == ["MatMul", "If", "MatMul"]
    assert [o.name for o in merged.graph.output] == ["y", "present"]
    rng = np.random.default_rng(0)
    for n, p in ((3, 2), (1, 0)):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        past = rng.standard_normal((p, 4)).astype(np.float32)
        for c1, c2 in ((True, True), (True, False), (False, True), (False, False)):
            feeds = {"x": x, "past": past, "c1": np.array(c1), "c2": np.array(c2)}
            expected = _session(proto).run(None, feeds)
            got = _session(merged).run(None, feeds)
            for e, g in zip(expected, got):
                np.testing.assert_allclose(g, e, rtol=1e-6)


def test_branches_sharing_nothing_are_left_as_they_are():
    out = [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])]
    then_branch = oh.make_graph([oh.make_node("Neg", ["x"], ["y"])], "then", [], out)
    else_branch = oh.make_graph(
        [oh.make_node("Exp", ["x"], ["e"]), oh.make_node("Sqrt", ["e"], ["y"])], "else", [], out
    )
    graph = oh.make_graph(
        [oh.make_node("If", ["c"], ["z"], then_branch=then_branch, else_branch=else_branch)],
        "apart",
        [
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4]),
            oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
        ],
        [oh.make_tensor_value_info("z", onnx.TensorProto.FLOAT, ["n", 4])],
    )
    model = ir.serde.deserialize_model(oh.make_model(graph))
    before = ir.serde.serialize_model(model)
    assert merge_if_branches(model) == 0
    assert ir.serde.serialize_model(model) == before


def _llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=40,
        use_cache=False,
    )
    torch.manual_seed(3)
    return transformers.LlamaForCausalLM(config).eval()


def _weight_matmul_depths(model: ir.Model) -> list[int]:
    weights = set(model.graph.initializers)
    depths = []

    def walk(graph: ir.Graph, depth: int) -> None:
        for node in graph:
            if node.op_type == "MatMul" and node.inputs[1].name in weights:
                depths.append(depth)
            for attribute in node.attributes.values():
                if attribute.type == ir.AttributeType.GRAPH:
                    walk(attribute.value, depth + 1)

    walk(model.graph, 0)
    return depths


def test_a_decoder_choosing_between_versions_multiplies_its_weights_once_at_the_top():
    model = _llama()
    ids = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(0))
    result = to_onnx(model, (), {"input_ids": ids}, dynamic_shapes={"input_ids": {0: "b", 1: "s"}})
    # several versions (one token or more, one text or more), still chosen by If nodes
    assert len(result.versions) > 2
    assert any(node.op_type == "If" for node in result.model.graph)
    # every linear layer's weight multiplied once, in the main graph, read [in, out]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert _weight_matmul_depths(result.model) == [0] * len(linears)
    session = _session(ir.serde.serialize_model(result.model))
    for batch, seq in [(1, 1), (1, 5), (3, 1), (2, 7), (3, 4)]:
        ids = torch.randint(0, 40, (batch, seq), generator=torch.Generator().manual_seed(seq))
        with torch.no_grad():
            expected = model(input_ids=ids).logits.numpy()
        got = session.run(None, {"input_ids": ids.numpy()})[0]
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


def _constant_beside_a_pair_model() -> onnx.ModelProto:
    """``If(c, then=(ReduceSum(x) / 3, 8), else=(ReduceSum(x), n * 2))``, the 8 a
    constant of the then side: a version's ``(x.mean(1), 8)`` against the other's
    ``(x.sum(1), x.shape[1] * 2)``."""
    axes = onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")
    then_branch = oh.make_graph(
        [
            oh.make_node("ReduceSum", ["x", "axes"], ["s1"], keepdims=0),
            oh.make_node("Div", ["s1", "three"], ["mean"]),
        ],
        "then",
        [],
        [
            oh.make_tensor_value_info("mean", onnx.TensorProto.FLOAT, None),
            oh.make_tensor_value_info("eight", onnx.TensorProto.INT64, []),
        ],
        [
            onnx.numpy_helper.from_array(np.array(3.0, np.float32), "three"),
            onnx.numpy_helper.from_array(np.array(8, np.int64), "eight"),
        ],
    )
    else_branch = oh.make_graph(
        [
            oh.make_node("ReduceSum", ["x", "axes"], ["s2"], keepdims=0),
            oh.make_node("Shape", ["x"], ["shape"], start=1, end=2),
            oh.make_node("Squeeze", ["shape"], ["n"]),
            oh.make_node("Mul", ["n", "two"], ["twice"]),
        ],
        "else",
        [],
        [
            oh.make_tensor_value_info("s2", onnx.TensorProto.FLOAT, None),
            oh.make_tensor_value_info("twice", onnx.TensorProto.INT64, []),
        ],
        [onnx.numpy_helper.from_array(np.array(2, np.int64), "two")],
    )
    graph = oh.make_graph(
        [oh.make_node("If", ["c"], ["y", "k"], then_branch=then_branch, else_branch=else_branch)],
        "constant_beside_a_pair",
        [
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, "n"]),
            oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
        ],
        [
            oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2]),
            oh.make_tensor_value_info("k", onnx.TensorProto.INT64, []),
        ],
        [axes],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_an_output_neither_computed_once_nor_paired_leaves_the_branches_as_they_are():
    # the pair of sums closed the stretch before the copies of the constant and of the
    # product: the merge found no value for that output (KeyError: None)
    proto = _constant_beside_a_pair_model()
    model = ir.serde.deserialize_model(copy.deepcopy(proto))
    merge_if_branches(model)
    merged = ir.serde.serialize_model(model)
    onnx.checker.check_model(merged)
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    for condition in (True, False):
        feeds = {"x": x, "c": np.array(condition)}
        for got, expected in zip(
            _session(merged).run(None, feeds), _session(proto).run(None, feeds)
        ):
            np.testing.assert_allclose(got, expected, rtol=1e-6)
