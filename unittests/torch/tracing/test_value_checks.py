"""Checks on tensor values (``assert``, ``torch._check``) are graph nodes: the graph
raises where eager raises, and is exact where the check holds.

PYTEST_DONT_REWRITE: the models' ``assert`` statements must stay Python's (pytest's
rewriting of a test module's asserts is not what model code runs).
"""

import pytest
import torch
from torch.fx.proxy import TraceError

from yobx.torch.tracing.constraints.value_checks import asserting, check_value

from ._helpers import assert_same, trace_module


class Lengths(torch.nn.Module):
    def forward(self, x, lengths):
        assert lengths.max() <= x.shape[1], "too long"
        n = lengths.min().item()
        torch._check(n >= 0)
        assert (lengths >= 0).all()
        return x[:, :1] * lengths[:, None]


def test_checks_on_values_raise_where_eager_raises():
    model = Lengths()
    example = {"x": torch.randn(2, 5), "lengths": torch.tensor([3, 4])}
    dynamic = {"x": {0: "b", 1: "s"}, "lengths": {0: "b"}}
    tracer, graph, gm = trace_module(model, example, dynamic)
    checks = [n for n in graph.nodes if n.target is check_value]
    assert len(checks) == 3
    assert 'assert lengths.max() <= x.shape[1], "too long"' in checks[0].args[1]
    assert checks[1].args[1] == "torch._check(n >= 0)"
    assert all(__file__ in n.args[2] for n in checks)
    # `x[:, :1]` has no column at s = 0, whose version no capture takes (the witness's
    # lengths fail the assert there): checked rather than one column, as the graph made
    assert [c.expression for c in tracer.constraints] == ["s >= 1"]
    x = torch.randn(3, 6)
    good = torch.tensor([1, 2, 6])
    assert_same(model(x, good), gm(x, good))
    for bad, line in [(torch.tensor([1, 2, 7]), "too long"), (torch.tensor([1, -2, 3]), "n >= 0")]:
        with pytest.raises((AssertionError, RuntimeError)):
            model(x, bad)
        with pytest.raises(AssertionError, match=line):
            gm(x, bad)


class Branch(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


def test_a_branch_on_values_is_still_refused():
    with pytest.raises(TraceError, match="data-dependent"):
        trace_module(Branch(), {"x": torch.randn(2, 3)}, {"x": {0: "b"}})


def test_asserting_reads_the_bytecode():
    import sys

    seen = []

    class Probe:
        def __bool__(self):
            seen.append(asserting(sys._getframe(1)))
            return True

    assert Probe()
    if Probe():
        pass
    assert Probe(), "message"
    assert seen == [True, False, True]
    assert not asserting(None)
