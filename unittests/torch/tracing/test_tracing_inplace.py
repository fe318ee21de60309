"""Behaviour 5: in-place operations and item assignment are recorded, not lost."""

import pytest
import torch

from ._helpers import check_trace

DYN = {"x": {0: "batch", 1: "seq"}}
OTHERS = [{"x": torch.randn(2, 7, 4)}, {"x": torch.randn(6, 3, 4)}]


class InPlace(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        y.add_(1)
        z = y * 2
        z += y
        z.clamp_(min=-1.0, max=3.0)
        w = torch.empty_like(z)
        w.copy_(z)
        w.mul_(0.5).exp_()
        return w, z


class ItemAssignment(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        mask = y > 0
        y[mask] = 0
        y[:, 0] = x[:, 1]
        n = x.shape[1] // 2
        y[..., :n, :] = 5.0
        y[0][1] = -1.0
        return y


class BufferUpdate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(x.sum(dim=(0, 1)))
        return x + self.count


class InputMutation(torch.nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


@pytest.mark.parametrize("remove_inplace", [False, True])
def test_inplace_methods_and_operators(remove_inplace):
    check_trace(
        InPlace(),
        {"x": torch.randn(3, 5, 4)},
        DYN,
        other_inputs=OTHERS,
        remove_inplace=remove_inplace,
    )


@pytest.mark.parametrize("remove_inplace", [False, True])
def test_item_assignment(remove_inplace):
    check_trace(
        ItemAssignment(),
        {"x": torch.randn(3, 5, 4)},
        DYN,
        other_inputs=OTHERS,
        remove_inplace=remove_inplace,
    )


def test_inplace_recorded_in_graph():
    _, graph, _ = check_trace(
        ItemAssignment(), {"x": torch.randn(3, 5, 4)}, DYN, remove_inplace=False
    )
    import operator

    setitems = [n for n in graph.nodes if n.target is operator.setitem]
    assert len(setitems) == 4


def test_buffer_updated_in_place():
    model, reference = BufferUpdate(), BufferUpdate()
    x = torch.randn(3, 5, 4)
    from ._helpers import trace_module

    tracer, graph, gm = trace_module(model, {"x": x}, DYN, remove_inplace=False)
    # tracing left the buffer untouched
    torch.testing.assert_close(model.count, torch.zeros(4))
    for case in (x, torch.randn(2, 7, 4)):
        torch.testing.assert_close(gm(case), reference(case))
    torch.testing.assert_close(model.count, reference.count)


def test_input_mutated_in_place():
    x = torch.randn(3, 5, 4)
    from ._helpers import trace_module

    _, _, gm = trace_module(InputMutation(), {"x": x.clone()}, DYN, remove_inplace=False)
    a, b = x.clone(), x.clone()
    torch.testing.assert_close(gm(a), InputMutation()(b))
    torch.testing.assert_close(a, b)


def test_buffer_written_while_a_plain_attribute_views_it():
    """An unregistered attribute viewing a buffer (a constant of the trace) sees the
    buffer's in-place update: the write is not moved after the read."""
    import copy

    from yobx.torch.tracing import CustomTracer

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", torch.zeros(4))
            self.alias = self.buf[:2]

        def forward(self, x):
            self.buf.add_(x.sum())
            return x[:2] * self.alias

    model = Model()
    traced = copy.deepcopy(model)
    tracer = CustomTracer()
    graph = tracer.trace(traced, concrete_args={"x": torch.ones(3)}, dynamic_shapes={"x": {0: "n"}})
    # x[:2] has 2 rows where n >= 2, 1 row at n = 1: a version each, writing into the
    # traced model's buffer in place (the view read after the write keeps it there)
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    for x in (torch.ones(3), torch.arange(5.0), torch.ones(1)):
        expected = model(x)
        torch.testing.assert_close(gm(x), expected)
        torch.testing.assert_close(traced.buf, model.buf)


def test_inplace_squeeze_of_an_input_sharing_a_dimension():
    # the runtime checks read the inputs' sizes as they were when the trace started
    # (the in-place squeeze changed the placeholder's fake value: an IndexError before)
    class M(torch.nn.Module):
        def forward(self, x, y):
            y.squeeze_(0)
            return x + y

    from ._helpers import trace_module

    dynamic = {"x": {0: "b", 1: "d"}, "y": {1: "d"}}
    _, _, gm = trace_module(M(), {"x": torch.randn(3, 4), "y": torch.randn(1, 4)}, dynamic)
    for b, d in ((3, 4), (2, 7), (5, 2)):
        x, y = torch.randn(b, d), torch.randn(1, d)
        y_eager, y_graph = y.clone(), y.clone()
        torch.testing.assert_close(gm(x, y_graph), M()(x, y_eager))
        assert y_graph.shape == y_eager.shape == (d,)


@pytest.mark.parametrize("dims", [(0,), (0, 1), (-2,)])
def test_inplace_squeeze_of_a_dynamic_dimension(dims):
    # torch's fake kernel of squeeze_ on a symbolic dimension kills the process (a
    # segmentation fault in torch 2.13): the tracer decides the dimension is not 1 and
    # leaves it as it is; the graph checks that decision when it runs
    class M(torch.nn.Module):
        def forward(self, x):
            x = x.clone()
            x.squeeze_(*dims)
            return x * 2

    inputs = {"x": torch.randn(3, 5)}
    others = [{"x": torch.randn(2, 5)}, {"x": torch.randn(4, 5)}]
    check_trace(M(), inputs, {"x": {0: "b"}}, other_inputs=others)


class UnboundInPlace(torch.nn.Module):
    """In-place methods called through the class, as ``map(torch.Tensor.zero_, ...)``
    would: on an input, a buffer, and a tensor built in ``forward`` taking a traced
    argument."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 4))

    def forward(self, x):
        torch.Tensor.mul_(x, 0.5)
        torch.Tensor.add_(self.scale, 1.0)
        total = torch.zeros(4)
        torch.Tensor.add_(total, x.sum(dim=0))
        torch.Tensor.clamp_(total, min=-1.0)
        return x * self.scale + total


@pytest.mark.parametrize("remove_inplace", [False, True])
def test_unbound_inplace_methods(remove_inplace):
    # the class's descriptor refuses anything but a tensor (a TypeError before):
    # torch.export captures these calls, running real tensors
    from ._helpers import trace_module

    model, reference = UnboundInPlace(), UnboundInPlace()
    _, graph, gm = trace_module(
        model, {"x": torch.randn(3, 4)}, {"x": {0: "n"}}, remove_inplace=remove_inplace
    )
    # tracing left the buffer as it was
    torch.testing.assert_close(model.scale, reference.scale)
    for n in (3, 5, 1):
        x = torch.randn(n, 4)
        x_graph, x_eager = x.clone(), x.clone()
        torch.testing.assert_close(gm(x_graph), reference(x_eager))
        # the input and the buffer are written as eager writes them
        torch.testing.assert_close(x_graph, x_eager)
        torch.testing.assert_close(model.scale, reference.scale)
    if remove_inplace:
        # functional, then the input's and the buffer's new values copied back
        writes = [n for n in graph.nodes if str(n.target).endswith("_")]
        assert [(n.target, n.args[0].op) for n in writes] == [
            ("copy_", "placeholder"),
            ("copy_", "get_attr"),
        ]
    # the class's methods are the originals again
    assert type(torch.Tensor.mul_).__name__ == "method_descriptor"
