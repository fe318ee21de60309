"""Behaviour 7: structured inputs and outputs flatten into readable placeholders."""

import pytest
import torch

from yobx.torch.tracing import ConstraintViolationError, CustomTracer

from ._helpers import assert_same, check_trace, trace_module


class Structured(torch.nn.Module):
    def forward(self, x, pair, mapping, maybe=None, n: int = 2, scale: float = 1.0, *, key):
        a, b = pair
        out = x * n * scale + a.sum() + b.mean() + mapping["u"].sum(-1, keepdim=True)
        if maybe is not None:
            out = out + maybe
        return {"out": out, "both": (a + 1, [b * 2, key - 1])}


def _inputs(batch):
    return {
        "x": torch.randn(batch, 3),
        "pair": (torch.randn(2), torch.randn(4)),
        "mapping": {"u": torch.randn(batch, 5)},
        "maybe": None,
        "n": 3,
        "scale": 0.5,
        "key": torch.randn(batch),
    }


def test_structured_inputs_and_outputs():
    dyn = {"x": {0: "batch"}, "mapping": {"u": {0: "batch"}}, "key": {0: "batch"}}
    tracer, graph, gm = check_trace(Structured(), _inputs(3), dyn, other_inputs=[_inputs(6)])
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    assert names[:4] == ["x", "pair_0", "pair_1", "mapping_u"], names
    assert "key" in names
    out = gm(**_inputs(4))
    assert isinstance(out, dict) and isinstance(out["both"], tuple)
    assert isinstance(out["both"][1], list)
    assert any(g.expression == "n == 3" for g in tracer.guards)


def test_positional_call_of_traced_module():
    dyn = {"x": {0: "batch"}, "mapping": {"u": {0: "batch"}}, "key": {0: "batch"}}
    _, _, gm = trace_module(Structured(), _inputs(3), dyn)
    i = _inputs(5)
    got = gm(i["x"], i["pair"], i["mapping"], None, 3, 0.5, i["key"])
    expected = Structured()(**i)
    torch.testing.assert_close(got["out"], expected["out"])


def test_dynamic_shapes_as_tuple_and_lists():
    model = Structured()
    dyn = ({0: "batch"}, None, {"u": ["batch", None]}, None, None, None, ["batch"])
    check_trace(model, _inputs(3), dyn, other_inputs=[_inputs(2)])


def test_dynamic_shapes_structure_mismatch():
    with pytest.raises(ValueError, match="pair"):
        trace_module(Structured(), _inputs(3), {"pair": [{0: "a"}, {0: "b"}, {0: "c"}]})
    with pytest.raises(ValueError, match="not a tensor"):
        trace_module(Structured(), _inputs(3), {"n": {0: "batch"}})


def test_callable_root():
    def f(x, y):
        return x @ y.T + x.shape[0]

    tracer, graph, gm = check_trace(
        f,
        {"x": torch.randn(3, 4), "y": torch.randn(5, 4)},
        {"x": {0: "n"}, "y": {0: "m"}},
        other_inputs=[{"x": torch.randn(2, 4), "y": torch.randn(7, 4)}],
    )
    assert tracer.traced_model is not None


@pytest.fixture
def yobx_cache_flattening():
    """yobx's flattening of DynamicCache (``[keys, values]``) for the test, whichever
    was registered (transformers' exporters register theirs), restored after."""
    transformers = pytest.importorskip("transformers")
    import torch.fx._pytree as fx_pytree
    import torch.utils._pytree as pytree

    from yobx.torch.tracing.inputs import register_cache_flattening

    cls = transformers.cache_utils.DynamicCache
    saved = pytree.SUPPORTED_NODES.get(cls)
    serialized = pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
    spec = fx_pytree.SUPPORTED_NODES.get(cls)
    if saved is not None:
        pytree._deregister_pytree_node(cls)
        fx_pytree.SUPPORTED_NODES.pop(cls, None)
    register_cache_flattening()
    yield
    pytree._deregister_pytree_node(cls)
    fx_pytree.SUPPORTED_NODES.pop(cls, None)
    if saved is not None:
        pytree.register_pytree_node(
            cls,
            saved.flatten_fn,
            saved.unflatten_fn,
            serialized_type_name=serialized.serialized_type_name if serialized else None,
            flatten_with_keys_fn=saved.flatten_with_keys_fn,
        )
        if spec is not None:
            fx_pytree.SUPPORTED_NODES[cls] = spec


def test_dynamic_cache_input(yobx_cache_flattening):
    transformers = pytest.importorskip("transformers")
    cache_utils = transformers.cache_utils

    class UsesCache(torch.nn.Module):
        def forward(self, x, past_key_values):
            keys = past_key_values.layers[0].keys
            values = past_key_values.layers[1].values
            return x + keys.sum() + values.mean(), past_key_values

    def make(batch, past):
        cache = cache_utils.DynamicCache()
        for i in range(2):
            cache.update(torch.randn(batch, 2, past, 4), torch.randn(batch, 2, past, 4), i)
        return {"x": torch.randn(batch, 4), "past_key_values": cache}

    dyn = {
        "x": {0: "batch"},
        "past_key_values": [[{0: "batch", 2: "past"}] * 2, [{0: "batch", 2: "past"}] * 2],
    }
    inputs = make(2, 3)
    tracer, graph, gm = trace_module(UsesCache(), inputs, dyn)
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    assert names == [
        "x",
        "past_key_values_key_cache_0",
        "past_key_values_key_cache_1",
        "past_key_values_value_cache_0",
        "past_key_values_value_cache_1",
    ], names
    for batch, past in [(2, 3), (3, 5)]:
        case = make(batch, past)
        expected, expected_cache = UsesCache()(**case)
        got, got_cache = gm(**case)
        torch.testing.assert_close(got, expected)
        assert isinstance(got_cache, cache_utils.DynamicCache)
        torch.testing.assert_close(got_cache.layers[1].keys, expected_cache.layers[1].keys)


class _Positional(torch.nn.Module):
    def forward(self, x, y, *rest, scale: float = 2.0):
        out = x * scale + y.sum(-1, keepdim=True)
        for extra in rest:
            out = out + extra
        return out


def test_positional_examples_as_a_tuple():
    # concrete_args may be a tuple of positional examples, as torch.export's args
    model = _Positional()
    x, y, z = torch.randn(3, 4), torch.randn(3, 5), torch.randn(3, 4)
    tracer = CustomTracer()
    dynamic_shapes = {"x": {0: "batch"}, "y": {0: "batch"}, "rest": ({0: "batch"},)}
    graph = tracer.trace(model, (x, y, z), dynamic_shapes=dynamic_shapes)
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    for batch in (3, 6):
        args = (torch.randn(batch, 4), torch.randn(batch, 5), torch.randn(batch, 4))
        assert_same(model(*args), gm(*args))
    placeholders = [n.name for n in graph.nodes if n.op == "placeholder"]
    assert placeholders[:2] == ["x", "y"], placeholders


def test_positional_examples_that_do_not_fit_say_so():
    with pytest.raises(TypeError, match="3 positional examples do not fit"):
        CustomTracer().trace(torch.nn.Linear(2, 2), (torch.randn(1, 2),) * 3)
    with pytest.raises(TypeError, match="concrete_args must be a dict"):
        CustomTracer().trace(torch.nn.Linear(2, 2), torch.randn(1, 2))


class _ListInput(torch.nn.Module):
    def forward(self, xs, y):
        return xs[0] + xs[1] * y


def test_a_list_input_traced_from_concrete_args_is_called_as_the_model():
    # a pytree list among concrete_args: the graph module takes the list as one argument
    model = _ListInput()
    xs, y = [torch.randn(2, 3), torch.randn(2, 3)], torch.randn(2, 3)
    tracer = CustomTracer()
    graph = tracer.trace(model, concrete_args={"xs": xs, "y": y})
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    assert_same(gm(xs, y), model(xs, y))
    other = [torch.randn(2, 3), torch.randn(2, 3)]
    assert_same(gm(other, y), model(other, y))


def test_one_binder_reads_a_call_as_each_caller_needs():
    """``bound_parameters`` is the package's one signature binder: the recursive
    tracer's named inputs, the recorder's parameter names and the placeholders of a
    recorded graph all read its pairs."""
    from yobx.torch.inspect.recording import _placeholder_values, _signature_names
    from yobx.torch.tracing.inputs import bind_arguments, bound_parameters

    def fn(a, b=2, *rest, c, d=4, **extra):
        return a

    pairs = bound_parameters(fn, (1, 5, 6, 7), {"c": 3, "e": 8})
    assert [(p.name, v) for p, v in pairs] == [
        ("a", 1),
        ("b", 5),
        ("rest", (6, 7)),
        ("c", 3),
        ("extra", {"e": 8}),
    ]
    with_defaults = bound_parameters(fn, (1,), {"c": 3}, defaults=True)
    assert [(p.name, v) for p, v in with_defaults] == [
        ("a", 1),
        ("b", 2),
        ("rest", ()),
        ("c", 3),
        ("d", 4),
        ("extra", {}),
    ]
    assert bind_arguments(fn, (1, 5, 6), {"c": 3, "e": 8}) == {
        "a": 1,
        "b": 5,
        "rest": (6,),
        "c": 3,
        "e": 8,
    }
    assert _signature_names(fn, (1, 5, 6), {"c": 3}) == {"a": 1, "b": 5, "rest[0]": 6, "c": 3}
    assert _signature_names(len, (1, 2), {}) is None  # does not bind
    with pytest.raises(TypeError, match="missing a required argument"):
        bound_parameters(fn, (1,))

    class Graph(torch.nn.Module):
        def forward(self, x, y=None):
            return x

    graph = torch.fx.symbolic_trace(Graph())
    assert _placeholder_values(graph, (1,), {"y": 2}) == (1, 2)
    with pytest.raises(TypeError, match="do not match the graph's signature"):
        _placeholder_values(graph, (1,), {"z": 2})


class MaskOverCacheAndTokens(torch.nn.Module):
    """A decode step's mask: eager runs a mask longer, shorter or as long as the cache
    and the new tokens, each its own way."""

    def forward(self, ids, mask, past):
        total = past.shape[1] + ids.shape[1]
        if mask.shape[1] > total:
            mask = mask[:, -total:]
        elif mask.shape[1] < total:
            mask = torch.nn.functional.pad(mask, (total - mask.shape[1], 0))
        return torch.cat([past, ids], 1) * mask


_MASK_SHAPES = {
    "ids": {0: "batch", 1: "seq"},
    "mask": {0: "batch", 1: "past + seq"},
    "past": {0: "batch", 1: "past"},
}


def _mask_inputs(batch: int, seq: int, past: int, extra: int = 0) -> dict:
    return {
        "ids": torch.randn(batch, seq),
        "mask": torch.rand(batch, past + seq + extra),
        "past": torch.randn(batch, past),
    }


def test_an_axis_declared_by_an_expression_of_other_dimensions():
    """``"past + seq"``: the mask's length is that sum, not a dimension of its own, so
    the decisions comparing it with the sum are settled (no version, no constraint),
    and the graph checks the sum on its inputs, wherever the names are declared."""
    model = MaskOverCacheAndTokens()
    tracer, _, gm = trace_module(model, _mask_inputs(2, 3, 5), _MASK_SHAPES)
    assert not tracer.versions and not tracer.constraints
    assert "mask.size(1) == past + seq (declared)" in [c.expression for c in tracer.checks]
    for batch, seq, past in [(2, 3, 5), (1, 1, 0), (3, 1, 9), (1, 7, 0)]:
        inputs = _mask_inputs(batch, seq, past)
        assert_same(model(**inputs), gm(**inputs))
    with pytest.raises(ConstraintViolationError, match=r"mask.size\(1\) == past \+ seq"):
        gm(**_mask_inputs(2, 3, 5, extra=1))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("past + cache", "names 'cache', a dimension no other axis declares"),
        ("past / seq", "only names, integers, \\+, -, \\* and parentheses"),
        ("past + seq + 1", "has size 8 in the example, but is declared 'past \\+ seq \\+ 1'"),
        ("seq -", "does not parse"),
    ],
)
def test_an_axis_expression_that_cannot_hold_says_why(entry, message):
    shapes = {**_MASK_SHAPES, "mask": {0: "batch", 1: entry}}
    with pytest.raises(ValueError, match=message):
        trace_module(MaskOverCacheAndTokens(), _mask_inputs(2, 3, 5), shapes)


class _StateLayer:
    """A cache layer of keys and values beside other states (DeepseekV4's compressor
    buffers, a linear-attention layer's convolution and recurrent states)."""

    def __init__(self, batch: int):
        self.keys = torch.zeros(batch, 2, 5, 4)
        self.values = self.keys  # DeepseekV4 sets `values = keys`
        self.buffer = {"compressor": torch.zeros(batch, 3, 4)}
        self.recurrent_states = [torch.zeros(batch, 2, 4, 4)]


class _StateCache:
    def __init__(self, batch: int):
        self.layers = [_StateLayer(batch)]
        # held by the cache itself, one per layer (MiniMaxCache's lightning attention)
        self.linear_cache = [torch.zeros(batch, 2, 8, 8)]


def test_cache_states_other_than_keys_and_values_have_a_dynamic_batch():
    # they were static: a step concatenating them with the new tokens' states needed
    # `batch == 2` (DeepseekV4ForCausalLM refused), and a 4-d recurrent state took
    # `past` for its third axis (MiniMaxForCausalLM refused: `past` 5 and 8)
    import torch.utils._pytree as pytree

    from yobx.torch.tracing.inputs import cache_dynamic_shapes

    def flatten(cache):
        layer = cache.layers[0]
        states = [layer.buffer["compressor"], *layer.recurrent_states, *cache.linear_cache]
        return [layer.keys, layer.values, *states], None

    pytree.register_pytree_node(_StateCache, flatten, lambda values, _: _StateCache(2))
    try:
        auto = torch.export.Dim.AUTO
        shapes = cache_dynamic_shapes(_StateCache(2), {0: "batch", 2: "past"}, batch=2)
        assert shapes == [
            {0: "batch", 2: "past"},
            {0: "batch", 2: "past"},
            {0: "batch", 1: auto, 2: auto},
            {0: "batch", 1: auto, 2: auto, 3: auto},
            # a 4-d state of the cache's own took `past` (8 against the keys' 5)
            {0: "batch", 1: auto, 2: auto, 3: auto},
        ]
        # without the batch size: as before, the other states static
        assert cache_dynamic_shapes(_StateCache(2), {0: "batch", 2: "past"})[2:] == [{}] * 3
        # a state not as long as the batch on its first axis stays static
        assert (
            cache_dynamic_shapes(_StateCache(2), {0: "batch", 2: "past"}, batch=3)[2:] == [{}] * 3
        )
    finally:
        pytree.SUPPORTED_NODES.pop(_StateCache, None)
