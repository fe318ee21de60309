"""A negative number raised to a traced power keeps its sign in the generated code."""

from __future__ import annotations

import operator

import torch

from yobx.torch.passes.negative_bases import negative_bases_as_nodes
from yobx.torch.tracing import CustomTracer


class AlternatingSigns(torch.nn.Module):
    """``(-1) ** arange``, as diffusers' Cosmos patch embedding writes it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("index", torch.arange(4))

    def forward(self, x):
        return x * (-1) ** self.index + (-2.0) ** torch.arange(x.shape[0]).unsqueeze(1)


def test_the_traced_graph_module_keeps_the_sign_of_a_negative_base():
    # torch.fx printed `-1 ** index`, which Python reads -(1 ** index): always -1
    model = AlternatingSigns()
    tracer = CustomTracer()
    graph = tracer.trace(
        model, concrete_args={"x": torch.randn(3, 4)}, dynamic_shapes={"x": {0: "batch"}}
    )
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    for batch in (3, 5, 1):
        x = torch.randn(batch, 4)
        torch.testing.assert_close(gm(x), model(x))


def test_a_graph_of_symbolic_trace_gets_the_same_rewrite():
    gm = torch.fx.symbolic_trace(AlternatingSigns())
    x = torch.randn(3, 4)
    assert not torch.allclose(gm(x), AlternatingSigns()(x))  # torch.fx's own code
    assert negative_bases_as_nodes(gm.graph) >= 1
    gm.recompile()
    torch.testing.assert_close(gm(x), AlternatingSigns()(x))
    bases = [n.args[0] for n in gm.graph.nodes if n.target is operator.pow]
    assert all(isinstance(b, torch.fx.Node) for b in bases)
