"""The onnx stage and first divergence on an ONNX model with one altered node."""

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch
from onnx import numpy_helper

from yobx.torch.inspect import compare, first_divergence, record_run


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.act = torch.nn.ReLU()
        self.out = torch.nn.Linear(3, 2)

    def forward(self, x):
        y = self.act(self.linear(x)) + 1
        return self.out(y).sum(dim=-1)


def _model():
    torch.manual_seed(0)
    return Model().eval()


def build_onnx(model: Model, add_constant: float = 1.0) -> onnx.ModelProto:
    """The model in ONNX with values named after the FX nodes of symbolic_trace."""

    def init(name, tensor):
        return numpy_helper.from_array(tensor.detach().numpy(), name)

    nodes = [
        oh.make_node("Gemm", ["x", "linear.weight", "linear.bias"], ["linear"], transB=1),
        oh.make_node("Relu", ["linear"], ["act"]),
        # "one" has no FX counterpart: it must be recorded without breaking the matching.
        oh.make_node(
            "Constant",
            [],
            ["one"],
            value=numpy_helper.from_array(np.array(add_constant, dtype=np.float32)),
        ),
        oh.make_node("Add", ["act", "one"], ["add"]),
        oh.make_node("Gemm", ["add", "out.weight", "out.bias"], ["out"], transB=1),
        oh.make_node("ReduceSum", ["out", "axes"], ["sum_1"], keepdims=0),
    ]
    graph = oh.make_graph(
        nodes,
        "model",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])],
        [oh.make_tensor_value_info("sum_1", onnx.TensorProto.FLOAT, ["batch"])],
        [
            init("linear.weight", model.linear.weight),
            init("linear.bias", model.linear.bias),
            init("out.weight", model.out.weight),
            init("out.bias", model.out.bias),
            numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes"),
        ],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    onnx.checker.check_model(proto)
    return proto


def alter_add_constant(proto: onnx.ModelProto, value: float) -> onnx.ModelProto:
    """A copy where the Constant feeding the Add holds another value."""
    altered = onnx.ModelProto()
    altered.CopyFrom(proto)
    for node in altered.graph.node:
        if node.op_type == "Constant" and node.output[0] == "one":
            node.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(value, dtype=np.float32)))
    return altered


def test_onnx_stage_matches_graph():
    model = _model()
    x = torch.randn(5, 4)
    gm = torch.fx.symbolic_trace(model)
    result = record_run(model, x, graph_module=gm, onnx_model=build_onnx(model))
    assert result.keys() == ["eager", "graph", "onnx"]
    onnx_stage = result.onnx
    assert [c.name for c in onnx_stage] == ["linear", "act", "one", "add", "out", "sum_1"]
    assert [c.target for c in onnx_stage] == [
        "Gemm",
        "Relu",
        "Constant",
        "Add",
        "Gemm",
        "ReduceSum",
    ]
    gemm = onnx_stage["linear"][0]
    assert gemm.params.keys() == ["x", "linear.weight", "linear.bias"]
    assert gemm.params["linear.weight"].shape == (3, 4)
    assert gemm.retval.shape == (5, 3)
    # Kernel times from onnxruntime's profiler; constants are folded, they do not run.
    kernels = [c for c in onnx_stage if c.target != "Constant"]
    assert kernels and all(c.duration_ns is not None and c.duration_ns >= 0 for c in kernels)
    assert sum(c.duration_ns for c in kernels) > 0
    torch.testing.assert_close(gemm.retval.tensor, result.graph["linear"][0].retval.tensor)

    comparison = compare(result.graph, result.onnx)
    assert comparison.ok and first_divergence(result.graph, result.onnx) is None
    # linear, act, add, out, sum_1 matched; the Tensor.sum node has no other name.
    assert [c.name for c in comparison.calls] == ["linear", "act", "add", "out", "sum_1", "output"]
    assert max(c.max_abs_diff for c in comparison.calls) < 1e-5
    assert "no divergence" in repr(comparison)


def test_first_divergence_on_altered_onnx_node():
    model = _model()
    x = torch.randn(5, 4)
    altered = alter_add_constant(build_onnx(model), 1.5)
    result = record_run(model, x, graph_module=torch.fx.symbolic_trace(model), onnx_model=altered)
    divergence = result.first_divergence("graph", "onnx")
    assert divergence is not None
    assert divergence.name == "add"
    assert divergence.call_a.target == "operator.add" and divergence.call_b.target == "Add"
    # Every element is off by exactly the change of the constant.
    assert divergence.max_abs_diff == pytest.approx(0.5, abs=1e-6)
    assert divergence.reason == "15 of 15 elements beyond tolerance"
    text = repr(divergence)
    assert text.startswith("first divergence at 'add'")
    lines = text.splitlines()
    assert lines[1].split() == ["graph", "onnx"]
    graph_add = result.graph["add"][0].retval
    onnx_add = result.onnx["add"][0].retval
    min_row = next(line for line in lines if line.strip().startswith("min"))
    assert min_row.split()[1:] == [f"{graph_add.min:.6g}", f"{onnx_add.min:.6g}"]
    digest_row = next(line for line in lines if line.strip().startswith("digest"))
    assert graph_add.digest in digest_row and onnx_add.digest in digest_row
    # Eager and graph agree: the problem is in the ONNX model.
    assert result.first_divergence("eager", "graph") is None


def test_divergence_within_tolerance_is_not_reported():
    model = _model()
    x = torch.randn(5, 4)
    altered = alter_add_constant(build_onnx(model), 1.0 + 1e-4)
    result = record_run(
        model,
        x,
        graph_module=torch.fx.symbolic_trace(model),
        onnx_model=altered,
        stages=["graph", "onnx"],
    )
    comparison = result.compare("graph", "onnx")
    assert comparison.ok
    assert comparison.calls[2].name == "add"
    assert comparison.calls[2].max_abs_diff == pytest.approx(1e-4, rel=0.01)
    assert first_divergence(result.graph, result.onnx, atol=1e-5, rtol=0).name == "add"


def test_compare_two_runs_and_digest_only_comparison():
    model = _model()
    x = torch.randn(3, 4)
    run_a = record_run(model, x, stages=["eager"], keep_tensors=False)
    run_b = record_run(model, x, stages=["eager"], keep_tensors=False)
    assert compare(run_a, run_b, stage="eager").ok
    with torch.no_grad():
        model.out.bias.add_(0.25)
    run_c = record_run(model, x, stages=["eager"], keep_tensors=False)
    divergence = first_divergence(run_a, run_c, stage="eager")
    assert divergence.name == "out"
    assert divergence.reason == "digests differ (tensors not kept)"
    with pytest.raises(TypeError, match="two TraceStage or two TraceResult"):
        compare(run_a, run_c.eager)


def test_onnx_model_from_path_and_bad_inputs(tmp_path):
    model = _model()
    path = tmp_path / "model.onnx"
    onnx.save(build_onnx(model), path)
    result = record_run(model, torch.randn(2, 4), onnx_model=str(path), stages=["onnx"])
    assert len(result.onnx) == 6
    with pytest.raises(FileNotFoundError, match="does not exist"):
        record_run(model, torch.randn(2, 4), onnx_model=str(tmp_path / "no.onnx"), stages=["onnx"])
    with pytest.raises(ValueError, match=r"expects inputs \['x'\]"):
        record_run(
            model, torch.randn(2, 4), torch.randn(2), onnx_model=build_onnx(model), stages=["onnx"]
        )


def test_none_outputs_and_empty_tensors_compare_by_value():
    from yobx.torch.inspect.compare import compare_summaries
    from yobx.torch.inspect.values import summarize

    out = torch.randn(2, 3)
    # (out, None) against the ONNX model's single output: they agree
    assert compare_summaries(summarize((out, None)), summarize((out.clone(),)), 1e-4, 1e-4).ok
    # an empty tensor has no element to differ, whatever its dtype
    empty_a, empty_b = torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.int64)
    assert compare_summaries(summarize(empty_a), summarize(empty_b), 1e-4, 1e-4).ok
    # a value that differs still does
    assert not compare_summaries(summarize((out,)), summarize((out + 1,)), 1e-4, 1e-4).ok
    assert not compare_summaries(summarize((out, out)), summarize((out,)), 1e-4, 1e-4).ok
