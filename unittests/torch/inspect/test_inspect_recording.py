"""record_run on a small model: call order, values, access, cleanup."""

import threading

import pytest
import torch

from yobx.torch.inspect import TraceCall, record_run, recording, tensor_digest


class SmallModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.act = torch.nn.ReLU()
        self.out = torch.nn.Linear(3, 2)

    def forward(self, x, scale: float = 1.0):
        y = self.act(self.linear(x)) + 1
        return self.out(y).sum(dim=-1) * scale


class FailingModel(SmallModel):
    def forward(self, x):
        y = self.act(self.linear(x))
        if y.sum() > -1:  # always: the failure happens after some leaf calls
            raise RuntimeError("boom")
        return y


def _model():
    torch.manual_seed(0)
    return SmallModel().eval()


def _all_hooks(model):
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._forward_hooks_with_kwargs)
        for m in model.modules()
    )


def test_eager_and_graph_call_order_shapes_and_digests():
    model = _model()
    x = torch.randn(5, 4)
    result = record_run(model, x, graph_module=torch.fx.symbolic_trace(model))
    assert result.keys() == ["eager", "graph"]
    assert [c.name for c in result.eager] == ["linear", "act", "out"]
    assert [c.target for c in result.eager] == ["Linear", "ReLU", "Linear"]
    assert [c.name for c in result.graph] == ["linear", "act", "add", "out", "sum_1", "mul"]
    assert [c.kind for c in result.graph][:3] == ["call_module", "call_module", "call_function"]
    assert result.graph["add"][0].target == "operator.add"
    assert result.graph["sum_1"][0].target == "Tensor.sum"

    with torch.no_grad():
        expected_linear = model.linear(x)
        expected_act = model.act(expected_linear)
        expected = model(x)
    linear = result.eager["linear"][0]
    assert linear.params["input"].shape == (5, 4)
    assert linear.params["input"].digest == tensor_digest(x)
    assert linear.retval.shape == (5, 3)
    assert linear.retval.digest == tensor_digest(expected_linear)
    torch.testing.assert_close(linear.retval.tensor, expected_linear)
    # The graph computes the same values: same digests for the same nodes.
    assert result.graph["act"][0].retval.digest == tensor_digest(expected_act)
    assert result.graph.outputs[0].digest == tensor_digest(expected)
    assert result.eager.outputs[0].digest == tensor_digest(expected)
    assert all(c.duration_ns > 0 for c in result.graph)
    assert result.graph.total_duration_ns == sum(c.duration_ns for c in result.graph)


def test_graph_params_are_named_after_the_schema():
    model = _model()
    result = record_run(torch.fx.symbolic_trace(model), torch.randn(2, 4))
    add = result.graph["add"][0]
    assert add.params.keys() == ["a", "b"]  # operator.add's signature
    assert add.params["b"].value == 1
    sum_call = result.graph["sum_1"][0]
    assert sum_call.params.keys() == ["self", "dim"]
    assert sum_call.params["dim"].value == -1


def test_access_by_index_name_attribute_and_dir():
    model = _model()
    result = record_run(torch.fx.symbolic_trace(model), torch.randn(3, 4))
    stage = result["graph"]
    assert result.graph is stage
    assert stage[3] is stage.calls[3] and stage[3].name == "out"
    assert stage[-1].name == "mul"
    assert [c.name for c in stage[1:3]] == ["act", "add"]
    assert stage["act"] == stage.act and len(stage["act"]) == 1
    call = stage.act[0]
    assert isinstance(call, TraceCall)
    assert call["input"] is call.params["input"] is call.params.input
    assert "graph" in dir(result)
    assert {"linear", "act", "add", "out"} <= set(dir(stage))
    assert "input" in dir(call) and "input" in dir(call.params)
    assert "stage 'graph': 6 calls" in repr(stage)
    assert "param input: float32[3x3]" in repr(call)


def test_wrong_keys_raise_and_list_valid_ones():
    result = record_run(torch.fx.symbolic_trace(_model()), torch.randn(3, 4))
    with pytest.raises(KeyError, match=r"Did you mean 'graph'\?.*Valid keys: graph"):
        result["grap"]
    with pytest.raises(KeyError, match="Valid keys: linear, act, add, out, sum_1, mul"):
        result.graph["relu"]
    with pytest.raises(AttributeError, match="Valid keys: linear, act"):
        result.graph.relu
    with pytest.raises(KeyError, match="Valid keys: input"):
        result.graph.act[0].params["x"]
    with pytest.raises(KeyError, match="Valid keys: input"):
        result.graph.act[0]["x"]
    with pytest.raises(IndexError):
        result.graph[100]
    assert not hasattr(result, "onnx")


def test_several_input_sets_and_keyword_inputs():
    model = _model()
    x1, x2 = torch.randn(2, 4), torch.randn(6, 4)
    # symbolic_trace keeps ``scale`` as an input; CustomTracer makes Python scalars constants.
    result = record_run(
        model,
        x1,
        inputs=[(x2,), {"x": x2, "scale": 2.0}],
        graph_module=torch.fx.symbolic_trace(model),
    )
    assert len(result.inputs) == 3
    for stage in result:
        assert [c.run for c in stage["linear"]] == [0, 1, 2]
        assert [c.retval.shape for c in stage["linear"]] == [(2, 3), (6, 3), (6, 3)]
        assert len(stage.outputs) == 3 and len(stage.run_durations_ns) == 3
    with torch.no_grad():
        expected = model(x2, scale=2.0)
    torch.testing.assert_close(result.graph.outputs[2].tensor, expected)
    torch.testing.assert_close(result.eager.outputs[2].tensor, expected)


def test_graph_module_given_directly_and_max_calls():
    gm = torch.fx.symbolic_trace(_model())
    result = record_run(gm, torch.randn(2, 4), max_calls=2, keep_tensors=False)
    assert result.keys() == ["graph"]
    assert [c.name for c in result.graph] == ["linear", "act"]
    assert result.graph.dropped_calls == 4
    assert "(+4 not recorded)" in result.graph.summary_line()
    assert result.graph.outputs[0].digest is not None
    assert not result.graph[0].retval.has_tensor


def test_record_run_traces_with_custom_tracer_when_available():
    model = _model()
    x = torch.randn(3, 4)
    result = record_run(model, x)
    gm = result.graph_module
    assert isinstance(gm, torch.fx.GraphModule)
    with torch.no_grad():
        torch.testing.assert_close(result.graph.outputs[0].tensor, model(x))
    assert any(n.meta.get("val") is not None for n in gm.graph.nodes if n.op != "output")


def test_instrumentation_removed_after_exception():
    model = FailingModel().eval()
    before = _all_hooks(model)
    with pytest.raises(RuntimeError, match="boom") as info:
        record_run(model, torch.randn(2, 4), stages=["eager"])
    assert _all_hooks(model) == before == 0
    assert recording._ACTIVE is None
    partial = info.value.yobx_trace_result
    assert [c.name for c in partial.eager] == ["linear", "act"]
    # The lock was released: another recording works, the model runs unhooked.
    assert len(record_run(_model(), torch.randn(2, 4), stages=["eager"]).eager) == 3
    assert _all_hooks(model) == 0


def test_invalid_arguments():
    with pytest.raises(ValueError, match="valid stages are"):
        record_run(_model(), torch.randn(2, 4), stages=["eagre"])
    with pytest.raises(ValueError, match="needs an ONNX model"):
        record_run(_model(), torch.randn(2, 4), stages=["graph", "onnx"])
    with pytest.raises(TypeError, match=r"expects a torch\.nn\.Module"):
        record_run(lambda x: x, torch.randn(2))


def test_nested_recording_refused_and_other_threads_not_recorded():
    model = _model()
    seen = {}

    class Outer(torch.nn.Module):
        def forward(self, x):
            with pytest.raises(RuntimeError, match="cannot be nested"):
                record_run(model, x, stages=["eager"])
            # Another thread runs the model's leaf module while recording: not recorded.
            thread = threading.Thread(target=lambda: seen.setdefault("y", model.linear(x)))
            thread.start()
            thread.join()
            return model.linear(x)

    outer = Outer()
    outer.model = model  # makes model.linear a leaf of outer
    result = record_run(outer, torch.randn(2, 4), stages=["eager"])
    assert seen["y"].shape == (2, 3)
    assert [c.name for c in result.eager] == ["model.linear"]


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x, extra):
        return torch.relu(self.linear(x)) + extra[0].sum() * extra[1]["w"].mean()


def test_input_sets_of_other_sizes_run_through_one_traced_graph():
    # the graph is traced on the first set: the axes whose size differs are dynamic,
    # not refused by a graph traced for the first sizes only
    model = _Scaled()
    sets = [
        (torch.randn(5, 4), [torch.randn(3), {"w": torch.randn(2, 2)}]),
        (torch.randn(2, 4), [torch.randn(6), {"w": torch.randn(2, 7)}]),
    ]
    result = record_run(model, *sets[0], inputs=[sets[1]])
    assert result.compare("eager", "graph").first_divergence is None
    calls = result.graph.calls
    assert {tuple(c.retval.tensor.shape) for c in calls if c.name == "linear"} == {
        (5, 3),
        (2, 3),
    }
    expected = model(*sets[1])
    last = [c for c in calls if c.run == 1][-1]
    torch.testing.assert_close(last.retval.tensor, expected)


def test_varying_dynamic_shapes_declares_only_the_axes_that_differ():
    from yobx.torch.inspect.varying_sizes import varying_dynamic_shapes

    dynamic = torch.export.Dim.DYNAMIC
    runs = [
        {"x": torch.zeros(5, 4), "extra": [torch.zeros(3), {"w": torch.zeros(2, 2)}], "n": 1},
        {"x": torch.zeros(2, 4), "extra": [torch.zeros(3), {"w": torch.zeros(2, 7)}], "n": 2},
    ]
    assert varying_dynamic_shapes(runs) == {
        "x": {0: dynamic},
        "extra": [None, {"w": {1: dynamic}}],
        "n": None,
    }
    assert varying_dynamic_shapes(runs[:1]) is None
    assert varying_dynamic_shapes([runs[0], runs[0]]) is None
