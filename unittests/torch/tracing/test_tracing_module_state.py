"""Assignments to module attributes in forward: eager semantics, user module untouched."""

from __future__ import annotations

import pytest
import torch
from torch.fx.proxy import TraceError

from yobx.torch.tracing import CustomTracer


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        x.add_(1)
        self.count += 1
        self.last = x  # a cache attribute, set during forward
        return x * self.count


class Rebinding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.ones(1, 4))

    def forward(self, x):
        self.state = self.state * 0.5 + x.mean(0, keepdim=True)
        return x + self.state


def _trace(model, x, dynamic=True):
    tracer = CustomTracer()
    graph = tracer.trace(
        model, concrete_args={"x": x}, dynamic_shapes={"x": {0: "batch"}} if dynamic else None
    )
    return torch.fx.GraphModule(tracer.traced_model, graph)


def test_buffer_and_input_updates_keep_eager_semantics():
    model = Counter()
    buffer = model.count
    gm = _trace(model, torch.ones(2, 3))
    # the user's module is as it was: same buffer object, no new attribute
    assert model.count is buffer and float(buffer) == 0.0
    assert "last" not in model.__dict__
    # the graph returns what the model returns and has the same side effects
    reference = Counter()
    for batch in (2, 5):
        x_eager, x_graph = torch.ones(batch, 3), torch.ones(batch, 3)
        expected, got = reference(x_eager), gm(x_graph)
        assert isinstance(got, torch.Tensor)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(x_graph, x_eager)
        torch.testing.assert_close(model.count, reference.count)


def test_buffer_rebinding_becomes_a_copy():
    model, reference = Rebinding(), Rebinding()
    gm = _trace(model, torch.randn(3, 4))
    assert "copy_" in str(gm.graph)
    for batch in (3, 6, 2):
        x = torch.randn(batch, 4)
        torch.testing.assert_close(gm(x), reference(x))
        torch.testing.assert_close(model.state, reference.state)


def test_buffer_rebinding_to_another_shape_is_refused():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("state", torch.ones(4))

        def forward(self, x):
            self.state = x.sum(0)[:2]
            return x

    model = Model()
    with pytest.raises(TraceError, match="can only update a buffer in place"):
        _trace(model, torch.randn(3, 4))
    assert isinstance(model.state, torch.Tensor) and model.state.shape == (4,)


def test_hooks_installed_by_the_traced_call_are_removed():
    """transformers installs output-capturing hooks on a model's first call: when that
    call is the traced one, the model must not keep them (a later eager call would
    install them again and return every hidden state twice)."""

    class Counted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.seen = []

        def forward(self, x):
            if not getattr(self, "_installed", False):
                self._installed = True
                self.lin.register_forward_hook(lambda m, i, o: self.seen.append(o))
            return self.lin(x)

    model = Counted()
    hooks_before = dict(model.lin._forward_hooks)
    tracer = CustomTracer()
    tracer.trace(model, concrete_args={"x": torch.randn(2, 3)})
    assert dict(model.lin._forward_hooks) == hooks_before
    assert not hasattr(model, "_installed") and model.seen == []
    model(torch.randn(2, 3))
    assert len(model.seen) == 1


def test_containers_filled_or_emptied_by_the_traced_call_are_restored():
    class Bookkeeping(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.calls, self.names, self.tags = [1], {"a": 1}, {"x"}
            self.empty_list, self.empty_dict, self.empty_set = [], {}, set()

        def forward(self, x):
            self.calls.append(2)
            self.names["b"] = 2
            self.tags.clear()
            self.empty_list.append(x)
            self.empty_dict["x"] = x
            self.empty_set.add(3)
            self.lin._forward_pre_hooks[0] = lambda m, i: None
            return self.lin(x)

    model = Bookkeeping()
    containers = [model.calls, model.names, model.tags, model.empty_list]
    CustomTracer().trace(model, concrete_args={"x": torch.randn(2, 3)})
    assert [model.calls, model.names, model.tags] == [[1], {"a": 1}, {"x"}]
    assert (model.empty_list, model.empty_dict, model.empty_set) == ([], {}, set())
    assert len(model.lin._forward_pre_hooks) == 0
    assert [model.calls, model.names, model.tags, model.empty_list] == containers
    assert all(
        a is b for a, b in zip([model.calls, model.names, model.tags, model.empty_list], containers)
    )


class TransposesItsBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.arange(24.0).reshape(4, 6))

    def forward(self, x):
        self.b.t_()
        self.b.mul_(2.0)
        if x.shape[0] > 3:
            return x + self.b.sum()
        return x - 1


def test_a_buffer_reshaped_in_place_by_an_eager_run_is_put_back():
    """Capturing the other side of a decision runs the model eagerly at a size taking
    it; the model's forward transposes its buffer in place: the buffer gets its shape,
    strides and values back (before, putting the values back raised)."""
    model = TransposesItsBuffer()
    before = model.b.clone()
    tracer = CustomTracer()
    tracer.trace(model, concrete_args={"x": torch.randn(5, 6)}, dynamic_shapes={"x": {0: "n"}})
    assert len(tracer.versions) == 2
    assert model.b.shape == (4, 6) and model.b.stride() == (6, 1)
    torch.testing.assert_close(model.b, before)


class ScalesItsWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(6))

    def forward(self, x):
        with torch.no_grad():
            self.w.mul_(2.0)
            self.w.data[0] = 5.0
        if x.shape[0] > 3:
            return x * self.w
        return x - self.w


def test_a_parameter_written_by_an_eager_run_is_put_back():
    """The eager run capturing the other side of a decision writes into a parameter
    (under no_grad): the parameter gets its values back (it was doubled before)."""
    model = ScalesItsWeight()
    tracer = CustomTracer()
    tracer.trace(model, concrete_args={"x": torch.randn(5, 6)}, dynamic_shapes={"x": {0: "n"}})
    assert len(tracer.versions) == 2
    torch.testing.assert_close(model.w.detach(), torch.ones(6))


def test_preserved_parameters_copies_only_what_is_written():
    from yobx.torch.tracing.isolation.parameter_writes import preserved_parameters

    model = torch.nn.Linear(4, 3)
    weight, bias = model.weight.detach().clone(), model.bias.detach().clone()
    with pytest.raises(ValueError), torch.no_grad(), preserved_parameters(model):
        model.weight[1].zero_()  # through a view
        torch.add(model.bias, 1.0, out=model.bias)  # out=
        model.weight.t_()  # the geometry too
        raise ValueError("the block raises: the parameters are put back anyway")
    torch.testing.assert_close(model.weight.detach(), weight)
    assert model.weight.stride() == weight.stride()
    torch.testing.assert_close(model.bias.detach(), bias)


def test_an_interrupt_while_parameters_are_put_back_puts_them_back_first(monkeypatch):
    """An interrupt landing while the copies are written back: they are all written,
    then the interrupt is raised."""
    from yobx.torch.tracing.isolation import parameter_writes

    model = torch.nn.Linear(3, 2)
    weight = model.weight.detach().clone()
    writes = parameter_writes._FirstWrites(list(model.parameters()))
    with writes, torch.no_grad():
        model.weight.mul_(3.0)
    interrupted = []
    original = torch.Tensor.copy_

    def copy_once_interrupted(self, *args, **kwargs):
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", copy_once_interrupted)
    with pytest.raises(KeyboardInterrupt):
        writes.put_back()
    monkeypatch.undo()
    torch.testing.assert_close(model.weight.detach(), weight)
