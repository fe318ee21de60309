"""ONNX values are matched to graph nodes by name only when both come from one capture."""

import onnx
import torch

from yobx.torch.inspect import first_divergence, record_run
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.export import GRAPH_FINGERPRINT_KEY
from yobx.torch.tracing import CustomTracer, graph_fingerprint


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        # one capture (a slice of `seq` would have versions for its sizes 0 and 1,
        # whose values are named in subgraphs)
        return torch.nn.functional.relu(y[..., :3]).sum(-1) + x.shape[0]


DYN = {"x": {0: "batch", 1: "seq"}}


def _capture(x, dynamic_shapes):
    tracer = CustomTracer()
    graph = tracer.trace(Model(), concrete_args={"x": x}, dynamic_shapes=dynamic_shapes)
    return graph


def test_fingerprint_is_stable_and_tells_captures_apart():
    x = torch.randn(3, 5, 4)
    torch.manual_seed(0)
    a = graph_fingerprint(_capture(x, DYN))
    b = graph_fingerprint(_capture(x, DYN))
    static = graph_fingerprint(_capture(x, None))
    assert a == b
    assert a != static


def test_to_onnx_stores_the_fingerprint_of_its_capture():
    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(3, 5, 4)
    result = to_onnx(model, (x,), dynamic_shapes=DYN)
    stored = {p.key: p.value for p in result.model_proto.metadata_props}
    assert stored[GRAPH_FINGERPRINT_KEY] == graph_fingerprint(_capture(x, DYN))


def test_onnx_value_named_after_a_graph_node_holds_that_node_value():
    torch.manual_seed(0)
    model = Model().eval()
    result = to_onnx(model, (torch.randn(3, 5, 4),), dynamic_shapes=DYN)
    ranks = {
        n.name: n.meta["val"].dim()
        for n in result.graph_module.graph.nodes
        if isinstance(n.meta.get("val"), torch.Tensor)
    }
    proto = onnx.shape_inference.infer_shapes(result.model_proto)
    infos = {v.name: v for v in (*proto.graph.value_info, *proto.graph.output)}
    checked = 0
    for name, rank in ranks.items():
        if name in infos and infos[name].type.tensor_type.HasField("shape"):
            assert len(infos[name].type.tensor_type.shape.dim) == rank, name
            checked += 1
    assert checked > 0


def test_onnx_from_another_capture_is_not_matched_by_name():
    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(3, 5, 4)
    static_onnx = to_onnx(model, (x,)).model_proto
    result = record_run(model, x, onnx_model=static_onnx, dynamic_shapes=DYN)
    assert any("another capture" in note for note in result.onnx.notes)
    assert all(call.name.startswith("onnx:") for call in result.onnx)
    assert first_divergence(result.graph, result.onnx) is None

    same_onnx = to_onnx(model, (x,), dynamic_shapes=DYN).model_proto
    result = record_run(model, x, onnx_model=same_onnx, dynamic_shapes=DYN)
    assert result.onnx.notes == []
    onnx_names = {call.name for call in result.onnx}
    output = next(n for n in result.graph_module.graph.nodes if n.op == "output")
    intermediate = [
        n.name
        for n in result.graph_module.graph.nodes
        if n.op in ("call_function", "call_method", "call_module")
        and isinstance(n.meta.get("val"), torch.Tensor)
        and n not in output.all_input_nodes
    ]
    # every intermediate tensor of the graph has its ONNX value, under the same name
    assert intermediate and all(name in onnx_names for name in intermediate), [
        name for name in intermediate if name not in onnx_names
    ]
    assert first_divergence(result.graph, result.onnx) is None


class HalfOfTheSequence(torch.nn.Module):
    """Versions for ``seq`` 1 and 0 (``y[:, : seq // 2]``), which ``to_onnx``'s capture,
    checking no sizes itself, merges into one branch."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.nn.functional.relu(self.lin(x)[:, : x.shape[1] // 2]).sum(-1)


def test_onnx_of_the_same_capture_with_versions_is_matched_by_name():
    # record_run captured with runtime checks, which keep every version apart: its
    # fingerprint differed from to_onnx's and the note said "another capture" (a false
    # alarm, for any model with versions that merge: a decoder with a cache)
    torch.manual_seed(0)
    model = HalfOfTheSequence().eval()
    x = torch.randn(3, 5, 4)
    exported = to_onnx(model, (x,), dynamic_shapes=DYN).model_proto
    result = record_run(model, x, onnx_model=exported, dynamic_shapes=DYN)
    assert result.onnx.notes == []
    assert first_divergence(result.graph, result.onnx) is None
