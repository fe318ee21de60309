"""Shape rules: each rule gives exactly torch's fake value, or steps aside."""

from __future__ import annotations

import contextlib
import operator
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim
from torch.fx.proxy import TraceError

from yobx.models import load_model
from yobx.torch.tracing import CustomTracer, StrictDimensionError, shape_rules
from yobx.torch.tracing.symbolic.symbolic import SymbolicDimensions

from ._helpers import check_trace


@pytest.fixture(scope="module")
def env():
    """Fake inputs of several layouts, with dynamic ``batch`` and ``seq``."""
    dims = SymbolicDimensions()
    b, s = dims.dimension("batch", 3), dims.dimension("seq", 5)
    t = dims.dimension("other", 4)
    x = dims.fake_tensor(torch.empty(3, 5, 32), [b, s, 32])
    with dims.fake_mode:
        values = {
            "x": x,
            "y": dims.fake_tensor(torch.empty(3, 5, 32), [b, s, 32]),
            "z": dims.fake_tensor(torch.empty(3, 4, 32), [b, t, 32]),
            "q": x.view(b, s, 4, 8).transpose(1, 2),  # [b, 4, s, 8] non-contiguous
            "half": x[..., :16],  # a slice: strided
            "x1": dims.fake_tensor(torch.empty(3, 1, 5, 8), [b, 1, s, 8]),
            "cos": dims.fake_tensor(torch.empty(1, 1, 5, 8), [1, 1, s, 8]),
            "mask": dims.fake_tensor(torch.empty(3, 1, 5, 5, dtype=torch.bool), [b, 1, s, s]),
            "scores": dims.fake_tensor(torch.empty(3, 4, 5, 5), [b, 4, s, s]),
            "pmask": dims.fake_tensor(torch.empty(3, 5, dtype=torch.bool), [b, s]),
            "bi": dims.fake_tensor(torch.empty(3, 1, 1, 1, dtype=torch.int64), [b, 1, 1, 1]),
            "ki": dims.fake_tensor(torch.empty(1, 1, 1, 5, dtype=torch.int64), [1, 1, 1, s]),
            "ids": dims.fake_tensor(torch.empty(3, 5, dtype=torch.int64), [b, s]),
            "images": dims.fake_tensor(torch.empty(3, 3, 8, 8), [b, 3, 8, 8]),
            "flat": dims.fake_tensor(torch.empty(15, 32), [b * s, 32]),
        }
        values["q_t"] = values["q"].transpose(-1, -2)
        # T5's position bias: [1, heads, s, s] with permuted strides
        values["pbias"] = dims.fake_tensor(torch.empty(1, 5, 5, 4), [1, s, s, 4]).permute(
            0, 3, 1, 2
        )
        # contiguous for torch (a size-1 dimension's stride is ignored), not exactly
        values["x1_odd"] = values["x1"].as_strided((b, 1, s, 8), (8 * s, 7, 8, 1))
    values["w"] = dims.from_real(torch.empty(16, 32))
    values["bias"] = dims.from_real(torch.empty(32))
    values["b"], values["s"] = b, s
    return dims, values


def _f(target, *names, handled=True, **kwargs):
    return ("call_function", target, names, kwargs, handled)


def _m(target, *names, handled=True, **kwargs):
    return ("call_method", target, names, kwargs, handled)


#: (kind, target, argument names or literals, kwargs, whether a rule must apply)
CASES = [
    _f(operator.add, "x", "y"),
    _f(operator.add, "x", "bias"),
    _f(operator.mul, "q", "cos"),
    _f(operator.mul, "x1", "cos"),
    _f(operator.sub, 1.0, "x"),
    _f(operator.truediv, "x", 2),
    _f(operator.neg, "half"),
    _f(operator.neg, "q"),
    _f(operator.lt, "x", 0.5),
    _f(operator.and_, "mask", "mask"),
    _f(torch.where, "mask", "scores", 0.0),
    _f(torch.rsqrt, "x"),
    _f(F.gelu, "x1"),
    _f(operator.pow, "q", 2),
    _m("masked_fill", "scores", "mask", float("-inf")),
    _m("masked_fill", "mask", "scores", 0.0, handled=False),  # the mask must be bool
    _f(operator.add, "x", "z", handled=False),  # two dimensions that may differ
    _f(operator.add, "scores", "pbias"),  # a broadcast operand with permuted strides
    _f(operator.add, "pbias", "scores"),
    _f(torch.where, "mask", "scores", "pbias"),
    _f(operator.mul, "pbias", 2.0, handled=False),  # channels-last: torch's fast path
    _f(operator.add, "x1_odd", "x1"),
    _f(operator.sub, "x1_odd", "cos"),
    _f(operator.add, "x", 1, handled=True),
    _f(F.linear, "x", "w"),
    _f(F.linear, "half", "w", handled=False),  # 16 != 32
    _f(torch.matmul, "q", "q_t"),
    _f(torch.softmax, "x", -1),
    _f(torch.mean, "x", -1, keepdim=True),
    _f(torch.mean, "x", 1, keepdim=True),
    _f(torch.sum, "x", (0, 2)),
    _m("sum", "q", -1, handled=False),  # strided input: torch's reduction layout
    _f(torch.cat, ("x1", "x1"), 1),
    _f(torch.cat, ("x1", "x1"), -1),
    _f(operator.add, "x1", "x1"),
    _f(torch.exp, "x1"),
    _f(operator.lt, "scores", "mask", handled=False),  # mixed dtypes
    _f(torch.where, "mask", 1.0, "scores"),
    _f(torch.cat, ("q", "q"), -1),
    _f(torch.cat, ("x", "y"), 1),
    _f(F.layer_norm, "x", (32,)),
    _f(F.embedding, "ids", "w"),
    _f(operator.getitem, "x", (slice(None), 0)),
    _f(operator.getitem, "x", (slice(None), -1)),
    _f(operator.getitem, "x", (slice(None), 2), handled=False),  # seq >= 2 only
    _f(operator.getitem, "x", (Ellipsis, slice(None, 8))),
    _f(operator.getitem, "x", (None, slice(None), None)),
    _f(operator.getitem, "q", (slice(None), slice(1, 3))),
    _f(operator.getitem, "x", (slice(None), slice(None, "s"))),
    _f(operator.getitem, "pmask", ("bi", "ki")),  # transformers' padding mask
    _f(operator.getitem, "x", (slice(None), "ki"), handled=False),
    _m("transpose", "x", 1, 2),
    _m("permute", "q", 0, 2, 1, 3),
    _m("unsqueeze", "x", 1),
    _m("squeeze", "x1", 1),
    _m("expand", "cos", "b", 4, -1, -1),
    _m("view", "x", "b", "s", 4, 8),
    _m("view", "x", -1, 32),
    _m("view", "half", "b", "s", 2, 8),
    _m("reshape", "q", "b", 4, -1),
    _m("reshape", "x", "b", 1, "s", 32),  # size-1 dimensions of a contiguous tensor
    _m("view", "x", "b", "s", 32, 1, 1),
    _m("reshape", "x1", "b", -1),
    _m("unsqueeze", "x", -1),
    _m("flatten", "x1", 1),
    _m("flatten", "q", 2),
    _m("split", "x", 8, -1),
    _m("chunk", "x", 2, -1),
    _m("contiguous", "q"),
    _m("size", "q", 2),
    _m("size", "q", -1),
    _m("size", "flat", 0),
    _m("size", "x", handled=False),  # every size: a torch.Size, torch's
    _m("contiguous", "x"),
    _m("to", "x", torch.float16),
    _m("float", "x"),
    _m("view", "q", "b", -1, handled=False),  # torch refuses: no view of these strides
    _f(torch.triu, "scores", 1),
    _f(torch.tril, "mask"),
    _f(torch.triu, "mask", diagonal=1),
    _m("tril", "q", -1),  # strided input: the output is contiguous
    _m("triu", "q_t", "s"),
    _f(torch.triu, "bias", handled=False),  # rank 1: torch raises
    _f(torch.arange, "s"),
    _f(torch.arange, "s", dtype=torch.float32),
    _f(torch.arange, 2, "s"),
    _f(torch.arange, 3, "s", handled=False),  # seq >= 3 is not known
    _f(torch.arange, 8, handled=False),  # static: torch's C++ path
    _f(torch.min, "ids", "ids"),  # T5's relative position buckets
    _f(torch.maximum, "x", "y"),
    _f(torch.max, "x", "bias"),
    _m("min", "q", "q"),  # strided inputs: torch's elementwise layout
    _f(torch.max, "x", -1, handled=False),  # a reduction
    _f(torch.zeros, ("b", "s")),
    _f(torch.ones, "b", 4, dtype=torch.int64),
    _f(torch.full, ("b", 4), 1.5),
    _f(torch.full, ("b", 4), True),
    _f(torch.full, ("s",), "s"),
    _f(torch.empty, ("b", "s"), device="meta", handled=False),
    _f(torch.zeros, (2, 3), handled=False),  # static: torch's C++ path
    _f(torch.zeros_like, "x"),
    _f(torch.full_like, "ids", 7),
    _f(torch.ones_like, "x", dtype=torch.float16),
    _f(torch.zeros_like, "q", handled=False),  # its layout is preserved
    _m("new_ones", "x", ("b", 4)),
    _m("new_full", "mask", ("b",), False),
    _m("new_zeros", "w", ("s", 3)),  # a static tensor, a symbolic size
    _m("new_empty", "w", (2, 3), handled=False),
    # augmented assignments: the written tensor itself (T5's relative position buckets)
    _f(operator.iadd, "x", "y"),
    _f(operator.iadd, "x", "bias"),  # broadcast into the written tensor
    _f(operator.imul, "scores", 2.0),
    _f(operator.isub, "ids", 1),
    _f(operator.iadd, "ids", "ids", handled=False),  # the operand is the written tensor
    _f(operator.iadd, "bias", "x", handled=False),  # torch refuses: bias would grow
    _f(operator.iadd, "x1", "cos", handled=True),
    _f(operator.iadd, "cos", "x1", handled=False),  # broadcasts beyond the written tensor
    _f(operator.iadd, "q", "q", handled=False),  # a strided view
    _f(operator.iadd, "ids", 0.5, handled=False),  # a float into an integer tensor
    _f(operator.isub, "mask", "mask", handled=False),  # torch refuses bool subtraction
    _f(operator.iadd, 1, "x", handled=False),  # a number on the left: ``1 + x``
    # dropout outside training: its input itself
    _f(F.dropout, "x", 0.1, False),
    _f(F.dropout, "q", p=0.0, training=False, inplace=False),
    _f(F.dropout, "x", 0.1, handled=False),  # training (random values)
    _f(F.dropout, "x", 0.1, False, True, handled=False),  # in place
    _f(F.dropout, "x", 1.5, False, handled=False),  # torch raises
]


def _resolve(value, values):
    if isinstance(value, str):
        return values[value]
    if isinstance(value, tuple):
        return tuple(_resolve(v, values) for v in value)
    if isinstance(value, slice):
        return slice(*(_resolve(v, values) for v in (value.start, value.stop, value.step)))
    return value


def _dispatch(kind, target, args, kwargs):
    if kind == "call_function":
        return target(*args, **kwargs)
    return getattr(args[0], target)(*args[1:], **kwargs)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{getattr(c[1], '__name__', c[1])}-{c[2]}")
def test_rule_matches_torch(env, case):
    dims, values = env
    kind, target, names, kwargs, handled = case
    args = tuple(_resolve(n, values) for n in names)
    rules = shape_rules.ShapeRules(dims.fake_mode)
    node = types.SimpleNamespace(op=kind, target=target)
    guards = len(dims.shape_env.guards)
    with torch.no_grad():
        value = rules.run(node, args, kwargs)
        assert len(dims.shape_env.guards) == guards, "a rule added a guard"
        if handled:
            assert value is not NotImplemented, "no rule applied"
        else:
            assert value is NotImplemented, "a rule applied where it cannot be exact"
            return
        with dims.fake_mode:
            expected = _dispatch(kind, target, args, kwargs)
    shape_rules.compare(value, expected, list(torch.utils._pytree.tree_leaves(args)), str(target))


@pytest.mark.parametrize(
    "module",
    [
        nn.Linear(32, 16),
        nn.LayerNorm(32),
        nn.GELU(),
        nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval(),
        nn.Dropout(0.1).eval(),
    ],
    ids=lambda m: type(m).__name__,
)
def test_module_rule_matches_torch(env, module):
    dims, values = env
    rules = shape_rules.ShapeRules(dims.fake_mode)
    node = types.SimpleNamespace(op="call_module", target="m")
    with torch.no_grad():
        value = rules.run(node, (values["x"],), {}, module)
        assert value is not NotImplemented
        with dims.fake_mode:
            expected = module(values["x"])
    shape_rules.compare(value, expected, [values["x"]], type(module).__name__)


@pytest.mark.parametrize(
    "module",
    [
        nn.Conv2d(3, 4, 3, padding=1),
        nn.Conv2d(3, 4, 3, stride=2),
        nn.BatchNorm2d(3).eval(),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d((1, 1)),
    ],
    ids=lambda m: repr(m),
)
def test_cnn_module_rule_matches_torch(env, module):
    dims, values = env
    rules = shape_rules.ShapeRules(dims.fake_mode)
    node = types.SimpleNamespace(op="call_module", target="m")
    images = values["images"]
    with torch.no_grad():
        value = rules.run(node, (images,), {}, module)
        assert value is not NotImplemented
        with dims.fake_mode:
            state = {k: dims.from_real(v) for k, v in module.state_dict().items()}
            expected = torch.func.functional_call(module, state, (images,))
    shape_rules.compare(value, expected, [images], repr(module))


@pytest.mark.parametrize(
    "module", [nn.Dropout(0.1), nn.Dropout(0.1, inplace=True).eval()], ids=repr
)
def test_dropout_module_in_training_or_in_place_falls_back(env, module):
    dims, values = env
    rules = shape_rules.ShapeRules(dims.fake_mode)
    node = types.SimpleNamespace(op="call_module", target="m")
    with torch.no_grad():
        assert rules.run(node, (values["x"],), {}, module) is NotImplemented


def test_traced_augmented_assignment_matches_eager():
    """``b += ...`` into a new tensor (T5's buckets) through the rule and the local
    rewrite of ``remove_inplace``, checked numerically."""

    class Buckets(nn.Module):
        def forward(self, x):
            s = x.shape[1]
            position = torch.arange(s)[None, :] - torch.arange(s)[:, None]
            buckets = (position > 0).to(torch.long) * 4
            buckets += torch.where(position.abs() < 2, position.abs(), 1)
            return x + F.dropout(buckets.to(x.dtype), 0.1, False)

    inputs = {"x": torch.randn(2, 5, 5)}
    other = {"x": torch.randn(3, 7, 7)}
    tracer, _, _ = check_trace(
        Buckets(), inputs, {"x": {0: "batch", 1: "seq", 2: "seq"}}, other_inputs=[other]
    )
    assert tracer.shape_rules.fallbacks == 0


def test_compare_detects_a_wrong_rule(monkeypatch):
    """The check mode of the test suite can fail: a wrong rule is reported."""

    def wrong(factory, args, kwargs):
        x = args[0]
        return factory.new([*x.shape[:-1], 1], x.dtype, x.device)

    monkeypatch.setitem(shape_rules._FUNCTION_RULES, torch.rsqrt, wrong)
    monkeypatch.setenv("YOBX_CHECK_SHAPE_RULES", "1")

    class Model(nn.Module):
        def forward(self, x):
            return torch.rsqrt(x)

    x = torch.rand(2, 3, 4) + 0.5
    with pytest.raises(shape_rules.ShapeRuleMismatch, match="shape rule of .*rsqrt.*shape"):
        CustomTracer().trace(Model(), concrete_args={"x": x}, dynamic_shapes={"x": {0: "b"}})


def test_compare_detects_a_wrong_size(env):
    dims, values = env
    b, s = values["b"], values["s"]
    shape_rules.compare(s, values["x"].size(1), [], "size")
    for wrong in (b, s + 1, 5, values["x"]):
        with pytest.raises(shape_rules.ShapeRuleMismatch, match="shape rule of size"):
            shape_rules.compare(wrong, s, [], "size")


def test_undecidable_broadcast_falls_back_to_torch():
    """A rule never decides: broadcasting two dimensions falls back to torch's guard,
    adopted as a relation (a named Dim refuses it)."""

    class Model(nn.Module):
        def forward(self, x, y):
            return x + y

    inputs = {"x": torch.rand(2, 3), "y": torch.rand(2, 4)[:, :3]}
    tracer = CustomTracer()
    tracer.trace(Model(), concrete_args=inputs, dynamic_shapes={"x": {1: "a"}, "y": {1: "c"}})
    assert [c.expression for c in tracer.constraints] == ["a == c"]
    with pytest.raises(TraceError, match="a == c"):
        CustomTracer().trace(
            Model(), concrete_args=inputs, dynamic_shapes={"x": {1: Dim("a")}, "y": {1: Dim("c")}}
        )


def test_rules_cover_most_of_a_transformer():
    """Most tensor operations of the tiny-llm demo run through a rule (the fast path)."""
    model, args, kwargs, dynamic_shapes = load_model("tiny-llm")
    names = list(__import__("inspect").signature(model.forward).parameters)
    inputs = {**dict(zip(names, args)), **kwargs}
    tracer = CustomTracer()
    tracer.trace(model, concrete_args=inputs, dynamic_shapes=dynamic_shapes)
    rules = tracer.shape_rules
    assert rules.handled >= 0.8 * (rules.handled + rules.fallbacks), (
        rules.handled,
        rules.fallbacks,
    )


def test_traced_rope_attention_matches_eager():
    """Strided inputs (transposed heads, half slices) through rules, checked numerically."""

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(32, 96)
            self.out = nn.Linear(32, 32)

        def forward(self, x, cos):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).split(32, dim=-1)
            q, k, v = (t.view(b, s, 4, 8).transpose(1, 2) for t in (q, k, v))
            rotated = torch.cat((-q[..., 4:], q[..., :4]), dim=-1)
            q = q * cos + rotated * cos.flip(-1)
            scores = (q @ k.transpose(-1, -2)) / 8**0.5
            attn = scores.softmax(-1) @ v
            return self.out(attn.transpose(1, 2).reshape(b, s, -1))

    model = Attention().eval()
    inputs = {"x": torch.randn(2, 5, 32), "cos": torch.randn(1, 1, 5, 8)}
    other = {"x": torch.randn(3, 7, 32), "cos": torch.randn(1, 1, 7, 8)}
    dynamic = {"x": {0: "batch", 1: "seq"}, "cos": {2: "seq"}}
    tracer, _, _ = check_trace(model, inputs, dynamic, other_inputs=[other])
    assert tracer.shape_rules.handled > 10


def test_repeated_broadcast_with_permuted_strides_matches_torch(env):
    """The layout of ``scores + position_bias`` is memoized per geometry: the second
    add of a repeated layer gets torch's value too, as a tensor of its own."""
    dims, values = env
    rules = shape_rules.ShapeRules(dims.fake_mode)
    node = types.SimpleNamespace(op="call_function", target=operator.add)
    args = (values["scores"], values["pbias"])
    outputs = []
    with torch.no_grad():
        for _ in range(2):
            value = rules.run(node, args, {})
            assert value is not NotImplemented
            with dims.fake_mode:
                expected = operator.add(*args)
            shape_rules.compare(value, expected, list(args), "add")
            outputs.append(value)
        # the channels-last case falls back, memoized or not
        for _ in range(2):
            assert rules.run(node, (values["pbias"], 2.0), {}) is NotImplemented
    first, second = outputs
    assert first is not second
    assert first.untyped_storage()._cdata != second.untyped_storage()._cdata


def test_memoized_layouts_are_recomputed_when_the_ranges_change():
    # a layout computed from the ranges of the dimensions must not be reused once the
    # ranges changed (torch._check, an adopted constraint), nor for other geometries
    from yobx.torch.tracing.shape_rules._base import TensorFactory

    dims = SymbolicDimensions()
    b, s = dims.dimension("batch", 3), dims.dimension("seq", 5)
    x = dims.fake_tensor(torch.empty(3, 5, 8), [b, s, 8])
    y = dims.fake_tensor(torch.empty(3, 5, 8), [b, s, 4])
    factory = TensorFactory(dims.fake_mode)
    calls = []

    def compute():
        calls.append(1)
        return len(calls)

    assert factory.memoized("k", [x], compute) == 1
    assert factory.memoized("k", [x], compute) == 1
    assert factory.memoized("k", [y], compute) == 2
    assert factory.memoized("k", [x], compute, sizes=(b,)) == 3
    assert factory.memoized("other", [x], compute) == 4
    torch._check(s <= 100)
    assert factory.memoized("k", [x], compute) == 5
    assert factory.memoized("k", [x], compute) == 5
    # a range replaced without any counter of the ShapeEnv moving
    from torch.utils._sympy.value_ranges import ValueRanges

    shape_env = dims.shape_env
    counters = (shape_env._version_counter, shape_env._replacements_version_counter)
    symbol = s.node.expr
    shape_env.var_to_range[symbol] = ValueRanges(2, 50)
    assert (shape_env._version_counter, shape_env._replacements_version_counter) == counters
    assert factory.memoized("k", [x], compute) == 6
    # an equal range, another object: recomputed too (identities are compared)
    shape_env.var_to_range[symbol] = ValueRanges(2, 50)
    assert factory.memoized("k", [x], compute) == 7
    # a new symbol
    dims.dimension("other", 4)
    assert factory.memoized("k", [x], compute) == 8
    assert factory.memoized("k", [x], compute) == 8


@pytest.mark.parametrize(
    "sizes, strides",
    [
        (("b", "s", 32), None),
        (("b", 1, "s", 8), None),
        (("s",), None),
        (("b", "s", 32), (1, "b", lambda b, s: b * s)),  # a transposed layout
        (("b", 4, "s", 8), (lambda b, s: 32 * s, 8, 32, 1)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
def test_new_tensor_with_symbolic_sizes_is_torchs_factory_output(sizes, strides, dtype):
    # TensorFactory.new builds symbolic tensors itself (a storage resized to the bytes
    # torch would allocate, then restrided): it must be the tensor torch.empty or
    # torch.empty_strided makes, its own storage, usable by in-place restriding ops
    import sympy

    from yobx.torch.tracing.shape_rules._base import TensorFactory

    dims = SymbolicDimensions()
    b, s = dims.dimension("batch", 3), dims.dimension("seq", 5)
    names = {"b": b, "s": s}
    concrete_sizes = [names.get(v, v) for v in sizes]
    concrete_strides = (
        None if strides is None else [v(b, s) if callable(v) else names.get(v, v) for v in strides]
    )
    factory = TensorFactory(dims.fake_mode)
    guards = len(dims.shape_env.guards)
    ours = factory.new(concrete_sizes, dtype, torch.device("cpu"), strides=concrete_strides)
    again = factory.new(concrete_sizes, dtype, torch.device("cpu"), strides=concrete_strides)
    with dims.fake_mode:
        if concrete_strides is None:
            expected = torch.empty(concrete_sizes, dtype=dtype)
        else:
            expected = torch.empty_strided(concrete_sizes, concrete_strides, dtype=dtype)

    def same(a, c):
        return sympy.simplify(sympy.sympify(a) - sympy.sympify(c)) == 0

    assert ours.shape == expected.shape and ours.dtype == expected.dtype
    assert all(same(a, c) for a, c in zip(ours.stride(), expected.stride()))
    assert ours.storage_offset() == 0 and not ours._is_view()
    assert same(ours.untyped_storage().nbytes(), expected.untyped_storage().nbytes())
    assert isinstance(ours, torch._subclasses.fake_tensor.FakeTensor)
    assert ours.device == torch.device("cpu")
    # each tensor has its own storage and, when computed, its own symbolic strides
    # (make_fx binds a SymNode to the tensor it was first read from)
    assert ours.untyped_storage()._cdata != again.untyped_storage()._cdata
    for a, c in zip(ours.stride(), again.stride()):
        if isinstance(a, torch.SymInt) and strides is None:
            assert a.node is not c.node
    with dims.fake_mode:
        restrided = ours.clone() if dtype == torch.bool else ours
        restrided.unsqueeze_(0).transpose_(0, 1)
    assert len(dims.shape_env.guards) == guards


class _PositionTable(nn.Module):
    """A vision transformer's position table resized to the image's patch grid."""

    def __init__(self, mode: str, permuted: bool, align_corners=None):
        super().__init__()
        self.table = nn.Parameter(torch.randn(1, 16, 8))  # a 4 x 4 grid of 8 channels
        self.mode, self.permuted, self.align_corners = mode, permuted, align_corners

    def forward(self, pixels):
        grid = self.table.reshape(1, 4, 4, 8).permute(0, 3, 1, 2)  # channels-last layout
        if not self.permuted:
            grid = grid.contiguous()
        size = (pixels.shape[2] // 4, pixels.shape[3] // 4)
        grid = F.interpolate(grid, size=size, mode=self.mode, align_corners=self.align_corners)
        return grid.flatten(2).transpose(1, 2) * pixels.mean()


@pytest.mark.parametrize(
    "mode, permuted, align_corners",
    [
        ("bicubic", True, False),
        ("bilinear", False, None),
        ("bilinear", True, True),
        ("nearest", False, None),
        ("nearest-exact", True, None),
    ],
)
def test_interpolate_to_a_symbolic_size_matches_eager(mode, permuted, align_corners, monkeypatch):
    # torch computes it through its Python decomposition (200 ms per call on a
    # vision transformer): the rule gives the same value, contiguous or channels-last
    from yobx.torch.tracing.shape_rules import resample

    layouts = []
    memory_format = resample._memory_format
    monkeypatch.setattr(resample, "_memory_format", lambda x: layouts.append(1) or memory_format(x))
    model = _PositionTable(mode, permuted, align_corners)
    dynamic = {"pixels": {2: "height", 3: "width"}}
    others = [{"pixels": torch.randn(1, 3, h, w)} for h, w in ((16, 24), (40, 12))]
    # one capture: the table interpolated in the graph itself (not in a version)
    _, graph, _ = check_trace(
        model,
        {"pixels": torch.randn(1, 3, 32, 48)},
        dynamic,
        other_inputs=others,
        tracer_kwargs={"narrowing": "constraints"},
    )
    assert layouts, "the rule did not compute the value"
    node = next(n for n in graph.nodes if n.target is F.interpolate)
    stride = node.meta["val"].stride()
    channels_last = type(stride[1]) is int and stride[1] == 1
    assert channels_last == permuted, stride


@pytest.mark.parametrize("min_size", [16, None])
def test_rules_take_convolution_outputs_as_contiguous(min_size):
    # torch writes the contiguous strides of a convolution's output with max(size, 1)
    # (``Max(1, (h//8))``): the rules take them as contiguous (a vision transformer's
    # patches, flattened: 80 ms through torch); where the ranges do not prove the sizes
    # positive, the strides differ from torch's only for an empty tensor
    dims = SymbolicDimensions()
    b = dims.dimension("b", 2)
    h, w = (dims.dimension(n, v, min_value=min_size) for n, v in (("h", 48), ("w", 64)))
    x = dims.fake_tensor(torch.empty(2, 3, 48, 64), [b, 3, h, w])
    # as the tracer runs a convolution: without recording what it asks (h >= 8 here)
    with dims.fake_mode, dims.shape_env.suppress_guards():
        y = F.conv2d(x, torch.empty(16, 3, 8, 8), None, 8)
    assert "Max" in str(y.stride()[0])
    rules = shape_rules.ShapeRules(dims.fake_mode)
    node = types.SimpleNamespace(op="call_method", target="flatten")
    value = rules.run(node, (y, 2), {})
    assert value is not NotImplemented
    with dims.fake_mode:
        expected = y.flatten(2)
    if min_size is not None:
        shape_rules.compare(value, expected, [y], "flatten")
    for sizes in ((48, 64), (8, 8), (17, 200)):
        env = dict(zip((b.node.expr, h.node.expr, w.node.expr), (2, *sizes)))
        for got, want in ((value.shape, expected.shape), (value.stride(), expected.stride())):
            got = [
                int(g.node.expr.xreplace(env)) if isinstance(g, torch.SymInt) else g for g in got
            ]
            want = [
                int(g.node.expr.xreplace(env)) if isinstance(g, torch.SymInt) else g for g in want
            ]
            assert got == want, (sizes, got, want)


@pytest.mark.parametrize("strides", [None, "transposed"])
def test_storage_layouts_kept_across_traces_belong_to_each_trace(strides):
    # the layouts are kept process-wide: a second trace (another ShapeEnv) gets
    # SymInts of its own ShapeEnv, and an example of another size its own hints
    from yobx.torch.tracing.shape_rules._base import TensorFactory

    for batch in (3, 3, 6):
        dims = SymbolicDimensions()
        b, s = dims.dimension("batch", batch), dims.dimension("seq", 5)
        sizes = [b, s, 4]
        given = None if strides is None else [4, 4 * b, 1]
        ours = TensorFactory(dims.fake_mode).new(
            sizes, torch.float32, torch.device("cpu"), strides=given
        )
        with dims.fake_mode:
            expected = torch.empty(sizes) if given is None else torch.empty_strided(sizes, given)
        nbytes = ours.untyped_storage().nbytes()
        assert nbytes.node.shape_env is dims.shape_env
        assert nbytes.node.hint == expected.untyped_storage().nbytes().node.hint
        assert nbytes.node.hint == batch * 5 * 4 * 4
        for got, want in zip(ours.stride(), expected.stride()):
            if isinstance(got, torch.SymInt):
                assert got.node.shape_env is dims.shape_env
                assert got.node.hint == want.node.hint
            else:
                assert got == want


@pytest.mark.parametrize("target", ["minus_one", "explicit"])
def test_view_sizes_kept_across_traces_belong_to_each_trace(target):
    # view sizes and contiguous strides are kept process-wide: a later trace (another
    # ShapeEnv) gets SymInts of its own ShapeEnv, another example size its own hints,
    # and each view has torch's sizes and strides
    from yobx.torch.tracing.shape_rules import views

    for batch in (3, 3, 6):
        dims = SymbolicDimensions()
        b = dims.dimension("batch", batch)
        x = dims.fake_tensor(torch.empty(batch, 4, 6), [b, 4, 6])
        sizes = (-1, 24) if target == "minus_one" else (b * 4, 6)
        ours = views.view(_factory(dims), (x, *sizes), {})
        with dims.fake_mode:
            expected = x.view(*sizes)
        for got, want in ((ours.shape, expected.shape), (ours.stride(), expected.stride())):
            for g, w in zip(got, want):
                if isinstance(g, torch.SymInt):
                    assert g.node.shape_env is dims.shape_env
                    assert g.node.expr == w.node.expr
                    assert g.node.hint == w.node.hint
                else:
                    assert g == w


def _factory(dims):
    from yobx.torch.tracing.shape_rules._base import TensorFactory

    return TensorFactory(dims.fake_mode)


def test_view_of_a_dimension_product_at_other_sizes():
    # the memoized sizes of a reshape serve traces at other example sizes: each graph
    # matches eager at several sizes
    class Model(torch.nn.Module):
        def forward(self, x):
            return x.flatten(1).view(x.shape[0], -1, 2).reshape(-1, 6) + 1

    for batch in (2, 5, 2):
        x = torch.rand(batch, 3, 4)
        tracer = CustomTracer()
        graph = tracer.trace(Model(), concrete_args={"x": x}, dynamic_shapes={"x": {0: "b"}})
        gm = torch.fx.GraphModule(tracer.traced_model, graph)
        for other in (2, 3, 7):
            y = torch.rand(other, 3, 4)
            torch.testing.assert_close(gm(y), Model()(y))


class _RecordedFunctions(torch.overrides.TorchFunctionMode):
    """A caller's torch function mode: records what reaches it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(func)
        return func(*args, **(kwargs or {}))


class _RecordedOperators(torch.utils._python_dispatch.TorchDispatchMode):
    """A caller's dispatch mode: records the operators that reach it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", [_RecordedFunctions, _RecordedOperators])
def test_factory_tensors_are_made_out_of_a_callers_modes(mode):
    # TensorFactory makes its meta tensors with torch's Python bindings, which torch
    # function modes see, unless a mode is active: then with the operator overloads in
    # the kernel's context. No mode sees them, and the tensors are the same.
    from yobx.torch.tracing.shape_rules._base import TensorFactory

    dims = SymbolicDimensions()
    b, s = dims.dimension("batch", 3), dims.dimension("seq", 5)
    factory = TensorFactory(dims.fake_mode)
    cpu = torch.device("cpu")
    plain = factory.new([b, s, 8], torch.float32, cpu)
    transposed = (*plain.stride()[1::-1], 1)
    plain_view = factory.view(plain, [s, b, 8], transposed)
    with mode() as recorded:
        made = factory.new([b, s, 8], torch.float32, cpu)
        static = factory.new([3, 8], torch.float32, cpu, strides=[1, 3])
        viewed = factory.view(made, [s, b, 8], transposed)
    assert recorded.calls == []
    for ours, expected in ((made, plain), (viewed, plain_view)):
        assert type(ours) is type(expected) and ours.device == expected.device
        assert ours.shape == expected.shape and ours.stride() == expected.stride()
    assert static.shape == (3, 8) and static.stride() == (1, 3)
    assert viewed.untyped_storage()._cdata == made.untyped_storage()._cdata
    assert made.untyped_storage()._cdata != plain.untyped_storage()._cdata


class _ScaledSoftmax(nn.Module):
    def forward(self, x, y):
        return (x * y + 1).transpose(0, 1).reshape(-1, 8).softmax(-1)


@pytest.mark.parametrize(
    "mode", [lambda: torch.device("cpu"), _RecordedFunctions, _RecordedOperators]
)
def test_trace_under_a_callers_mode_matches_eager(mode):
    # the rules run under the caller's mode (the test suite compares each with torch)
    inputs = {"x": torch.randn(3, 5, 8), "y": torch.randn(3, 5, 8)}
    other = {"x": torch.randn(4, 6, 8), "y": torch.randn(4, 6, 8)}
    dims = {0: "batch", 1: "seq"}
    with mode():
        tracer, _, _ = check_trace(
            _ScaledSoftmax(), inputs, {"x": dims, "y": dims}, other_inputs=[other]
        )
    assert tracer.shape_rules.handled >= 4


def test_size_comparisons_never_mix_an_int_and_an_expression(env):
    from yobx.torch.tracing.shape_rules._base import is_one, is_static, same_key, same_size

    dims, values = env
    b, s = values["b"], values["s"]
    assert same_size(b, b) and same_size(b * s, values["b"] * values["s"]) and same_size(4, 4)
    assert not same_size(b, s) and not same_size(b, 3) and not same_size(4, 5)
    assert same_key(1, 1) and not same_key(1, s.node.expr) and not same_key(s.node.expr, 5)
    assert is_one(1) and not is_one(b) and not is_one(2)
    assert is_static(0, 0) and is_static(-1, -1) and not is_static(s, 0) and not is_static(s - s, 1)
    assert is_static(s - s + 3, 3)  # an expression that is a number: its int


class _EmbedNormProject(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.norm = nn.LayerNorm(16)
        self.proj = nn.Linear(16, 8)

    def forward(self, ids):
        return torch.relu(self.proj(self.norm(self.embed(ids))))


def test_module_rules_take_meta_parameters_as_their_fake_copies():
    # a model built on the meta device (a 7B model's capture without weights): its
    # parameters compute as CPU tensors, the fake copies torch's own run of the module
    # gets; the rules apply to its modules (the suite compares them with that run)
    torch.manual_seed(0)
    real = _EmbedNormProject()
    with torch.device("meta"):
        meta = _EmbedNormProject()
    tracer = CustomTracer()
    graph = tracer.trace(
        meta,
        concrete_args={"ids": torch.randint(0, 50, (2, 5))},
        dynamic_shapes={"ids": {0: "batch", 1: "seq"}},
    )
    assert tracer.shape_rules.fallbacks == 0
    modules = [n for n in graph.nodes if n.op == "call_module"]
    assert len(modules) == 3
    assert all(n.meta["val"].device == torch.device("cpu") for n in modules)
    gm = torch.fx.GraphModule(real, graph)
    for shape in ((2, 5), (3, 9), (1, 2)):
        ids = torch.randint(0, 50, shape)
        torch.testing.assert_close(gm(ids), real(ids))


class _Attention(nn.Module):
    """Layers of torch's fused attention (no shape rule: torch computes the first)."""

    def __init__(self, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 48) for _ in range(layers))

    def forward(self, x, mask):
        batch, seq, _ = x.shape
        for layer in self.layers:
            q, k, v = layer(x).view(batch, seq, 3, 2, 8).permute(2, 0, 3, 1, 4)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = out.transpose(1, 2).reshape(batch, seq, 16)
        return x


def test_outputs_torch_computed_are_remembered_for_the_next_layers():
    # the check mode of the suite compares every remembered output with torch's
    inputs = {"x": torch.randn(2, 5, 16), "mask": torch.randn(2, 1, 5, 5)}
    other = {"x": torch.randn(3, 7, 16), "mask": torch.randn(3, 1, 7, 7)}
    dims = {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 2: "seq", 3: "seq"}}
    model = _Attention(4)
    tracer, graph, _ = check_trace(model, inputs, dims, other_inputs=[other])
    first_hits = tracer.shape_rules.remembered.hits
    # the first call of this trace may come from an earlier trace of the process
    assert first_hits in (3, 4)
    # the next trace of the model finds every output remembered for the process
    again, _, _ = check_trace(model, inputs, dims, other_inputs=[other])
    assert again.shape_rules.remembered.hits == 4
    attention = [n for n in graph.nodes if n.target is F.scaled_dot_product_attention]
    values = [n.meta["val"] for n in attention]
    assert len({v.untyped_storage()._cdata for v in values}) == 4
    assert len({tuple(map(str, v.stride())) for v in values}) == 1


def test_only_torch_operations_on_plain_fake_tensors_are_remembered(env):
    dims, values = env
    remembered = shape_rules.ShapeRules(dims.fake_mode).remembered
    x = values["x"]

    def user_function(t):
        return t * 2

    def node(op, target):
        return types.SimpleNamespace(op=op, target=target)

    for op, target, args, kwargs in [
        ("call_function", user_function, (x,), {}),
        ("call_method", "add_", (x, 1), {}),
        ("call_function", torch.add, (x, x), {"out": x}),
        ("call_function", torch.add, (x, object()), {}),
    ]:
        assert remembered.lookup(node(op, target), args, kwargs) is NotImplemented
        assert remembered._pending is None
    # a fake tensor whose values torch may read
    converter = dims.fake_mode.fake_tensor_converter
    constant = converter.from_real_tensor(dims.fake_mode, torch.ones(32), make_constant=True)
    assert constant.constant is not None
    assert remembered.lookup(node("call_function", torch.add), (x, constant), {}) is (
        NotImplemented
    )
    assert remembered._pending is None
    # a call that changed what the ShapeEnv knows is not remembered
    add = node("call_function", torch.add)
    assert remembered.lookup(add, (x, x), {}) is NotImplemented
    with dims.fake_mode:
        remembered.remember(add, torch.add(x, x), unchanged=False)
    assert remembered.lookup(add, (x, x), {}) is NotImplemented
    with dims.fake_mode:
        remembered.remember(add, torch.add(x, x), unchanged=True)
    again = remembered.lookup(add, (x, x), {})
    assert again is not NotImplemented and remembered.hits == 1
    assert again.shape == x.shape and again.stride() == x.stride()
    # a view of an input, or the input itself, is not fresh: not remembered
    view = node("call_method", "view")
    assert remembered.lookup(view, (x, -1), {}) is NotImplemented
    remembered.remember(view, x, unchanged=True)
    assert remembered.lookup(view, (x, -1), {}) is NotImplemented


class _TwoMasks(nn.Module):
    def forward(self, x, first, second):
        a, again = x[first], x[first]  # torch's memo gives `again` the size of `a`
        other = x[second]
        return a.sum() + again.sum() + other.sum(), other


def test_a_data_dependent_size_is_never_remembered_for_another_tensor():
    # the second x[first] takes the size torch memoized for the first one (no new
    # symbol, no guard): that size belongs to `first`, not to every mask of its shape
    tracer = CustomTracer()
    first, second = torch.tensor([1, 0, 1, 0, 1]).bool(), torch.tensor([1, 1, 1, 0, 1]).bool()
    graph = tracer.trace(
        _TwoMasks(),
        concrete_args={"x": torch.randn(5), "first": first, "second": second},
        dynamic_shapes={"x": {0: "n"}, "first": {0: "n"}, "second": {0: "n"}},
    )
    sizes = [n.meta["val"].shape[0] for n in graph.nodes if n.target is operator.getitem]
    assert len(sizes) == 3 and str(sizes[0]) == str(sizes[1]) != str(sizes[2])
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    x = torch.randn(5)
    torch.testing.assert_close(gm(x, first, second), _TwoMasks()(x, first, second))


class _AttentionUnder(nn.Module):
    """The same attention under two settings that change torch's output."""

    def __init__(self, first, second):
        super().__init__()
        self.settings = (first, second)

    def forward(self, q):
        q = q.transpose(1, 2)
        outputs = []
        for setting in self.settings:
            with setting():
                outputs.append(F.scaled_dot_product_attention(q, q, q))
        return outputs


@pytest.mark.parametrize(
    "settings",
    [
        # the kernels allowed decide the output's strides (flash, then math)
        (
            contextlib.nullcontext,
            lambda: torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]),
        ),
    ],
    ids=["sdpa-backends"],
)
def test_remembered_outputs_follow_backend_flags(settings):
    # each node's value is torch's: dtype and strides at the example
    model = _AttentionUnder(*settings)
    q = torch.randn(2, 5, 4, 8)
    graph = CustomTracer().trace(model, concrete_args={"q": q}, dynamic_shapes={"q": {1: "seq"}})
    values = [n.meta["val"] for n in graph.nodes if n.target is F.scaled_dot_product_attention]
    expected = model(q)
    assert len(values) == len(expected) == 2

    def at_example(sizes):
        return tuple(s.node.hint if isinstance(s, torch.SymInt) else s for s in sizes)

    for value, eager in zip(values, expected):
        assert value.dtype == eager.dtype
        assert at_example(value.shape) == eager.shape
        assert at_example(value.stride()) == eager.stride()
    assert (expected[0].dtype, expected[0].stride()) != (expected[1].dtype, expected[1].stride())


class _PaddedTwice(nn.Module):
    """Two layers padding away ``y.shape[0]`` rows: torch guards ``m <= n`` once."""

    def forward(self, x, y):
        first = F.pad(x, (0, 0, 0, -y.shape[0]))
        return first + F.pad(x, (0, 0, 0, -y.shape[0]))


class _MaskedMaximum(nn.Module):
    """A kernel asserting a data-dependent size (deferred, no guard)."""

    def forward(self, x):
        z = x[x[:, 0] > 0]
        m = torch.amax(z, 0)
        if z.shape[0] > 0:
            return m + 1
        return m


@pytest.mark.parametrize(
    "model, dims",
    [
        (_PaddedTwice, {"x": {0: "n"}, "y": {0: "m"}}),
        (_MaskedMaximum, {"x": {0: "n"}}),
    ],
    ids=["guard", "deferred-assertion"],
)
def test_a_warm_trace_knows_what_a_fresh_one_learns(model, dims, monkeypatch):
    # remembered outputs must not skip what torch's kernel teaches the ShapeEnv (a
    # guard, an assertion on a data-dependent size): the next trace of the model, or
    # of another one, adopts the same constraints. Without the check mode, which
    # would run torch's kernel anyway.
    monkeypatch.setenv("YOBX_CHECK_SHAPE_RULES", "0")
    x = torch.randn(10, 3)
    x[:5, 0] = 1
    inputs = {"x": x, "y": torch.randn(4)} if model is _PaddedTwice else {"x": x}

    def trace():
        tracer = CustomTracer()
        tracer.trace(model(), concrete_args=inputs, dynamic_shapes=dims)
        return [str(g).split("  [")[0] for g in tracer.guards], [
            str(c).split("  [")[0] for c in tracer.constraints
        ]

    fresh = trace()
    assert fresh[0]
    assert trace() == fresh


def test_a_warm_trace_refuses_what_a_strict_declaration_needs(monkeypatch):
    monkeypatch.setenv("YOBX_CHECK_SHAPE_RULES", "0")
    inputs = {"x": torch.randn(10, 3), "y": torch.randn(4)}
    CustomTracer().trace(
        _PaddedTwice(), concrete_args=inputs, dynamic_shapes={"x": {0: "n"}, "y": {0: "m"}}
    )
    strict = {"x": {0: Dim("n")}, "y": {0: Dim("m")}}
    with pytest.raises(StrictDimensionError):
        CustomTracer().trace(_PaddedTwice(), concrete_args=inputs, dynamic_shapes=strict)


def test_a_failing_rule_is_torch_s_to_decide_except_in_the_check_mode():
    """One policy for every rule of yobx (shape rules, layouts, direct lowering): a
    rule failing on an input it did not foresee lets torch decide; the check mode
    raises; ``Unsupported`` goes to the caller."""
    from yobx.torch.tracing.shape_rules import Unsupported, rule_or_torch

    def failing():
        raise IndexError("an input the rule did not foresee")

    def unsupported():
        raise Unsupported("not exact here")

    assert rule_or_torch(lambda: 3, lambda: "torch", check=True) == 3
    assert rule_or_torch(failing, lambda: "torch", check=False) == "torch"
    with pytest.raises(IndexError, match="did not foresee"):
        rule_or_torch(failing, lambda: "torch", check=True)
    for check in (False, True):
        with pytest.raises(Unsupported):
            rule_or_torch(unsupported, lambda: "torch", check=check)


def test_a_view_of_a_size_its_ranges_make_one_is_torchs():
    """A symbolic size that is 1 wherever its ranges allow (the last 3 of a cache's
    ``n >= 3`` columns less 2, Mamba's decode step): ATen's ``computeStride`` gives
    its dimension a stride of its own choosing, as for a static 1; the rule leaves it
    to torch (it gave another stride, caught by the check mode)."""
    import sympy

    from yobx.torch.tracing.shape_rules import views

    dims = SymbolicDimensions()
    n = dims.dimension("n", 4, min_value=3)
    b = dims.dimension("b", 2)
    one = n - torch.sym_max(0, n - 3) - 2
    assert not isinstance(one, int) and sympy.simplify(one.node.expr) != 1
    with dims.fake_mode:
        base = dims.fake_tensor(torch.empty(2, 1, 2), [b, one, 2])
        x = base.transpose(1, 2)  # (b, 2, one), strides (2 * one, 1, 2)
        expected = x.view(b, 2, one)
        try:
            got = views.view(_factory(dims), (x, b, 2, one), {})
        except shape_rules.Unsupported:
            got = expected  # torch decides
    shape_rules.compare(got, expected, [x], "view")
