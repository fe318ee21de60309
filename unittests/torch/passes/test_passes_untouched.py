"""Graphs none of the default passes can change skip them, with the same results."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from yobx.torch import passes
from yobx.torch.passes import (
    DEFAULT_PASSES,
    WRITE_BACK_KEY,
    _untouched,
    pipeline,
    run_default_passes,
    untouched_by_default_passes,
)
from yobx.torch.tracing import CustomTracer

FUNCTIONS = sorted(_untouched._FUNCTIONS, key=lambda f: f"{f.__module__}.{f.__name__}")
METHODS = sorted(_untouched._METHODS)


def _graph(op: str, target, kwargs=None) -> torch.fx.Graph:
    """``output(target(a, b))`` on two float tensors."""
    graph = torch.fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    for node in (a, b):
        node.meta["val"] = torch.randn(3, 4)
    graph.output(graph.create_node(op, target, (a, b), kwargs or {}))
    return graph


def _passes_change_nothing(graph: torch.fx.Graph) -> bool:
    """The passes themselves (not the shortcut) leave the graph as it is, refusing nothing."""
    before = str(graph)
    results = pipeline._run(graph, "write_back", False, True, 0, None)
    return str(graph) == before and all(r == 0 and not r.refused for r in results.values())


@pytest.mark.parametrize("target", FUNCTIONS, ids=lambda f: f"{f.__module__}.{f.__name__}")
def test_listed_functions_are_left_alone_by_the_passes(target):
    graph = _graph("call_function", target)
    assert untouched_by_default_passes(graph)
    assert _passes_change_nothing(graph)


@pytest.mark.parametrize("name", METHODS)
def test_listed_methods_are_left_alone_by_the_passes(name):
    graph = _graph("call_method", name)
    assert untouched_by_default_passes(graph)
    assert _passes_change_nothing(graph)


class _Relu(nn.Module):
    def __init__(self, inplace: bool):
        super().__init__()
        self.act = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=inplace))

    def forward(self, x):
        return self.act(x) * 2


@pytest.mark.parametrize(
    "case",
    [
        ("call_method", "add_", None),
        ("call_method", "clone", None),
        ("call_method", "copy_", None),
        ("call_function", operator.getitem, None),
        ("call_function", operator.iadd, None),
        ("call_function", torch.add, {"out": "b"}),
        ("call_function", F.relu, None),  # not listed: it has an inplace= parameter
        ("call_function", F.dropout, None),
    ],
    ids=lambda case: f"{case[1] if isinstance(case[1], str) else case[1].__name__}-{case[2]}",
)
def test_other_operations_go_through_the_passes(case):
    op, target, kwargs = case
    graph = _graph(op, target)
    if kwargs:
        node = next(n for n in graph.nodes if n.op == op)
        node.kwargs = {"out": next(iter(graph.nodes))}
    assert not untouched_by_default_passes(graph)


def test_a_module_with_an_in_place_child_goes_through_the_passes():
    for inplace, expected in ((False, True), (True, False)):
        model = _Relu(inplace)
        tracer = CustomTracer()
        graph = tracer.trace(model, concrete_args={"x": torch.randn(2, 4)}, remove_inplace=False)
        assert untouched_by_default_passes(graph, tracer.traced_model) is expected


def test_a_write_back_of_an_earlier_run_goes_through_the_passes():
    graph = _graph("call_method", "add")
    assert untouched_by_default_passes(graph)
    next(n for n in graph.nodes if n.op == "call_method").meta[WRITE_BACK_KEY] = True
    assert not untouched_by_default_passes(graph)


def test_subgraphs_go_through_the_passes():
    class Model(nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda t: t.add_(1), lambda t: t * 2, (x.clone(),))

    tracer = CustomTracer()
    graph = tracer.trace(Model(), concrete_args={"x": torch.randn(3)}, remove_inplace=False)
    assert not untouched_by_default_passes(graph, tracer.traced_model)


def test_shortcut_gives_the_results_of_the_passes(monkeypatch):
    # a traced model of listed operations and plain modules, with its runtime checks:
    # the same graph with and without the shortcut, which matches eager
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten()).eval()
    x = torch.randn(2, 3, 6, 6)
    graphs, results = [], []
    for shortcut in (True, False):
        if not shortcut:
            # the tracer's own shortcut and the pipeline's
            monkeypatch.setattr(passes, "untouched_by_default_passes", lambda *args: False)
            monkeypatch.setattr(pipeline, "untouched_by_default_passes", lambda *args: False)
        tracer = CustomTracer()
        graph = tracer.trace(model, concrete_args={"input": x}, dynamic_shapes={"input": {0: "b"}})
        graphs.append(str(graph))
        results.append(run_default_passes(graph, module=tracer.traced_model))
        gm = torch.fx.GraphModule(tracer.traced_model, graph)
        for batch in (1, 2, 5):
            y = torch.randn(batch, 3, 6, 6)
            torch.testing.assert_close(gm(y), model(y))
    assert graphs[0] == graphs[1]
    assert "check_constraint" in graphs[0]
    for result in results:
        assert list(result) == list(DEFAULT_PASSES)
        assert all(r == 0 and not r.refused for r in result.values())


def test_the_tracer_skips_the_passes_on_an_untouched_graph(monkeypatch):
    calls = []
    monkeypatch.setattr(pipeline, "_run", lambda *args: calls.append(args))
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    CustomTracer().trace(model, concrete_args={"input": torch.randn(2, 4)})
    assert calls == []
