"""The default pipeline regenerates its graph module's code once, and that code is the
graph's when it returns."""

from __future__ import annotations

import threading

import pytest
import torch

from yobx.torch.passes import run_default_passes
from yobx.torch.passes._targets import one_recompile, recompile_owner


class Model(torch.nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x[:, :] + 1


def _counting(monkeypatch, gm):
    calls = []
    original = gm.recompile

    def recompile():
        calls.append(1)
        return original()

    monkeypatch.setattr(gm, "recompile", recompile)
    return calls


def test_pipeline_recompiles_once_and_the_code_is_the_graphs(monkeypatch):
    gm = torch.fx.symbolic_trace(Model())
    calls = _counting(monkeypatch, gm)
    results = run_default_passes(gm.graph)
    assert results["remove_inplace"] > 0 and results["remove_unnecessary_slices"] > 0
    assert len(calls) == 1
    assert "mul_" not in gm.code and "getitem" not in gm.code
    x = torch.randn(3, 4)
    expected_input = x.clone().mul_(2)
    expected = Model()(x.clone())
    torch.testing.assert_close(gm(x), expected)
    torch.testing.assert_close(x, expected_input)


def test_nested_blocks_and_other_threads(monkeypatch):
    gm = torch.fx.symbolic_trace(Model())
    calls = _counting(monkeypatch, gm)
    seen_in_thread = []
    with one_recompile():
        with one_recompile():
            recompile_owner(gm.graph)
        recompile_owner(gm.graph)
        assert calls == []
        # another thread is not deferred by this thread's block
        thread = threading.Thread(target=lambda: seen_in_thread.append(recompile_owner(gm.graph)))
        thread.start()
        thread.join()
        assert len(calls) == 1
    assert len(calls) == 2


def test_error_still_recompiles_what_was_noted(monkeypatch):
    gm = torch.fx.symbolic_trace(Model())
    calls = _counting(monkeypatch, gm)
    with pytest.raises(RuntimeError, match="pass failed"):
        with one_recompile():
            recompile_owner(gm.graph)
            raise RuntimeError("pass failed")
    assert len(calls) == 1
    # the block is closed: the next call recompiles at once
    recompile_owner(gm.graph)
    assert len(calls) == 2
