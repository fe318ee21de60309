"""nn.Module's attributes are replaced on the traced modules' classes, not on nn.Module."""

from __future__ import annotations

import torch

from yobx.torch.tracing import CustomTracer
from yobx.torch.tracing.isolation.module_classes import class_level_targets, traced_module_classes

_NAMES = ("__call__", "__getattr__", "__setattr__")


def _trace(model, inputs, dynamic_shapes=None):
    tracer = CustomTracer()
    graph = tracer.trace(model, concrete_args=inputs, dynamic_shapes=dynamic_shapes)
    return tracer, torch.fx.GraphModule(tracer.traced_model, graph)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count += 1
        return torch.relu(self.linear(x))


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _Block()
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        seen.append({name: name in vars(torch.nn.Module) for name in _NAMES})
        seen.append({name: vars(torch.nn.Module)[name] for name in _NAMES})
        seen.append({name: name in vars(_Block) for name in _NAMES})
        # a module built here has no path in the model: traced through
        scale = torch.nn.Softmax(dim=-1)
        return scale(self.head(self.block(x)))


seen: list = []


def test_nn_module_is_left_alone_and_the_classes_restored():
    originals = {name: vars(torch.nn.Module)[name] for name in _NAMES}
    seen.clear()
    model = _Model()
    x = torch.randn(3, 4)
    expected = _Model()
    expected.load_state_dict(model.state_dict())
    tracer, gm = _trace(model, {"x": x}, {"x": {0: "batch"}})
    # nn.Module's attributes are its own while tracing: the model's classes had them
    assert seen[1] == originals
    assert seen[2] == dict.fromkeys(_NAMES, True)
    # and nothing is left on the classes afterwards
    for cls in (_Model, _Block, torch.nn.Linear, torch.nn.Softmax):
        assert not any(name in vars(cls) for name in _NAMES), cls
    assert {name: vars(torch.nn.Module)[name] for name in _NAMES} == originals
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == [
        "block.linear",
        "head",
    ]
    for batch in (3, 5):
        y = torch.randn(batch, 4)
        torch.testing.assert_close(gm(y), expected(y))
    # the buffer update is in the graph (it ran twice above, as eager did)
    torch.testing.assert_close(model.block.count, expected.block.count)


class _OwnCall(torch.nn.Linear):
    """A class with a ``__call__`` of its own: nn.Module is patched for it."""

    def __call__(self, *args, **kwargs):
        return super().__call__(*args, **kwargs) * 2


def test_a_class_with_its_own_call_is_reached_through_nn_module():
    model = torch.nn.Sequential(_OwnCall(4, 4), torch.nn.ReLU())
    with traced_module_classes(model):
        targets = class_level_targets("__call__")
        assert targets[0] is torch.nn.Module and _OwnCall not in targets
        assert torch.nn.ReLU in class_level_targets("__getattr__")
    _, gm = _trace(model, {"input": torch.randn(3, 4)}, {"input": {0: "batch"}})
    # its own __call__ ran, then nn.Module's, intercepted: a user class is traced through
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["1"]
    assert any(n.target is torch.nn.functional.linear for n in gm.graph.nodes)
    for batch in (2, 6):
        y = torch.randn(batch, 4)
        torch.testing.assert_close(gm(y), model(y))
    assert "__call__" not in vars(torch.nn.ReLU)


def test_outside_a_trace_nn_module_is_the_target():
    assert class_level_targets("__call__") == [torch.nn.Module]


class _Branches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x):
        # the branches call the model's modules from a nested trace
        return torch.cond(x.shape[0] > 4, lambda t: self.a(t), lambda t: self.b(t).relu(), (x,))


def test_modules_called_in_nested_traces_belong_to_the_nested_graph():
    model = _Branches()
    _, gm = _trace(model, {"x": torch.randn(3, 4)}, {"x": {0: "batch"}})
    for batch in (2, 3, 5, 8):
        y = torch.randn(batch, 4)
        torch.testing.assert_close(gm(y), model(y))
    assert not any(name in vars(torch.nn.Linear) for name in _NAMES)
