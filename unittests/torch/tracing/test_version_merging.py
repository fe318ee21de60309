"""Versions computing alike share one branch of the joined graph
(yobx.torch.tracing.constraints.version_merging); the graph stays exact on every side."""

import onnxruntime
import pytest
import sympy
import torch

from yobx.torch.onnx import to_onnx
from yobx.torch.tracing.constraints.version_merging import _simple, computes_alike
from yobx.torch.tracing.graph_operators import CondCCOp

from ._helpers import assert_same, trace_module

_DIMS = {"x": {0: "batch", 1: "seq"}, "cache": {0: "batch", 1: "past"}}


class EmptyCache(torch.nn.Module):
    """A cache step reading its length as transformers' ``get_seq_length`` does:
    ``0`` for an empty cache, its size otherwise, the same number either way."""

    def forward(self, x, cache):
        past = 0 if cache.numel() == 0 else cache.shape[1]
        keys = torch.cat([cache, x], dim=1)
        positions = torch.arange(past, past + x.shape[1], dtype=x.dtype)
        return keys * 2, x + positions[None, :, None]


class SingleToken(torch.nn.Module):
    """A decision that changes what is computed: a single token takes another path."""

    def forward(self, x, cache):
        past = 0 if cache.shape[1] == 0 else cache.shape[1]
        keys = torch.cat([cache, x], dim=1)
        if x.shape[1] == 1:
            return keys * 3, x.sum(dim=1) + past
        return keys * 2, x.mean(dim=1) + past


class SqueezedRow(torch.nn.Module):
    """Both sides call the same operators, but ``squeeze(1)`` drops the axis of one row
    only: the versions differ in their shapes and must not merge."""

    def forward(self, x, cache):
        n = 1 if x.shape[1] == 1 else x.shape[1]
        y = x.squeeze(1).reshape(x.shape[0], -1)
        return y * n, cache + 1


def _inputs(batch: int, seq: int, past: int) -> dict:
    return {"x": torch.randn(batch, seq, 4), "cache": torch.randn(batch, past, 4)}


_SIZES = [(2, 3, 5), (2, 3, 0), (1, 1, 0), (3, 1, 4), (2, 5, 1), (1, 2, 0)]


def _conds(graph: torch.fx.Graph) -> int:
    return sum(isinstance(n.target, CondCCOp) for n in graph.nodes if n.op == "call_function")


def _graphs(tracer) -> int:
    """How many versions' graphs the joined graph chooses between (1: no choice)."""
    names = [name for name, _ in tracer.traced_model.named_modules() if "version_" in name]
    return len(names) or 1


def _check_every_side(model, gm) -> None:
    """The joined graph matches eager on sizes selecting every version."""
    for sizes in _SIZES:
        inputs = _inputs(*sizes)
        assert_same(model(**inputs), gm(**inputs))


def _trace(model, inputs):
    return trace_module(model, inputs, _DIMS, tracer_kwargs={"runtime_checks": False})


def test_the_versions_of_an_empty_cache_share_the_branch_of_the_others():
    model = EmptyCache()
    tracer, graph, gm = _trace(model, _inputs(2, 3, 5))
    # an empty cache: no row (past < 1) or no batch (batch < 1)
    general, no_batch, no_row = tracer.versions
    assert "batch < 1" in no_batch.when and "past < 1" in no_row.when
    assert general.computed_by is None and no_row.computed_by is general
    assert "computed by version 1's graph" in str(no_row)
    # without a batch, the positions start at 0 instead of past: another graph
    assert no_batch.computed_by is None
    assert _conds(graph) == 1 and _graphs(tracer) == 2
    _check_every_side(model, gm)


def test_versions_computing_otherwise_keep_their_branch():
    model = SingleToken()
    tracer, graph, gm = _trace(model, _inputs(2, 3, 5))
    merged = [v for v in tracer.versions if v.computed_by is not None]
    # past = 0 merges into past >= 1 for each side of seq == 1; seq == 1 stays apart
    assert len(tracer.versions) == 4 and len(merged) == 2, [str(v) for v in tracer.versions]
    assert all(v.computed_by.computed_by is None for v in merged)
    assert _conds(graph) == 1 and _graphs(tracer) == 2
    _check_every_side(model, gm)


def test_versions_whose_shapes_differ_at_the_pinned_size_keep_their_branch():
    model = SqueezedRow()
    tracer, graph, gm = _trace(model, _inputs(2, 3, 5))
    assert len(tracer.versions) == 2
    assert all(v.computed_by is None for v in tracer.versions)
    assert not computes_alike(*tracer.versions) and not computes_alike(*tracer.versions[::-1])
    assert _conds(graph) == 1 and _graphs(tracer) == 2
    _check_every_side(model, gm)


def test_a_graph_checking_its_inputs_keeps_every_version():
    """With runtime checks, each version checks what it assumes: nothing is merged."""
    model = EmptyCache()
    tracer, graph, gm = trace_module(model, _inputs(2, 3, 5), _DIMS)
    assert len(tracer.versions) == 3 and _graphs(tracer) == 3
    assert all(v.computed_by is None for v in tracer.versions)
    _check_every_side(model, gm)


@pytest.mark.parametrize("model", [EmptyCache(), SingleToken(), SqueezedRow()])
def test_merged_versions_export_exact_at_every_side(model):
    inputs = _inputs(2, 3, 5)
    result = to_onnx(model, (), inputs, dynamic_shapes=_DIMS, validate=True)
    assert result.validation.ok, result.validation.format()
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    for sizes in _SIZES:
        case = _inputs(*sizes)
        expected = model(**case)
        got = session.run(None, {n: case[n].numpy() for n in names})
        for e, g in zip(expected, got):
            torch.testing.assert_close(torch.from_numpy(g), e, atol=1e-5, rtol=1e-5)


def test_a_choice_on_a_division_is_not_evaluated_outside_its_side():
    s, p = sympy.symbols("seq past", integer=True)
    assert _simple(sympy.Or(sympy.Ge(p, 1), sympy.Eq(s, 1)))
    assert not _simple(sympy.Ge(sympy.floor(s / p), 2))
    assert not _simple(sympy.Ge(s * p**-1, 2))


class OneKey(torch.nn.Module):
    """As transformers' masks: a decision on the single token that computes the same
    (``is_causal`` with a mask), the empty cache read as ``0``, and a path of its own for
    a single key (an empty cache and one token)."""

    def forward(self, x, cache):
        past = 0 if cache.shape[1] == 0 else cache.shape[1]
        scale = 1 if (x.shape[1] != 1 and cache is None) else 2
        keys = torch.cat([cache, x], dim=1)
        if keys.shape[1] == 1:
            return keys * 3, x + 1
        return keys * scale, x + past


def test_a_version_computing_as_one_side_of_the_next_choice_joins_its_condition():
    """The single token with a cache computes as the first version, which sits behind
    the next choice (one key or more): the first version takes both conditions at once
    (`seq == 1 or past + seq != 1`); the empty cache keeps its own choice, the tree not
    being a list of choices (see version_merging)."""
    model = OneKey()
    tracer, graph, gm = _trace(model, _inputs(2, 3, 5))
    first, one_key, single_token, *empty = tracer.versions
    assert "seq == 1" in single_token.when and single_token.computed_by is first
    assert all(v.computed_by is None for v in (first, one_key, *empty))
    assert _graphs(tracer) == len(tracer.versions) - 1
    # one choice, at the top or in a choice's graph, joins two conditions
    nodes = [*_cond_nodes(tracer), *(n for n in graph.nodes if isinstance(n.target, CondCCOp))]
    conditions = [str(n.meta.get("yobx_version_condition")) for n in nodes]
    assert any("|" in c for c in conditions), conditions
    _check_every_side(model, gm)


def _cond_nodes(tracer) -> list:
    """The ``cond`` nodes of the joined graph's choices, nested ones included."""
    graphs = [m.graph for _, m in tracer.traced_model.named_modules() if hasattr(m, "graph")]
    return [n for g in graphs for n in g.nodes if isinstance(n.target, CondCCOp)]
