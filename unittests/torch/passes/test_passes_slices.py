"""remove_unnecessary_slices at torch and aten level, and graph_erase_node."""

from __future__ import annotations

import operator

import pytest
import torch
from passes_capture import capture
from passes_test_helpers import assert_same

from yobx.torch.passes import graph_erase_node, remove_inplace, remove_unnecessary_slices

INT64_MAX = 9223372036854775807
X = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
X2 = torch.arange(42, dtype=torch.float32).reshape(2, 7, 3) - 5


def _slice_nodes(graph):
    return [
        n
        for n in graph.nodes
        if n.target in (operator.getitem, torch.ops.aten.slice.Tensor, "narrow")
    ]


class FullSlices(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        a = x[:]
        b = a[:, :]
        c = b[0:INT64_MAX]
        d = c[..., :]
        e = d[: d.shape[0], :, : d.size(2)]
        f = e.narrow(1, 0, e.shape[1])
        return f * 2


class PartialSlices(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        a = x[1:]
        b = x[:, :-1]
        c = x[..., ::2]
        d = x[: x.shape[1]]
        e = x.narrow(0, 0, 2)
        return a.sum() + b.sum() + c.sum() + d.sum() + e.sum()


def _check(gm, expected_removed, examples):
    expected = [gm(x.clone()) for x in examples]
    removed = remove_unnecessary_slices(gm.graph)
    gm.graph.lint()
    assert removed == expected_removed, gm.graph
    for x, e in zip(examples, expected):
        assert_same(e, gm(x.clone()))
    return gm


def test_torch_level_full_slices_removed():
    # six slices and the five nodes computing the sizes they use
    gm = _check(torch.fx.symbolic_trace(FullSlices()), 11, [X, X2])
    # the size nodes feeding the removed slices are gone too
    assert not _slice_nodes(gm.graph)
    assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_function", "output"]


def test_torch_level_partial_slices_kept():
    gm = torch.fx.symbolic_trace(PartialSlices())
    before = len(_slice_nodes(gm.graph))
    _check(gm, 0, [X, X2])
    assert len(_slice_nodes(gm.graph)) == before


def test_unknown_type_is_not_a_tensor_slice():
    # without annotation, x may be a list: x[:] copies it and a later append matters
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    full = graph.call_function(operator.getitem, (x, slice(None)))
    graph.call_method("append", (x, 1))
    graph.output(graph.call_function(len, (full,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert remove_unnecessary_slices(gm.graph) == 0
    assert gm([0, 1]) == 2


def test_metadata_inplace_user_keeps_slice():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.type = torch.Tensor
    full = graph.call_function(operator.getitem, (x, slice(None)))
    graph.call_method("unsqueeze_", (full, 0))
    graph.output((x, full))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert remove_unnecessary_slices(gm.graph) == 0
    a, b = gm(X.clone())
    assert a.shape == X.shape and b.shape == (1, *X.shape)


def _aten_graph():
    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    s0 = graph.call_function(aten.slice.Tensor, (x, 0, 0, INT64_MAX))
    s1 = graph.call_function(aten.slice.Tensor, (s0, 1, None, None, 1))
    size = graph.call_function(aten.sym_size.int, (s1, 2))
    s2 = graph.call_function(aten.slice.Tensor, (s1, 2, 0, size))
    kept = graph.call_function(aten.slice.Tensor, (s2, 1, 1, INT64_MAX))
    narrow = graph.call_function(aten.narrow.default, (kept, 0, 0, 2))
    clone1 = graph.call_function(aten.clone.default, (narrow,))
    clone2 = graph.call_function(aten.clone.default, (clone1,))
    same = graph.call_function(aten.copy_.default, (clone2, clone2))
    graph.output(graph.call_function(aten.mul.Tensor, (same, 2)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_aten_level_slices_and_copies():
    gm = _aten_graph()
    expected = gm(X.clone())
    # three full slices (+ the size node), one of two clones, the self copy_
    assert remove_unnecessary_slices(gm.graph) == 6
    gm.graph.lint()
    assert_same(expected, gm(X.clone()))
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    aten = torch.ops.aten
    assert targets == [aten.slice.Tensor, aten.narrow.default, aten.clone.default, aten.mul.Tensor]


@pytest.mark.parametrize("tool", ["export", "tracer"])
def test_meta_val_proves_full_slices(tool):
    class M(torch.nn.Module):
        def forward(self, x):
            n = x.shape[0]
            return x[:n, 1:] * 2, x.narrow(2, 0, x.shape[2]) + 1

    dims = ({0: torch.export.Dim("a", min=2), 2: torch.export.Dim("c", min=2)},)
    captured = capture(tool, M(), (X,), dims)
    gm = captured.module() if tool == "export" else captured
    graph = captured.graph_module.graph if tool == "export" else captured.graph
    examples = (X, X[:2, :, :3] - 1)
    expected = [gm(x.clone()) for x in examples]
    removed = remove_unnecessary_slices(graph)
    assert removed >= 1, graph
    gm = captured.module() if tool == "export" else captured
    for x, e in zip(examples, expected):
        assert_same(e, gm(x.clone()))


def test_slices_after_remove_inplace():
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor):
            x[:, :].add_(1.0)
            return x[:] * 2

    gm = torch.fx.symbolic_trace(M())
    expected_x = X.clone()
    expected = M()(expected_x)
    remove_inplace(gm.graph)
    assert remove_unnecessary_slices(gm.graph) >= 1
    x = X.clone()
    assert_same(expected, gm(x))
    assert_same(expected_x, x)


def test_erase_dead_chain():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(torch.sin, (x,))
    b = graph.call_function(torch.cos, (a,))
    shared = graph.call_function(torch.exp, (x,))
    c = graph.call_function(torch.add, (b, shared))
    d = graph.call_function(torch.mul, (c, 2))
    graph.output(shared)
    assert graph_erase_node(graph, d) == 4
    graph.lint()
    assert [n.name for n in graph.nodes] == ["x", "exp", "output"]


def test_erase_keeps_impure_and_used_nodes():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.neg, (x,))
    used = graph.call_function(torch.abs, (x,))
    graph.call_function(torch._assert, (True, "kept"))
    inplace = graph.call_function(torch.ops.aten.add_.Tensor, (y, 1))
    last = graph.call_function(torch.mul, (inplace, used))
    graph.output(used)
    assert graph_erase_node(graph, last) == 1
    graph.lint()
    kept = {n.target for n in graph.nodes}
    assert {torch.ops.aten.add_.Tensor, torch.abs, torch._assert} <= kept
    with pytest.raises(ValueError, match="still used"):
        graph_erase_node(graph, used)
    unused = graph.placeholder("unused")
    with pytest.raises(ValueError, match="placeholder"):
        graph_erase_node(graph, unused)
    del x


def test_tracer_graph_available_for_slices():
    class M(torch.nn.Module):
        def forward(self, x):
            return x[:, :][0 : x.shape[0]] + 1

    gm = capture("tracer", M(), (X,), ({0: torch.export.Dim("a", min=2)},))
    assert remove_unnecessary_slices(gm.graph) >= 2
    # another size of the dynamic dimension (the others are static: the graph checks them)
    for x in (X, torch.arange(40, dtype=torch.float32).reshape(2, 4, 5) - 5):
        assert_same(M()(x.clone()), gm(x.clone()))


class CutToAnotherSize(torch.nn.Module):
    """``y[: x.shape[0]]`` on a ``y`` of 2 rows: the whole of ``y`` from batch 2 on."""

    def forward(self, x, y):
        return y[: x.shape[0]] * 2


def test_a_slice_full_only_from_the_default_minimum_stays():
    # the default range of batch starts at 2, where the slice takes all of y; the
    # graph runs at batch 1 and 0 too, where it does not: removing it returned 2 rows
    from yobx.torch.tracing import CustomTracer

    model = CutToAnotherSize()
    y = torch.randn(2, 3)
    tracer = CustomTracer()
    graph = tracer.trace(
        model,
        concrete_args={"x": torch.randn(8, 3), "y": y},
        dynamic_shapes={"x": {0: "batch"}, "y": None},
    )
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    assert len(_slice_nodes(graph)) == 1
    for batch in (8, 2, 1, 0):
        x = torch.randn(batch, 3)
        assert_same(model(x, y), gm(x, y))


class BufferViewCopiedThenBaseZeroed(torch.nn.Module):
    """``y`` takes a copy of ``bv``, a buffer sharing the storage of ``b``, then ``b`` is
    zeroed (fuzz_passes seed 71420)."""

    def __init__(self):
        super().__init__()
        base = torch.linspace(-1, 1, 24).reshape(4, 6)
        self.register_buffer("b", base)
        self.register_buffer("bv", base[1])

    def forward(self, x, y):
        y.copy_(self.bv.t())
        self.b.zero_()
        return (y,)


def test_a_copy_of_a_view_of_a_buffer_is_kept():
    """``copy(y, bv.t())`` became ``bv.t()`` itself: the output then looked into the
    buffers' storage, which the write-back of ``b.zero_()`` (after the graph) zeroes,
    where eager returns the values ``y`` was given."""
    from yobx.torch.passes import run_default_passes

    model = BufferViewCopiedThenBaseZeroed()
    x = torch.randn(6)
    exported = torch.export.export(BufferViewCopiedThenBaseZeroed(), (x, torch.zeros(6)))
    run_default_passes(
        exported.graph_module.graph, mutations="outputs", exported_program=exported, exc=True
    )
    module = exported.module()
    for _ in range(2):
        y_eager, y_graph = torch.zeros(6), torch.zeros(6)
        assert_same(model(x, y_eager), module(x, y_graph))
        assert_same(y_eager, y_graph)
