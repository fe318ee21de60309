"""Issue 5: robust tracing (RobustTracer, recursive_trace, GraphCollection)."""

import builtins
import os

import pytest
import torch

from yobx.torch.tracing import RobustTracer, recursive_trace
from yobx.torch.tracing.constraints.runtime_checks import RUNTIME_CHECK
from yobx.torch.tracing.robust.collection import GraphCollection

from ._helpers import assert_same

HERE = os.path.abspath(__file__)


def _line(marker: str) -> str:
    """``file:line`` of the line of this file ending with comment ``marker``."""
    with open(HERE) as f:
        for i, line in enumerate(f, start=1):
            if line.rstrip().endswith(f"# {marker}"):
                return f"{HERE}:{i}"
    raise AssertionError(marker)


def _robust(model, inputs, dynamic_shapes=None):
    tracer = RobustTracer()
    graph = tracer.trace(model, inputs, dynamic_shapes=dynamic_shapes)
    return tracer, graph, torch.fx.GraphModule(tracer.traced_model, graph)


def _check_graphs(collection: GraphCollection) -> int:
    """Every graph of the collection gives eager's outputs on its recorded inputs."""
    count = 0
    for module in collection:
        args, kwargs = collection.inputs(module)
        expected = module(*args, **kwargs)
        got = collection.graph_module(module)(*args, **kwargs)
        assert_same(expected, got)
        count += 1
    return count


def _call_targets(graph):
    return [n.target for n in graph.nodes if n.op == "call_module"]


# models


class Undecidable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.shape[0] > 4:  # UNDECIDABLE
            return self.lin(x)
        return -self.lin(x)


class ValueBranch(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # VALUE-BRANCH
            return x * 2
        return x - 1


class Sandwich(torch.nn.Module):
    def __init__(self, middle):
        super().__init__()
        self.pre = torch.nn.Linear(4, 4)
        self.middle = middle
        self.post = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.post(self.middle(self.pre(x)) + x)


class LenChild(torch.nn.Module):
    def forward(self, x):
        # a decision on the index (every other row negated): no scan, the loop needs
        # its number of steps
        rows = [x[i] if i % 2 else -x[i] for i in range(len(x))]  # LEN
        return torch.stack(rows)


class LenModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.child = LenChild()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.child(x + 1)) * 2


def third_party(x):
    if type(x) is not torch.Tensor:
        raise NotImplementedError("third_party only accepts a plain torch.Tensor")  # THIRD
    return x.clone() * 3


class Helper(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) + x.shape[-1]


class Level3(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.helper = Helper()

    def forward(self, x):
        return third_party(self.helper(x))


class Level2(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.level3 = Level3()

    def forward(self, x):
        y = self.level3(x) + 1
        assert (y > -1e6).all()  # ASSERT
        return y


class Level1(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.level2 = Level2()

    def forward(self, x):
        y = self.level2(x)
        return torch.from_numpy(y.detach().numpy()) * 2  # NUMPY


class Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.level1 = Level1()
        self.out = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.level1(x) - x)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class Containers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), ValueBranch(), Block()])
        self.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 3), "b": torch.nn.Linear(4, 3)})

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.heads["a"](x)


class WithUnused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = Block()
        self.never = Block()
        self.broken = LenChild()

    def forward(self, x, use_never: bool = False):
        y = self.used(x)
        if use_never:
            y = self.never(y)
        return self.broken(y) + 1


# behaviour


def test_middle_submodule_with_undecidable_branch():
    model = Sandwich(Undecidable())
    x = torch.randn(3, 4)
    batch = torch.export.Dim("batch")  # a named Dim adopts nothing: the branch fails
    tracer, graph, gm = _robust(model, {"x": x}, {"x": {0: batch}})
    # the module fails, not the model
    assert tracer.is_failed(model.middle)
    assert not tracer.is_failed(model)
    assert tracer.failure(model.middle).location == _line("UNDECIDABLE")
    assert "batch <= 4" in tracer.failure_msg(model.middle)
    assert 'Dim("batch", max=4)' in tracer.failure_msg(model.middle)
    assert tracer.failure_msg(model.pre) is None
    assert _call_targets(graph) == ["pre", "middle", "post"]
    # the leaf's meta["val"] comes from a fake run that keeps the batch symbolic
    node = next(n for n in graph.nodes if n.target == "middle")
    assert isinstance(node.meta["val"].shape[0], torch.SymInt)
    # the branch the leaf's shape relies on is reported
    assert any(g.reason == "specialized" and "batch" in g.expression for g in tracer.guards)
    for n in (3, 7):
        xn = torch.randn(n, 4)
        torch.testing.assert_close(gm(xn), model(xn))
    # recursively: the middle module gets its own (static) graph
    collection = recursive_trace(model, {"x": x}, {"x": {0: batch}})
    assert list(collection) == [model, model.middle]
    assert collection.status(model) == "traced"
    assert collection.status(model.middle) == "failed"
    assert collection.status("middle.lin") == "leaf"
    assert collection.failure_location(model.middle) == _line("UNDECIDABLE")
    assert _check_graphs(collection) == 2


def test_value_branch_leaf_uses_the_example_output():
    model = Sandwich(ValueBranch())
    x = torch.randn(3, 4)
    tracer, graph, gm = _robust(model, {"x": x})
    assert tracer.is_failed(model.middle)
    assert tracer.failure(model.middle).location == _line("VALUE-BRANCH")
    assert "data-dependent" in tracer.failure_msg(model.middle)
    assert any(g.reason == "example" and "middle" in g.expression for g in tracer.guards)
    torch.testing.assert_close(gm(x), model(x))
    torch.testing.assert_close(gm(-x.abs() - 1), model(-x.abs() - 1))
    collection = recursive_trace(model, {"x": x})
    # the module's own code fails: it is called as a whole, no graph of its own
    assert collection.is_failed(model.middle)
    assert model.middle not in collection
    with pytest.raises(KeyError, match="no graph"):
        collection[model.middle]
    assert _check_graphs(collection) == 1


def test_len_of_proxy_fails_locally():
    model = LenModel()
    x = torch.randn(3, 4)
    tracer, graph, gm = _robust(model, {"x": x}, {"x": {0: "batch"}})
    assert tracer.is_failed(model.child)
    assert not tracer.is_failed(model)
    # len(x) stays symbolic, range() needs a Python int: batch would become static
    assert "range()" in tracer.failure_msg(model.child)
    assert tracer.failure(model.child).location == _line("LEN")
    assert tracer.failure(model.child).error_type == "SpecializationError"
    assert _call_targets(graph) == ["child", "lin"]
    assert "child" in tracer.failures
    torch.testing.assert_close(gm(x), model(x))
    collection = recursive_trace(model, {"x": x}, {"x": {0: "batch"}})
    # with the recorded (static) input, len() is a plain int: the child traces alone
    assert list(collection) == [model, model.child]
    assert _check_graphs(collection) == 2
    child_graph = collection[model.child]
    assert not _call_targets(child_graph)


def test_nested_failures_three_levels():
    model = Nested()
    x = torch.randn(2, 4)
    tracer, graph, gm = _robust(model, {"x": x})
    assert tracer.is_failed(model.level1)
    assert _call_targets(graph) == ["level1", "out"]
    torch.testing.assert_close(gm(x), model(x))

    collection = recursive_trace(model, {"x": x})
    level1, level2, level3 = model.level1, model.level1.level2, model.level1.level2.level3
    helper = level3.helper
    for module, marker, error in (
        (level1, "NUMPY", "TracingError"),
        (level2, "ASSERT", "TracingError"),
        (level3, "THIRD", "NotImplementedError"),
    ):
        assert collection.is_failed(module), module
        assert collection.failure_location(module) == _line(marker)
        assert collection.failure_msg(module).startswith(error)
        assert collection.entry(module).failure.error_type == error
    assert "plain torch.Tensor" in collection.failure_msg(level3)
    assert collection.entry(level3).path == "level1.level2.level3"
    # what can be captured is: the root and the helper three levels down
    assert list(collection) == [model, helper]
    assert collection.status(helper) == "traced"
    assert collection.status(helper.lin) == "leaf"
    assert collection.status(model.out) == "leaf"
    assert _check_graphs(collection) == 2


def test_module_list_and_module_dict():
    model = Containers()
    x = torch.randn(3, 4)
    tracer, graph, gm = _robust(model, {"x": x})
    assert tracer.is_failed(model.blocks[1])
    assert not tracer.is_unvisited(model.blocks)
    assert not tracer.is_unvisited(model.heads)
    assert tracer.is_unvisited(model.heads["b"])
    assert set(tracer.unvisited_modules()) == {"heads.b"}
    assert "blocks.1" in _call_targets(graph)
    torch.testing.assert_close(gm(x), model(x))

    collection = recursive_trace(model, {"x": x})
    statuses = {e.path: e.status for e in collection.entries()}
    assert statuses == {
        "": "traced",
        "blocks": "container",
        "blocks.0": "inlined",
        "blocks.0.lin": "leaf",
        "blocks.1": "failed",
        "blocks.2": "inlined",
        "blocks.2.lin": "leaf",
        "heads": "container",
        "heads.a": "leaf",
        "heads.b": "unvisited",
    }
    assert _check_graphs(collection) == 1


def test_unvisited_child_and_report():
    model = WithUnused()
    x = torch.randn(3, 4)
    tracer, graph, gm = _robust(model, {"x": x}, {"x": {0: "batch"}})
    assert tracer.is_unvisited(model.never)
    assert tracer.is_unvisited(model.never.lin)
    assert not tracer.is_unvisited(model.used)
    assert not tracer.is_unvisited(model.broken)
    assert tracer.is_failed(model.broken)
    torch.testing.assert_close(gm(x), model(x))

    collection = recursive_trace(model, {"x": x}, {"x": {0: "batch"}})
    assert collection.is_unvisited(model.never)
    assert collection.is_unvisited("never.lin")
    assert not collection.is_unvisited(model.used)
    assert collection.is_failed(model.broken)
    assert _check_graphs(collection) == 2

    text = str(collection)
    lines = text.splitlines()
    assert lines[0] == (
        "WithUnused: 6 modules (1 traced, 1 inlined, 1 leaf, 1 failed, 2 unvisited), 2 graphs"
    )
    assert lines[2].split() == ["path", "type", "status", "graph", "location", "failure"]
    rows = {r["path"]: r for r in collection.rows()}
    assert rows["<root>"]["status"] == "traced"
    assert rows["never"] == {
        "path": "never",
        "type": "Block",
        "status": "unvisited",
        "graph": "",
        "location": "",
        "failure": "",
    }
    broken = rows["broken"]
    assert broken["status"] == "failed"
    assert broken["location"] == _line("LEN")
    assert broken["failure"].startswith("SpecializationError: ")
    assert broken["graph"].endswith("nodes")
    broken_line = next(line for line in lines if line.startswith("broken "))
    assert "LenChild" in broken_line and "failed" in broken_line
    short = os.path.relpath(_line("LEN"), os.getcwd())
    assert (short if not short.startswith("..") else _line("LEN")) in broken_line
    assert repr(collection).startswith("GraphCollection(WithUnused: ")


# leaves


class Opaque(torch.nn.Module):
    def forward(self, x):
        return x.sum(dim=-1, keepdim=True) * x


class OpaqueChild(Opaque):
    pass


class OpaqueOverride(Opaque):
    def forward(self, x):
        return x + 1


class UsesOpaque(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Opaque()
        self.b = OpaqueChild()
        self.c = OpaqueOverride()

    def forward(self, x):
        return self.c(self.b(self.a(x)))


def test_registered_leaves():
    model = UsesOpaque()
    x = torch.randn(3, 4)
    try:
        RobustTracer.register_leaf(Opaque)
        assert RobustTracer.is_registered_leaf(Opaque)
        assert RobustTracer.is_registered_leaf(model.a)
        assert RobustTracer.is_registered_leaf(OpaqueChild)
        assert not RobustTracer.is_registered_leaf(model.c)
        tracer, graph, gm = _robust(model, {"x": x}, {"x": {0: "batch"}})
        assert _call_targets(graph) == ["a", "b"]
        assert not tracer.failures
        torch.testing.assert_close(gm(x), model(x))
        collection = recursive_trace(model, {"x": x})
        assert collection.status(model.a) == "leaf"
        assert collection.status(model.c) == "inlined"
    finally:
        assert RobustTracer.unregister_leaf(Opaque) is True
    # unregistering an unregistered type is a no-op
    assert RobustTracer.unregister_leaf(Opaque) is False
    assert not RobustTracer.is_registered_leaf(model.a)
    tracer, graph, _ = _robust(model, {"x": x})
    assert _call_targets(graph) == []
    with pytest.raises(TypeError, match="torch.nn.Module subclass"):
        RobustTracer.register_leaf(model)


def test_leaf_root_is_not_traced_into():
    model = Opaque()
    x = torch.randn(3, 4)
    try:
        RobustTracer.register_leaf(Opaque)
        tracer, graph, gm = _robust(model, {"x": x}, {"x": {0: "batch"}})
        # the nodes checking the input's static size aside
        ops = [n.op for n in graph.nodes if not n.meta.get(RUNTIME_CHECK)]
        assert ops == ["placeholder", "call_module", "output"]
        assert _call_targets(graph) == ["root"]
        assert tracer.traced_model.root is model
        assert not tracer.is_failed(model)
        out = next(n for n in graph.nodes if n.op == "call_module").meta["val"]
        assert isinstance(out.shape[0], torch.SymInt)
        torch.testing.assert_close(gm(torch.randn(5, 4)).shape, torch.Size([5, 4]))
        collection = recursive_trace(model, {"x": x})
        assert collection.status(model) == "leaf"
        assert collection.entry(model).opaque
        assert collection.rows()[0]["graph"] == "opaque"
        assert _check_graphs(collection) == 1
    finally:
        RobustTracer.unregister_leaf(Opaque)


class FailingRoot(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.value = ValueBranch()

    def forward(self, x):
        y = self.block(x)
        if y.mean() > 10:  # ROOT
            return y
        return self.value(y)


def test_failing_root_is_called_as_a_whole_and_children_are_traced():
    model = FailingRoot()
    x = torch.randn(3, 4)
    tracer, graph, gm = _robust(model, {"x": x})
    assert tracer.is_failed(model)
    assert tracer.failures[""].location == _line("ROOT")
    assert _call_targets(graph) == ["root"]
    torch.testing.assert_close(gm(x), model(x))
    collection = recursive_trace(model, {"x": x})
    assert collection.is_failed(model)
    assert collection.entry(model).opaque
    assert collection.status(model.block) == "traced"
    assert collection.is_failed(model.value)
    assert list(collection) == [model, model.block]
    assert _check_graphs(collection) == 2


# the user's world


class Caught(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.child = LenChild()

    def forward(self, x):
        try:
            return self.child(x)
        except Exception:
            return x


class Interrupt(torch.nn.Module):
    def forward(self, x):
        raise KeyboardInterrupt


class StatefulModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(4)
        self.child = LenChild()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count.add_(1)
        return self.child(self.bn(x)) + self.count


def test_user_try_except_does_not_hide_failures():
    model = Caught()
    x = torch.randn(3, 4)
    tracer, graph, gm = _robust(model, {"x": x}, {"x": {0: "batch"}})
    assert tracer.is_failed(model.child)
    assert _call_targets(graph) == ["child"]
    torch.testing.assert_close(gm(x), model(x))


def test_no_state_left_behind():
    patched = [
        (torch, "cat"),
        (torch, "zeros"),
        (torch, "_check"),
        (builtins, "isinstance"),
        (torch.nn.Module, "__call__"),
        (torch.nn.Module, "__getattr__"),
    ]
    before = [getattr(owner, name) for owner, name in patched]
    model = StatefulModel().train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attributes = {m: set(vars(m)) for m in model.modules()}
    x = torch.randn(3, 4)
    x_copy = x.clone()
    collection = recursive_trace(model, {"x": x}, {"x": {0: "batch"}})
    assert collection.is_failed(model.child)
    for m in model.modules():
        assert set(vars(m)) == attributes[m]
        assert not m._forward_hooks and not m._forward_pre_hooks
        assert not m._forward_hooks_with_kwargs and not m._forward_pre_hooks_with_kwargs
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, state[k], msg=k)
    torch.testing.assert_close(x, x_copy)
    assert [getattr(owner, name) for owner, name in patched] == before
    # errors: bad inputs are reported, not recorded as failures, and restore everything
    with pytest.raises(TypeError, match="concrete_args"):
        RobustTracer().trace(model, {"y": x})
    with pytest.raises(TypeError, match="torch.nn.Module"):
        RobustTracer().trace(lambda x: x, {"x": x})
    with pytest.raises(KeyboardInterrupt):
        RobustTracer().trace(Sandwich(Interrupt()), {"x": x})
    assert [getattr(owner, name) for owner, name in patched] == before
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, state[k], msg=k)


def test_a_leaf_does_not_narrow_the_dimensions_for_the_rest():
    model = torch.nn.Sequential(Sandwich(Undecidable()), Sandwich(Undecidable()))
    x = torch.randn(3, 4)
    tracer, graph, gm = _robust(model, {"input": x}, {"input": {0: torch.export.Dim("batch")}})
    # the first leaf followed the example's branch (batch <= 4) without making it a
    # fact: the second module's branch is still undecidable
    assert tracer.is_failed(model[0].middle)
    assert tracer.is_failed(model[1].middle)
    assert not any("batch <= 4" in g.expression for g in tracer.guards)
    assert [g.expression for g in tracer.guards if g.reason == "specialized"] == [
        "output shapes of 0.middle == [batch, 4]",
        "output shapes of 1.middle == [batch, 4]",
    ]
    for n in (2, 6):
        xn = torch.randn(n, 4)
        torch.testing.assert_close(gm(xn), model(xn))
