"""The proxies' direct ``__torch_function__`` records what torch.fx's method records."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from yobx.torch.tracing import CustomTracer
from yobx.torch.tracing.core import proxy_dispatch
from yobx.torch.tracing.core.proxies import CustomProxy


class Calls(torch.nn.Module):
    """Functions and methods with atoms, tensors, flat and nested containers, kwargs."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((4,), 0.5))

    def forward(self, x, y):
        a = torch.add(x, y, alpha=2)
        b = torch.cat([a, x], dim=0)
        c = torch.stack((x, y, a))  # a flat tuple
        d = torch.cat([torch.stack([x, y])[0], a])  # nested calls
        e = F.relu(x) * self.scale + torch.where(x > 0, x, 0.0)
        f = x.transpose(0, 1).matmul(y)  # tensor methods
        g = torch.einsum("ij,ij->i", x, y)
        h = torch.nn.functional.pad(x, (1, 1))
        i = x.new_zeros(x.shape)  # a torch.Size-like argument: torch.fx's path
        j = torch.meshgrid([x[:, 0], y[0]], indexing="ij")[0]  # nested list: torch.fx's path
        return b.sum() + c.sum() + d.sum() + e.sum() + f.sum() + g.sum() + h.sum() + i + j.sum()


def _trace(direct: bool, monkeypatch) -> tuple[str, torch.nn.Module, torch.fx.Graph]:
    if not direct:
        monkeypatch.setattr(
            proxy_dispatch, "_tracer_of", lambda cls, values: proxy_dispatch._UNHANDLED
        )
    tracer = CustomTracer()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    graph = tracer.trace(
        Calls(), concrete_args={"x": x, "y": y}, dynamic_shapes={"x": {0: "n"}, "y": {0: "n"}}
    )
    monkeypatch.undo()
    return str(graph), tracer.traced_model, graph


def test_direct_path_records_torch_fx_nodes(monkeypatch):
    direct, model, graph = _trace(True, monkeypatch)
    fallback, _, _ = _trace(False, monkeypatch)
    assert direct == fallback
    gm = torch.fx.GraphModule(model, graph)
    for n in (2, 3, 6):
        x, y = torch.randn(n, 4), torch.randn(n, 4)
        torch.testing.assert_close(gm(x, y), Calls()(x, y))


def test_the_direct_path_handles_plain_arguments_only():
    graph = torch.fx.Graph()
    tracer = torch.fx.proxy.GraphAppendingTracer(graph)
    proxy = torch.fx.Proxy(graph.placeholder("x"), tracer)
    values = (1, 2.0, None, torch.float32, torch.ones(1), [proxy, 3], (proxy,), proxy)
    assert proxy_dispatch._tracer_of(torch.fx.Proxy, values) is tracer
    for other in ([[proxy]], torch.Size([2]), {"a": proxy}, object()):
        assert proxy_dispatch._tracer_of(torch.fx.Proxy, (other,)) is proxy_dispatch._UNHANDLED
    second = torch.fx.Proxy(
        graph.placeholder("y"), torch.fx.proxy.GraphAppendingTracer(torch.fx.Graph())
    )
    assert proxy_dispatch._tracer_of(torch.fx.Proxy, (proxy, second)) is proxy_dispatch._UNHANDLED


def test_proxies_of_two_tracers_raise_as_in_torch_fx():
    proxies = []
    for name in "ab":
        graph = torch.fx.Graph()
        tracer = torch.fx.proxy.GraphAppendingTracer(graph)
        proxies.append(CustomProxy(graph.placeholder(name), tracer))
    with pytest.raises(RuntimeError, match="multiple different tracers"):
        torch.add(*proxies)


def test_nodes_have_the_users_torch_fx_gives_them(monkeypatch):
    # CustomTracer.create_node sets the positional arguments after making the node
    # (skipping torch.fx's walk of them): the copy made by torch.fx's own
    # create_node has the same inputs and users, node for node
    _, _, graph = _trace(True, monkeypatch)
    copy = torch.fx.Graph()
    copy.output(copy.graph_copy(graph, {}))
    graph.lint()
    names = [[node.name for node in nodes] for nodes in (graph.nodes, copy.nodes)]
    assert names[0] == names[1]
    for ours, theirs in zip(graph.nodes, copy.nodes):
        assert [n.name for n in ours.all_input_nodes] == [n.name for n in theirs.all_input_nodes]
        # users in another order: the tracer inserts nodes before others (shapes)
        assert sorted(n.name for n in ours.users) == sorted(n.name for n in theirs.users)
        assert ours.args is not None and str(ours.args) == str(theirs.args)


def test_a_raw_symint_argument_warns_as_in_torch_fx():
    from yobx.torch.tracing.symbolic.symbolic import SymbolicDimensions

    size = SymbolicDimensions().dimension("n", 3)
    with pytest.warns(UserWarning, match="Raw SymInt"):
        CustomTracer().create_arg((1, size))


def test_find_proxy_returns_the_first_proxy_in_order():
    from yobx.torch.tracing.core.proxies import find_proxy

    tracer = CustomTracer()
    tracer.graph = torch.fx.Graph(tracer_cls=CustomTracer)
    a, b, c = (tracer.create_proxy("placeholder", name, (), {}) for name in "abc")
    assert find_proxy(1, [a, b], c) is a
    assert find_proxy((2, {"k": b}), [a]) is b
    assert find_proxy(slice(None, c), a) is c
    assert find_proxy(1, "x", [None]) is None


def test_a_proxy_over_a_node_of_another_graph_is_refused_with_its_fix():
    # the reference project's "simple proxy" test: torch.fx records x.length() in the
    # tracer's graph, reading a node that graph does not hold (its lint fails); here
    # the error says what happened and what to do
    graph = torch.fx.Graph()
    node = graph.create_node("placeholder", "tx", args=(), kwargs={}, name="txn")
    tracer = CustomTracer()
    tracer.graph = torch.fx.Graph(tracer_cls=CustomTracer)
    x = CustomProxy(node, tracer)
    with pytest.raises(torch.fx.proxy.TraceError, match="belongs to another graph.*create_proxy"):
        x.length()
    # a proxy the tracer creates over its own graph works
    own = tracer.create_proxy("placeholder", "tx", (), {})
    assert isinstance(own.length(), CustomProxy)
