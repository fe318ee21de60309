"""Behaviours 1 and 2: every node knows its value; dynamic dimensions stay symbolic."""

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from yobx.torch.tracing import CustomProxyInt, CustomProxyShape, CustomTracer
from yobx.torch.tracing.constraints.runtime_checks import RUNTIME_CHECK

from ._helpers import check_trace

DYN = {"x": {0: "batch", 1: "seq"}}


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 8)

    def forward(self, x):
        y = torch.relu(self.lin(x))
        return y.transpose(1, 2).sum(-1)


class _TwoLines(torch.nn.Module):
    def forward(self, x):
        shifted = x + 1
        return self.double(shifted) + self.double(x)

    def double(self, x):
        return x * 2


def test_stack_traces_name_each_nodes_own_line():
    # the texts are remembered per (code, line): each node still gets its own line,
    # in every trace
    x = torch.randn(3, 4)
    for _ in range(2):
        _, graph, _ = check_trace(_TwoLines(), {"x": x}, {"x": {0: "n"}})
        traces = [
            n.meta["stack_trace"]
            for n in graph.nodes
            if n.op == "call_function" and not n.meta.get(RUNTIME_CHECK)
        ]
        assert len(traces) == 4, traces
        assert "shifted = x + 1" in traces[0] and "in forward" in traces[0]
        assert all("return x * 2" in t and "in double" in t for t in traces[1:3])
        assert "return self.double(shifted) + self.double(x)" in traces[3]
        assert all(__file__ in t for t in traces)


def test_every_node_has_val_and_stack_trace():
    x = torch.randn(3, 5, 4)
    tracer, graph, _ = check_trace(Mlp(), {"x": x}, DYN, other_inputs=[{"x": torch.randn(6, 2, 4)}])
    for node in graph.nodes:
        if node.op == "output":
            continue
        assert "val" in node.meta, node
        if node.meta.get(RUNTIME_CHECK):
            continue  # the graph checking its inputs' sizes, not the model's code
        if node.op in ("call_function", "call_method", "call_module"):
            assert __file__ in node.meta["stack_trace"], node.meta["stack_trace"]
    placeholder = next(n for n in graph.nodes if n.op == "placeholder")
    assert placeholder.meta["example_value"] is not None
    torch.testing.assert_close(placeholder.meta["example_value"], x)
    assert isinstance(placeholder.meta["val"], FakeTensor)
    last = next(n for n in graph.nodes if n.op == "call_method" and n.target == "sum")
    assert tracer.dims.render(last.meta["val"].shape[0]) == "batch"
    assert last.meta["val"].shape[1] == 8


class Queries(torch.nn.Module):
    """Records metadata of intermediates computed from shapes."""

    seen: list = []

    def forward(self, x):
        y = x.reshape(x.shape[0] * x.shape[1], -1)
        seen = {
            "shape": y.shape,
            "size": y.size(),
            "size0": y.size(0),
            "size1": y.size(1),
            "dim": y.dim(),
            "ndim": y.ndim,
            "dtype": y.dtype,
            "device": y.device,
            "numel": y.numel(),
        }
        Queries.seen.append(seen)
        return y * 2


def test_metadata_exact_for_intermediates():
    x = torch.randn(3, 5, 4)
    Queries.seen.clear()
    tracer, _, _ = check_trace(Queries(), {"x": x}, DYN, other_inputs=[{"x": torch.randn(2, 7, 4)}])
    seen = Queries.seen[0]  # the call made while tracing
    assert isinstance(seen["shape"], CustomProxyShape)
    assert len(seen["shape"]) == 2
    assert seen["shape"][1] == 4 and isinstance(seen["shape"][1], int)
    assert isinstance(seen["size0"], CustomProxyInt)
    assert tracer.dims.render(seen["size0"].val) == "batch*seq"
    assert seen["size1"] == 4
    assert seen["dim"] == 2 and seen["ndim"] == 2
    assert seen["dtype"] == torch.float32
    assert seen["device"] == torch.device("cpu")
    assert tracer.dims.render(seen["numel"].val) == "4*batch*seq"


class Static(torch.nn.Module):
    def forward(self, x):
        assert isinstance(x.shape, torch.Size)
        n = x.shape[-1]
        assert isinstance(n, int)
        return x / math.sqrt(n)


def test_static_dimensions_are_plain_ints():
    check_trace(Static(), {"x": torch.randn(2, 16)})


class SameName(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def test_same_name_same_symbol():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    tracer, graph, _ = check_trace(
        SameName(),
        {"x": x, "y": y},
        {"x": {0: "batch"}, "y": {0: "batch"}},
        other_inputs=[{"x": torch.randn(5, 4), "y": torch.randn(5, 4)}],
    )
    ph = [n for n in graph.nodes if n.op == "placeholder"]
    assert ph[0].meta["val"].shape[0] is ph[1].meta["val"].shape[0] or str(
        ph[0].meta["val"].shape[0]
    ) == str(ph[1].meta["val"].shape[0])
    assert tracer.dimension_names == {str(ph[0].meta["val"].shape[0]): "batch"}


class Arithmetic(torch.nn.Module):
    def forward(self, x):
        b, s = x.shape[0], x.shape[1]
        total = b * s + b - 1 + s // 2 + s % 3 + max(b, s) + min(b, 2)
        last = x.shape[-2]
        return torch.zeros(total, last, x.shape[-1] - 2)


def test_dimension_arithmetic_stays_symbolic():
    x = torch.randn(3, 5, 4)
    tracer, graph, gm = check_trace(
        Arithmetic(), {"x": x}, DYN, other_inputs=[{"x": torch.randn(4, 9, 4)}]
    )
    zeros = next(n for n in graph.nodes if n.target is torch.zeros)
    rendered = tracer.dims.render(zeros.meta["val"].shape[0])
    assert "batch" in rendered and "seq" in rendered, rendered
    targets = {n.target for n in graph.nodes if n.op == "call_function"}
    assert torch.sym_max in targets and torch.sym_min in targets


class ShapeTuple(torch.nn.Module):
    def forward(self, x):
        shape = x.shape
        dims = [d for d in shape]
        head = shape[:-1]
        out = x.reshape(*head, 2, -1)
        new_shape = (1, *shape[1:]) + (1,)  # noqa: RUF005 - tuple concatenation is tested
        grown = x[:1].reshape(new_shape)
        listed = [*shape, 1]
        return out.sum(-1), grown, x.reshape(listed).squeeze(-1) + len(dims)


def test_shape_behaves_like_a_tuple():
    check_trace(
        ShapeTuple(), {"x": torch.randn(3, 5, 4)}, DYN, other_inputs=[{"x": torch.randn(2, 6, 4)}]
    )


def test_two_tracers_one_after_the_other():
    x = torch.randn(3, 5, 4)
    mlp, arithmetic = Mlp(), Arithmetic()
    t1 = CustomTracer()
    g1 = t1.trace(mlp, concrete_args={"x": x}, dynamic_shapes=DYN)
    t2 = CustomTracer()
    g2 = t2.trace(arithmetic, concrete_args={"x": x}, dynamic_shapes=DYN)
    assert t1.shape_env is not t2.shape_env
    # each graph computes its own model, at another size too
    for tracer, graph, model in ((t1, g1, mlp), (t2, g2, arithmetic)):
        gm = torch.fx.GraphModule(tracer.traced_model, graph)
        for example in (x, torch.randn(2, 6, 4)):
            torch.testing.assert_close(gm(example), model(example))


class _AutocastRegion(torch.nn.Module):
    def __init__(self, enabled: bool):
        super().__init__()
        self.enabled = enabled

    def forward(self, x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.enabled):
            y = x @ w  # the autocast line
        return y + 1


def test_an_autocast_region_is_refused_at_its_line():
    # the graph records no autocast region: it would compute in float32 where this
    # code computes in bfloat16 (silently other values): refused, naming the line
    from yobx.torch.tracing import TracingError

    inputs = {"x": torch.randn(3, 4), "w": torch.randn(4, 5)}
    with pytest.raises(TracingError, match="autocast") as info:
        CustomTracer().trace(
            _AutocastRegion(True), concrete_args=inputs, dynamic_shapes={"x": {0: "n"}}
        )
    assert info.value.location.startswith(__file__)
    assert not torch.is_autocast_enabled("cpu")
    # under the caller's autocast too
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TracingError):
        CustomTracer().trace(
            _AutocastRegion(False), concrete_args=inputs, dynamic_shapes={"x": {0: "n"}}
        )


def test_a_disabled_autocast_region_traces():
    # transformers' rotary embeddings force float32 with autocast(enabled=False)
    check_trace(
        _AutocastRegion(False),
        {"x": torch.randn(3, 4), "w": torch.randn(4, 5)},
        {"x": {0: "n"}},
        other_inputs=[{"x": torch.randn(6, 4), "w": torch.randn(4, 5)}],
    )
