"""recompile_alone: a GraphModule's code regenerated from its graph, its submodules'
left as they are."""

import operator

import pytest
import torch

from yobx.torch.fx_code import recompile_alone


class Inner(torch.nn.Module):
    def forward(self, x):
        return x * 2


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x) + 1


def _nested() -> torch.fx.GraphModule:
    outer = torch.fx.symbolic_trace(Outer())
    outer.inner = torch.fx.symbolic_trace(Inner())
    return outer


def test_the_module_computes_its_new_graph_and_its_submodules_are_not_recompiled(monkeypatch):
    module = _nested()
    x = torch.randn(3)
    torch.testing.assert_close(module(x), x * 2 + 1)
    add = next(n for n in module.graph.nodes if n.target is operator.add)
    add.args = (add.args[0], 5)
    recompiled = []
    original = torch.fx.GraphModule.recompile

    def spy(self):
        recompiled.append(self)
        return original(self)

    monkeypatch.setattr(torch.fx.GraphModule, "recompile", spy)
    recompile_alone(module)
    assert recompiled == [module]  # not module.inner
    torch.testing.assert_close(module(x), x * 2 + 5)
    # the class's method is back for the next call
    assert "_recompile_submodules" not in vars(module)
    recompiled.clear()
    module.recompile()
    assert recompiled == [module, module.inner]


def test_the_method_is_restored_after_an_error(monkeypatch):
    module = _nested()

    def failing(self, *args, **kwargs):
        raise RuntimeError("codegen failed")

    monkeypatch.setattr(torch.fx.Graph, "python_code", failing)
    with pytest.raises(RuntimeError, match="codegen failed"):
        recompile_alone(module)
    assert "_recompile_submodules" not in vars(module)
