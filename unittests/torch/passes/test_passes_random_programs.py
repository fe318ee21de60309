"""Randomized check: small programs mixing views, slices, in-place ops and item assignment,
captured with symbolic_trace, torch.export and CustomTracer, cleaned, compared with eager."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from passes_capture import capture, tracer_available
from passes_test_helpers import assert_runs_alike, eager_run, has_inplace, run_graph_module

from yobx.torch.passes import remove_inplace, remove_unnecessary_slices

VIEWS = {
    "rows": lambda v: v[1:],
    "cols": lambda v: v[:, 1:-1],
    "row0": lambda v: v[0],
    "t": lambda v: v.t(),
    "narrow": lambda v: v.narrow(0, 0, 2),
    "unsqueeze": lambda v: v.unsqueeze(0),
    "ellipsis": lambda v: v[..., ::2],
    "full": lambda v: v[:, :],
}
INPLACE = {
    "add": lambda v, y: v.add_(1.5),
    "mul": lambda v, y: v.mul_(-2.0),
    "clamp": lambda v, y: v.clamp_(-1.0, 1.0),
    "fill": lambda v, y: v.fill_(0.25),
    "zero": lambda v, y: v.zero_(),
    "sigmoid": lambda v, y: v.sigmoid_(),
    "add_y": lambda v, y: v.add_(y.sum()),
}
SETITEM = {
    "first": lambda v: v.__setitem__(0, 3.0),
    "mask": lambda v: v.__setitem__(v > 0.5, -1.0),
    "slice": lambda v: v.__setitem__((Ellipsis, slice(None, 2)), 0.5),
}


class Program(torch.nn.Module):
    """Interprets a list of operations over a growing list of tensor variables."""

    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        variables = [x]
        for kind, source, name in self.ops:
            v = variables[source % len(variables)]
            if kind == "view":
                variables.append(VIEWS[name](v))
            elif kind == "inplace":
                INPLACE[name](v, y)
            elif kind == "setitem":
                SETITEM[name](v)
            else:
                variables.append(v * 2 + 1)
        # multiplying reads every variable at the end, after all the writes
        return tuple(v * 1 for v in variables)


OPS = st.one_of(
    st.tuples(st.just("view"), st.integers(0, 8), st.sampled_from(sorted(VIEWS))),
    st.tuples(st.just("inplace"), st.integers(0, 8), st.sampled_from(sorted(INPLACE))),
    st.tuples(st.just("setitem"), st.integers(0, 8), st.sampled_from(sorted(SETITEM))),
    st.tuples(st.just("fresh"), st.integers(0, 8), st.just("")),
)
X = torch.arange(30, dtype=torch.float32).reshape(5, 6) / 9 - 1.2
Y = torch.linspace(-1, 1, 6)


def _check_tool(tool, model, args, others):
    try:
        captured = capture(tool, model, args)
    except pytest.skip.Exception:
        return False
    if isinstance(captured, torch.export.ExportedProgram):
        remove_inplace(captured.graph_module.graph, exported_program=captured)
        remove_unnecessary_slices(captured.graph_module.graph)
        assert not has_inplace(captured.graph_module.graph)
        for example in (args, *others):
            module = captured.module()
            clone_args = tuple(a.clone() for a in example)
            out = module(*clone_args)
            expected = eager_run(model, example)
            assert_runs_alike(expected, (out, clone_args, {}), [])
        return True
    remove_inplace(captured.graph)
    remove_unnecessary_slices(captured.graph)
    assert not has_inplace(captured.graph)
    captured.graph.lint()
    for example in (args, *others):
        assert_runs_alike(eager_run(model, example), run_graph_module(captured, example), [])
    return True


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(st.lists(OPS, min_size=2, max_size=7))
def test_random_programs(ops):
    model = Program(tuple(ops))
    try:
        eager_run(model, (X, Y))
    except (RuntimeError, IndexError):
        # views of views may become too small for the next operation: not a program
        return
    others = ((X.flip(0) * 0.7, Y.flip(0)),)
    tools = ["export"]
    if not any(kind == "setitem" for kind, _, _ in ops):
        tools.append("symbolic_trace")
    if tracer_available():
        tools.append("tracer")
    for tool in tools:
        _check_tool(tool, model, (X, Y), others)
