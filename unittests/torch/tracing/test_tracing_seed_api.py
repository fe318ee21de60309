"""The documented ``yobx.torch.tracing`` API, method by method (see _doc/api/compat.rst).

Each test checks a documented behaviour; captures are compared with eager PyTorch.
"""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx.proxy import TraceError

from yobx.torch.tracing import (
    CondCCOp,
    CustomAttribute,
    CustomParameterProxy,
    CustomProxy,
    CustomProxyBool,
    CustomProxyFloat,
    CustomProxyInt,
    CustomProxyShape,
    CustomTracer,
    ScanCCOp,
    replace_problematic_function_before_tracing,
)

from ._helpers import assert_same


def _module(tracer, graph):
    return torch.fx.GraphModule(tracer.traced_model or torch.nn.Module(), graph)


# 1. trace(root) and trace(root, concrete_args=<some inputs>)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))).softmax(-1)


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(4)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        y = self.pool(torch.relu(self.norm(self.conv(x))))
        return self.head(torch.flatten(y, 1))


class Layers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(5, 5) for _ in range(3)])

    def forward(self, x, scale):
        for layer in self.layers:
            x = torch.tanh(layer(x)) * scale
        return x


@pytest.mark.parametrize(
    "model, inputs",
    [
        (MLP(), [(torch.randn(2, 4),), (torch.randn(7, 4),)]),
        (CNN().eval(), [(torch.randn(1, 3, 8, 8),), (torch.randn(2, 3, 5, 6),)]),
        (
            Layers(),
            [(torch.randn(2, 5), torch.tensor(0.5)), (torch.randn(4, 5), torch.tensor(2.0))],
        ),
    ],
    ids=["mlp", "cnn", "module_list_loop"],
)
def test_trace_without_examples_matches_eager(model, inputs):
    tracer = CustomTracer()
    graph = tracer.trace(model)
    # torch.fx's proxies: no metadata, the nodes torch.fx.symbolic_trace would record
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    assert placeholders and all("val" not in n.meta for n in placeholders)
    reference = torch.fx.symbolic_trace(model).graph
    assert [n.op for n in graph.nodes] == [n.op for n in reference.nodes]
    gm = _module(tracer, graph)
    for args in inputs:
        assert_same(model(*args), gm(*args))


class ShapeBranch(torch.nn.Module):
    def forward(self, x, y):
        z = x + 1
        if y.shape[0] > 2:
            return z * y.sum()
        return z


def test_examples_for_some_parameters_and_not_others():
    x, y = torch.randn(3, 4), torch.randn(5)
    tracer = CustomTracer()
    graph = tracer.trace(ShapeBranch(), concrete_args={"y": y}, dynamic_shapes={"y": {0: "n"}})
    x_node, y_node = [n for n in graph.nodes if n.op == "placeholder"]
    assert "val" not in x_node.meta and "val" in y_node.meta
    gm = _module(tracer, graph)
    for n in (5, 8):
        y = torch.randn(n)
        assert_same(ShapeBranch()(x, y), gm(x, y))


def test_shape_decision_without_example_names_line_and_parameter():
    with pytest.raises(TraceError) as info:
        CustomTracer().trace(ShapeBranch(), concrete_args={"x": torch.randn(3, 4)})
    text = str(info.value)
    assert f"{__file__}:" in text
    assert "concrete_args={'y'" in text


class LengthOfUnknown(torch.nn.Module):
    def forward(self, x):
        n = x.size(0)
        return x.reshape(n, -1) * x.dim()


def test_size_dim_and_length_without_example_are_nodes():
    tracer = CustomTracer()
    graph = tracer.trace(LengthOfUnknown())
    methods = [n.target for n in graph.nodes if n.op == "call_method"]
    assert methods[:2] == ["size", "reshape"] and "dim" in methods
    gm = _module(tracer, graph)
    for x in (torch.randn(2, 3), torch.randn(4, 2, 2)):
        assert_same(LengthOfUnknown()(x), gm(x))

    class Length(torch.nn.Module):
        def forward(self, x):
            return x.new_ones(()) * CustomProxy.length(x) if isinstance(x, CustomProxy) else 0

    tracer = CustomTracer()
    graph = tracer.trace(Length())
    assert any(n.target is len for n in graph.nodes)
    gm = _module(tracer, graph)
    assert_same(torch.tensor(4.0), gm(torch.randn(4, 2)))


def test_len_of_unknown_value_is_a_node():
    class UsesLen(torch.nn.Module):
        def forward(self, x):
            return x[: len(x) // 2]

    tracer = CustomTracer()
    graph = tracer.trace(UsesLen())
    assert any(n.target is len for n in graph.nodes)
    gm = _module(tracer, graph)
    for n in (4, 7):
        x = torch.randn(n, 2)
        assert_same(UsesLen()(x), gm(x))


def test_iterating_an_unknown_value_says_which_example_to_pass():
    class Iterates(torch.nn.Module):
        def forward(self, x):
            return sum(row.sum() for row in x)

    with pytest.raises(TraceError, match=r"concrete_args=\{'x'"):
        CustomTracer().trace(Iterates())


class Constants(torch.nn.Module):
    def forward(self, x, shape, flag, name, nothing):
        y = x.reshape(shape)
        if flag and name == "double" and nothing is None:
            y = y * 2
        return y


def test_non_tensor_concrete_args_are_constants_checked_at_run_time():
    x = torch.randn(3, 4)
    args = {"x": x, "shape": (-1, 2), "flag": True, "name": "double", "nothing": None}
    tracer = CustomTracer()
    graph = tracer.trace(Constants(), concrete_args=args, dynamic_shapes={"x": {0: "n"}})
    assert not any(n.op == "call_method" and n.target == "__eq__" for n in graph.nodes)
    gm = _module(tracer, graph)
    assert_same(Constants()(**args), gm(**args))
    with pytest.raises(AssertionError, match="'flag' was traced with the constant True"):
        gm(**{**args, "flag": False})
    with pytest.raises(AssertionError, match="'shape_1' was traced with the constant 2"):
        gm(**{**args, "shape": (-1, 4)})
    x2 = torch.randn(5, 4)
    assert_same(Constants()(**{**args, "x": x2}), gm(**{**args, "x": x2}))
    with pytest.raises(AssertionError, match="'name' was traced with the constant 'double'"):
        gm(**{**args, "name": "single"})


# 3. list and tuple parameters


class SumsList(torch.nn.Module):
    def forward(self, x, lx: list, pair: tuple):
        total = x.clone()
        for t in lx:
            total = total + t.sum()
        return total * pair[0].mean() + pair[1]


def test_list_and_tuple_parameters_keep_their_structure():
    x = torch.randn(3, 4)
    lx = [torch.randn(2), torch.randn(5), torch.randn(1)]
    pair = (torch.randn(6), torch.randn(3, 4))
    tracer = CustomTracer()
    graph = tracer.trace(
        SumsList(),
        concrete_args={"x": x, "lx": lx, "pair": pair},
        dynamic_shapes={"x": {0: "n"}, "lx": [{0: "a"}, {0: "b"}, None], "pair": (None, {0: "n"})},
    )
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    assert names == ["x", "lx_0", "lx_1", "lx_2", "pair_0", "pair_1"]
    gm = _module(tracer, graph)
    assert_same(SumsList()(x, lx, pair), gm(x, lx, pair))
    lx2 = [torch.randn(7), torch.randn(2), torch.randn(1)]
    x2, pair2 = torch.randn(5, 4), (torch.randn(6), torch.randn(5, 4))
    assert_same(SumsList()(x2, lx2, pair2), gm(x2, lx2, pair2))


@pytest.mark.parametrize("length", [2, 4])
def test_list_of_another_length_at_run_time_is_a_clear_error(length):
    x = torch.randn(3, 4)
    lx = [torch.randn(2), torch.randn(5), torch.randn(1)]
    pair = (torch.randn(6), torch.randn(3, 4))
    tracer = CustomTracer()
    graph = tracer.trace(SumsList(), concrete_args={"x": x, "lx": lx, "pair": pair})
    gm = _module(tracer, graph)
    with pytest.raises(AssertionError, match="lx was traced as a list of 3 element"):
        gm(x, [torch.randn(2)] * length, pair)


# 2. the documented surface


def test_custom_proxy_cat_records_one_cat():
    class Cat(torch.nn.Module):
        def forward(self, x, y):
            return CustomProxy.cat([x, y * 2], 1)

    x, y = torch.randn(2, 3), torch.randn(2, 5)
    tracer = CustomTracer()
    graph = tracer.trace(Cat(), concrete_args={"x": x, "y": y})
    assert [n.target for n in graph.nodes if n.op == "call_function"].count(torch.cat) == 1
    assert_same(torch.cat([x, y * 2], 1), _module(tracer, graph)(x, y))
    # outside a trace it is torch.cat
    assert_same(torch.cat([x, y], 1), CustomProxy.cat([x, y], 1))


def test_numel_and_size_give_custom_proxy_int_and_shape():
    seen = {}

    class Sizes(torch.nn.Module):
        def forward(self, x):
            seen["numel"], seen["size"], seen["size0"] = x.numel(), x.size(), x.size(0)
            seen["size1"] = x.size(1)
            return x.reshape(x.numel()) * x.size(1)

    x = torch.randn(3, 4)
    tracer = CustomTracer()
    graph = tracer.trace(Sizes(), concrete_args={"x": x}, dynamic_shapes={"x": {0: "n"}})
    assert isinstance(seen["numel"], CustomProxyInt) and seen["numel"].concrete_val == 12
    assert isinstance(seen["size"], CustomProxyShape)
    assert isinstance(seen["size0"], CustomProxyInt) and seen["size0"].concrete_val == 3
    assert seen["size1"] == 4 and isinstance(seen["size1"], int)
    gm = _module(tracer, graph)
    for n in (3, 6):
        x = torch.randn(n, 4)
        assert_same(Sizes()(x), gm(x))


def _hand_graph():
    tracer = CustomTracer()
    tracer.graph = torch.fx.Graph()
    return tracer, tracer.graph


def test_custom_proxy_int_comparison_rules():
    tracer, graph = _hand_graph()
    node = graph.placeholder("n")
    positive = CustomProxyInt(node, tracer, concrete_val=5, only_positive=True)
    assert positive.concrete_val == 5 and positive.only_positive
    assert (positive > 0) is True and (positive >= 1) is True and (positive != 0) is True
    assert (positive == 0) is False and (positive < 1) is False and (positive <= 0) is False
    assert (positive == -3) is False and (positive != 2.5) is True
    # not settled by the facts: a node, as in torch.fx
    undecided = positive > 3
    assert isinstance(undecided, CustomProxy) and undecided.node.target is operator.gt

    maybe_null = CustomProxyInt(graph.placeholder("m"), tracer, can_be_null=True)
    assert maybe_null.concrete_val is None and maybe_null.can_be_null
    assert (maybe_null >= 0) is True and (maybe_null < 0) is False
    assert isinstance(maybe_null == 0, CustomProxy)
    assert isinstance(maybe_null > 0, CustomProxy)

    never_null = CustomProxyInt(graph.placeholder("k"), tracer, can_be_null=False)
    assert (never_null == 0) is False and (never_null > 0) is True


def test_custom_proxy_int_inside_a_trace_uses_the_symbolic_value():
    class Compare(torch.nn.Module):
        def forward(self, x):
            n = x.shape[0]
            assert isinstance(n, CustomProxyInt)
            return x * 2 if n >= 1 else x

    x = torch.randn(3, 4)
    tracer = CustomTracer()
    graph = tracer.trace(Compare(), concrete_args={"x": x}, dynamic_shapes={"x": {0: "n"}})
    assert_same(x * 2, _module(tracer, graph)(x))


def test_custom_proxy_shape_from_proxy():
    seen = {}

    class FromProxy(torch.nn.Module):
        def forward(self, x):
            shape = CustomProxyShape.from_proxy(x)
            seen["shape"] = shape
            seen["items"] = CustomProxyShape.from_proxy(x.size())
            return x.reshape(shape[1], shape[0])

    x = torch.randn(3, 4)
    tracer = CustomTracer()
    graph = tracer.trace(FromProxy(), concrete_args={"x": x}, dynamic_shapes={"x": {0: "n"}})
    assert isinstance(seen["shape"], CustomProxyShape) and len(seen["shape"]) == 2
    assert isinstance(seen["items"], CustomProxyShape) and seen["items"][1] == 4
    gm = _module(tracer, graph)
    for n in (3, 5):
        x = torch.randn(n, 4)
        assert_same(x.reshape(4, n), gm(x))
    with pytest.raises(TraceError, match="from_proxy needs the proxy of a traced tensor"):

        class Bad(torch.nn.Module):
            def forward(self, x):
                CustomProxyShape.from_proxy(x.shape[0])
                return x

        CustomTracer().trace(Bad(), concrete_args={"x": x}, dynamic_shapes={"x": {0: "n"}})


def test_custom_proxy_bool_float_and_attribute():
    seen = {}

    class Scalars(torch.nn.Module):
        def forward(self, x):
            n = x.shape[0]
            seen["bool"] = n > 2
            seen["float"] = n / 2
            seen["attr"] = x.T
            return x * (n / 2)

    x = torch.randn(3, 4)
    tracer = CustomTracer()
    graph = tracer.trace(Scalars(), concrete_args={"x": x}, dynamic_shapes={"x": {0: "n"}})
    assert isinstance(seen["bool"], CustomProxyBool)
    assert isinstance(seen["float"], CustomProxyFloat)
    gm = _module(tracer, graph)
    for n in (3, 6):
        x = torch.randn(n, 4)
        assert_same(x * (n / 2), gm(x))

    class Attribute(torch.nn.Module):
        def forward(self, x):
            attr = x.T
            seen["attr"] = attr
            return attr.contiguous()

    tracer = CustomTracer()
    graph = tracer.trace(Attribute())
    assert isinstance(seen["attr"], CustomAttribute)
    assert_same(x.T.contiguous(), _module(tracer, graph)(x))


def test_custom_parameter_proxy_built_by_hand_answers_from_the_parameter():
    tracer, graph = _hand_graph()
    param = torch.nn.Parameter(torch.randn(3, 4, 5))
    node = graph.get_attr("weight")
    proxy = CustomParameterProxy(tracer, node, "weight", param)
    assert proxy.shape == (3, 4, 5) and proxy.ndim == 3 and proxy.dim() == 3
    assert proxy.size() == (3, 4, 5) and proxy.size(1) == 4 and proxy.size(-1) == 5
    assert proxy.numel() == 60 and proxy.nelement() == 60
    assert proxy.dtype == torch.float32
    assert repr(proxy) == "CustomParameterProxy(weight)"


def test_parameter_proxy_inside_a_trace():
    seen = {}

    class UsesWeight(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4, 6))

        def forward(self, x):
            seen["w"] = self.weight
            return x @ self.weight[:, : self.weight.shape[1] // 2]

    x = torch.randn(2, 4)
    model = UsesWeight()
    tracer = CustomTracer(param_shapes_constant=True)
    graph = tracer.trace(model, concrete_args={"x": x})
    assert_same(model(x), _module(tracer, graph)(x))


def test_tracer_proxy_and_nodes_outside_a_trace():
    tracer, graph = _hand_graph()
    x = tracer.proxy(graph.placeholder("x"))
    assert type(x) is CustomProxy and not x.known
    y = tracer.proxy(graph.placeholder("y"), cls=CustomProxyInt, concrete_val=3)
    assert isinstance(y, CustomProxyInt) and y.concrete_val == 3
    out = (x * 2).sum(dim=0) + y
    graph.output(out.node)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    t = torch.randn(4, 2)
    assert_same(t.mul(2).sum(dim=0) + 3, gm(t, 3))


def test_register_callable_stores_functions_graphs_and_modules():
    class Calls(torch.nn.Module):
        def forward(self, x):
            return x + 1

    tracer = CustomTracer()
    graph = tracer.trace(Calls(), concrete_args={"x": torch.randn(2)})
    with graph.inserting_before(graph.output_node()):
        fn = tracer.register_callable("times_two", lambda t: t * 2)
        linear = torch.nn.Linear(2, 2)
        mod = tracer.register_callable("times_two", linear)
        assert fn.op == "get_attr" and fn.target == "times_two" and mod.target == "times_two_1"
        # names of the module's own attributes are not taken (nn.Module.double)
        assert tracer.register_callable("double", linear).target == "double_1"
        out = graph.output_node().args[0]
        a = graph.call_module(fn.target, (out,))
        b = graph.call_module(mod.target, (a,))
    graph.output_node().args = (b,)
    # the traced model is rebuilt around the user's module with the new callables
    gm = torch.fx.GraphModule(tracer._build_traced_model(Calls(), graph), graph)
    t = torch.randn(2)
    assert_same(linear((t + 1) * 2), gm(t))


def test_create_args_for_root_call_module_and_is_leaf_module():
    class Leafy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.inner(x).relu()

    class LeafTracer(CustomTracer):
        calls: list[str] = []

        def is_leaf_module(self, m, name):
            return isinstance(m, torch.nn.Linear) or super().is_leaf_module(m, name)

        def call_module(self, m, forward, args, kwargs):
            LeafTracer.calls.append(type(m).__name__)
            return super().call_module(m, forward, args, kwargs)

    x = torch.randn(2, 3)
    model = Leafy()
    tracer = LeafTracer()
    graph = tracer.trace(model, concrete_args={"x": x}, dynamic_shapes={"x": {0: "b"}})
    assert [n.op for n in graph.nodes].count("call_module") == 1
    assert "Linear" in LeafTracer.calls
    gm = _module(tracer, graph)
    for b in (2, 5):
        x = torch.randn(b, 3)
        assert_same(model(x), gm(x))
    # create_args_for_root: one placeholder per input leaf, then a function taking them
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    assert [n.name for n in placeholders] == ["x"]
    assert placeholders[0].meta["val"].shape[1] == 3


def test_cond_and_scan_ops_are_higher_order_operators():
    assert isinstance(CondCCOp(), torch._ops.HigherOrderOperator)
    assert isinstance(ScanCCOp(), torch._ops.HigherOrderOperator)
    assert CondCCOp() is CondCCOp() and torch.ops.higher_order.yobx_cond is CondCCOp()
    assert torch.ops.higher_order.yobx_scan is ScanCCOp()
    x = torch.randn(3)
    # usable directly, as torch.cond and scan are
    assert_same(x * 2, CondCCOp()(torch.tensor(True), lambda t: t * 2, lambda t: t - 1, [x]))

    def body(carry, xs):
        return [carry + xs], [carry * 1]

    final, stacked = ScanCCOp()(body, [torch.zeros(3)], [torch.ones(4, 3)], [])
    assert_same(torch.full((3,), 4.0), final)
    assert stacked.shape == (4, 3)


def test_cond_node_code_runs_and_exports():
    class Cond(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))

    x = torch.randn(3, 4)
    tracer = CustomTracer()
    graph = tracer.trace(Cond(), concrete_args={"x": x}, dynamic_shapes={"x": {0: "b"}})
    gm = _module(tracer, graph)
    assert "torch.ops.higher_order.yobx_cond(" in gm.code
    for t in (x.abs(), -x.abs()):
        assert_same(Cond()(t), gm(t))
    exported = torch.export.export(gm, (x.abs(),))
    assert_same(Cond()(-x.abs()), exported.module()(-x.abs()))


def test_replace_problematic_function_before_tracing_restores_everything():
    before = (torch.cat, torch.zeros, torch.cond, torch._check, torch.Tensor.__getitem__)
    with replace_problematic_function_before_tracing():
        assert torch.cat is not before[0]
        # outside a trace the replacements behave as the originals
        assert_same(torch.cat([torch.ones(2), torch.zeros(1)]), torch.tensor([1.0, 1.0, 0.0]))
        assert torch.zeros(2, 3).shape == (2, 3)
    after = (torch.cat, torch.zeros, torch.cond, torch._check, torch.Tensor.__getitem__)
    assert all(a is b for a, b in zip(before, after))
    with pytest.raises(RuntimeError, match="boom"):
        with replace_problematic_function_before_tracing():
            raise RuntimeError("boom")
    assert torch.cat is before[0]


# classmethods: the seed's return conventions


class Inplace(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        y.add_(1)
        y[:, 0] = 0
        return y[:, :]


def test_classmethod_passes_return_counts():
    x = torch.randn(3, 4)
    tracer = CustomTracer()
    graph = tracer.trace(Inplace(), concrete_args={"x": x}, remove_inplace=False)
    gm = _module(tracer, graph)
    removed = CustomTracer.remove_inplace(graph)
    assert isinstance(removed, int) and removed > 0
    assert not any(n.op == "call_method" and str(n.target).endswith("_") for n in graph.nodes), (
        graph
    )
    gm.recompile()
    assert_same(Inplace()(x), gm(x))
    sliced = CustomTracer.remove_unnecessary_slices(graph)
    assert isinstance(sliced, int) and sliced >= 1
    gm.recompile()
    assert_same(Inplace()(x), gm(x))
    assert CustomTracer.remove_unnecessary_slices(graph) == 0
    assert CustomTracer.remove_batch_dim_nodes(graph) == 0


def test_remove_inplace_without_exc_returns_a_negative_count():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(operator.mul, (x, 2))
    # an in-place write into a view the pass cannot invert (as_strided): it cannot finish
    view = graph.call_method("as_strided", (y, (2,), (1,)))
    graph.call_method("add_", (view, 1))
    graph.output(y)
    result = CustomTracer.remove_inplace(graph, exc=False)
    assert isinstance(result, int) and result < 0
    with pytest.raises(RuntimeError, match="'as_strided' which cannot be inverted"):
        CustomTracer.remove_inplace(graph, exc=True)


def test_graph_erase_node_erases_dead_predecessors_and_keeps_side_effects():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    buf = graph.call_method("clone", (x,))
    graph.call_method("add_", (buf, 1))
    dead = graph.call_function(operator.mul, (graph.call_function(operator.add, (x, 1)), 3))
    graph.output(buf)
    erased = CustomTracer.graph_erase_node(graph, dead)
    assert erased == 2
    assert [n.target for n in graph.nodes if n.op == "call_method"] == ["clone", "add_"]
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    t = torch.randn(3)
    assert_same(t + 1, gm(t))


def test_remove_unnecessary_slices_removes_a_copy_into_a_fresh_tensor():
    class Filled(torch.nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            y.copy_(x * 2)
            y.add_(1)
            return y.relu()

    x = torch.randn(3, 4)
    tracer = CustomTracer()
    graph = tracer.trace(
        Filled(), concrete_args={"x": x}, dynamic_shapes={"x": {0: "n"}}, remove_inplace=False
    )
    gm = _module(tracer, graph)
    assert CustomTracer.remove_unnecessary_slices(graph) == 2
    targets = [n.target for n in graph.nodes]
    assert "copy_" not in targets and torch.empty_like not in targets
    gm.recompile()
    for n in (3, 7):
        x = torch.randn(n, 4)
        assert_same(Filled()(x), gm(x))


def test_copy_into_a_fresh_tensor_is_kept_when_it_matters():
    class Kept(torch.nn.Module):
        def forward(self, x):
            a = torch.zeros_like(x)
            a.copy_(x)  # x is an input: y would alias it
            b = torch.empty(x.shape[1], x.shape[0])
            b.copy_(x.t() * 2)  # other strides: b.view(-1) needs b contiguous
            c = torch.empty(x.shape, dtype=torch.float64)
            c.copy_(x * 3)  # another dtype
            return a, b.view(-1), c

    x = torch.randn(3, 4)
    tracer = CustomTracer()
    graph = tracer.trace(Kept(), concrete_args={"x": x}, remove_inplace=False)
    assert CustomTracer.remove_unnecessary_slices(graph) == 0
    gm = _module(tracer, graph)
    assert_same(Kept()(x), gm(x))


def test_graph_modules_with_checked_inputs_pickle():
    import pickle

    x = torch.randn(3, 4)
    lx = [torch.randn(2), torch.randn(5), torch.randn(1)]
    pair = (torch.randn(6), torch.randn(3, 4))
    tracer = CustomTracer()
    graph = tracer.trace(SumsList(), concrete_args={"x": x, "lx": lx, "pair": pair})
    gm = _module(tracer, graph)
    # unpickling traces the generated code again with torch.fx: the checks step aside
    clone = pickle.loads(pickle.dumps(gm))
    assert_same(SumsList()(x, lx, pair), clone(x, lx, pair))
