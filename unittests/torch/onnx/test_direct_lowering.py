"""Direct lowering: common operators written without make_fx, the same aten graph and
the same ONNX outputs as make_fx's lowering, fallbacks for every other form."""

from __future__ import annotations

import operator

import pytest
import torch

from unittests.torch.onnx._helpers import aten_operators, both_lowerings, export_and_validate
from yobx.models import load_model
from yobx.models.architectures import build
from yobx.torch.onnx import capture as capture_module
from yobx.torch.onnx.direct_lowering import aten_call
from yobx.torch.onnx.errors import OnnxExportError
from yobx.torch.onnx.lowering import lower_to_aten
from yobx.torch.passes import writes_anything
from yobx.torch.tracing import CustomTracer

aten = torch.ops.aten
F = torch.nn.functional


class Patterns(torch.nn.Module):
    """Every rule of the direct lowering, in the forms a model writes them."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4, bias=False)
        self.emb = torch.nn.Embedding(10, 4, padding_idx=0)
        self.ln = torch.nn.LayerNorm(4)
        self.act = torch.nn.GELU(approximate="tanh")
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x, ids):
        a = x * 2.0 + 1
        b = 2 * a - x / 3
        c = torch.matmul(a, b.transpose(-1, -2)) @ x
        d = F.softmax(c, dim=-1) + c.softmax(-1) + torch.softmax(c, -1)
        d = self.drop(d) + F.dropout(d, 0.2, training=False) + d.softmax(-1, dtype=torch.float32)
        d = d.transpose(1, 2).contiguous().transpose(1, 2) + d.contiguous()
        e = self.lin(d) + F.linear(d, self.lin.weight) + self.emb(ids)
        f = self.ln(e) + F.layer_norm(e, (4,)) + F.gelu(e) + self.act(e) + F.silu(e)
        g = f[..., :2] + f[..., 2:] + f[None][0, ..., :2:1].neg()
        h = f.reshape(-1, 4).view(x.shape[0], -1, 4) + f.transpose(1, 2).reshape(x.shape[0], -1, 4)
        h = torch.tanh(h)
        i = h.mean(-1, keepdim=True) + h.sum(-1, keepdim=True) + h.pow(2) + h.abs() ** 0.5
        i = i + torch.exp(h)
        j = torch.cat([i, h], dim=-1).permute(0, 2, 1).unsqueeze(0).expand(2, -1, -1, -1)
        k = torch.where(i > 0, i, 0.0) + i.masked_fill(i < 0, 0.0) + torch.rsqrt(i.abs() + 1)
        m = torch.addmm(h[0, 0], h[0], self.lin.weight) + (h == h).float().sum()
        q = h.unsqueeze(1)
        # causal: from positions, not from values (a comparison of computed values
        # flips on rounding differences between onnxruntime and eager)
        positions = torch.arange(x.shape[1])
        mask = positions[:, None] >= positions[None, :]
        o = F.scaled_dot_product_attention(q, q, q) + F.scaled_dot_product_attention(
            q, q, q, attn_mask=mask, is_causal=False, scale=0.5
        )
        return g, j, k, m, o


def _patterns_inputs():
    return (torch.randn(2, 3, 4) * 0.1, torch.randint(0, 10, (2, 3))), {
        "x": {0: "batch", 1: "seq"},
        "ids": {0: "batch", 1: "seq"},
    }


def test_patterns_give_make_fx_graph_and_eager_outputs():
    (x, ids), dynamic_shapes = _patterns_inputs()
    lowered = both_lowerings(Patterns().eval(), (x, ids), {}, dynamic_shapes)
    assert lowered[True].n_direct >= 45
    assert lowered[False].n_direct == 0
    assert aten_operators(lowered[True]) == aten_operators(lowered[False])
    for direct in (True, False):
        export_and_validate(
            Patterns().eval(), (x, ids), dynamic_shapes=dynamic_shapes, direct_lowering=direct
        )


class Convolutions(torch.nn.Module):
    """The convolution and pooling forms of a vision or audio front end."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.strided = torch.nn.Conv2d(4, 4, (3, 1), stride=2, dilation=(1, 2), groups=2)
        self.pool = torch.nn.MaxPool2d(2)
        self.conv1d = torch.nn.Conv1d(4, 4, 3, padding=1, bias=False)
        self.circular = torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular")
        self.norm = torch.nn.GroupNorm(2, 4)
        self.plain_norm = torch.nn.GroupNorm(2, 4, affine=False, eps=1e-6)

    def forward(self, x):
        y = (
            self.pool(torch.relu(self.conv(x)))
            + F.conv2d(x, self.conv.weight, self.conv.bias, padding=1)[..., ::2, ::2][
                ..., : x.shape[2] // 2, : x.shape[3] // 2
            ]
        )
        y = self.norm(y) + self.plain_norm(y) + F.group_norm(y, 2, self.norm.weight)
        z = self.conv1d(y.flatten(2))
        size = (x.shape[2], x.shape[3])
        up = (
            F.interpolate(y, size=size, mode="bilinear", align_corners=False)
            + F.interpolate(y, size=size)
            + F.interpolate(y, size=size, mode="bicubic", align_corners=True)
        )
        return z.log_softmax(-1), self.strided(y), self.circular(x), up


def test_convolutions_give_make_fx_graph_and_eager_outputs():
    x = torch.randn(2, 3, 8, 10)
    dynamic_shapes = ({0: "batch", 2: "height", 3: "width"},)
    lowered = both_lowerings(Convolutions().eval(), (x,), {}, dynamic_shapes)
    # conv, relu, pool, F.conv2d, 3 group norms, conv1d, log_softmax, strided, 3
    # interpolations; not the circular one
    assert lowered[True].n_direct >= 13
    assert aten_operators(lowered[True]) == aten_operators(lowered[False])
    export_and_validate(Convolutions().eval(), (x,), dynamic_shapes=dynamic_shapes)


@pytest.mark.parametrize(
    ("name", "at_least"),
    [("tiny-llm", 100), ("tiny-cnn", 8), ("hf:GPT2LMHeadModel", 80), ("hf:BertModel", 60)],
)
def test_demo_models_same_aten_graph(name, at_least):
    model, args, kwargs, dynamic_shapes = load_model(name)
    lowered = both_lowerings(model, args, kwargs, dynamic_shapes)
    assert lowered[True].n_direct >= at_least
    assert aten_operators(lowered[True]) == aten_operators(lowered[False])


ONE_PER_FAMILY = [
    "vit",
    "wav2vec2",
    "t5",
    "mixtral_batched_mm",
    "unet_block_computed_pads",
    "llama_decode",
]


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_architectures_validate_on_both_paths(name):
    """One case per family: both lowerings give the same operators, and the ONNX model
    of the direct one matches eager at the example and at other sizes."""
    case = build(name)
    lowered = both_lowerings(case.model, case.args, case.kwargs, case.dynamic_shapes)
    assert lowered[True].n_direct > 0
    assert aten_operators(lowered[True]) == aten_operators(lowered[False])
    result = export_and_validate(
        case.model,
        case.args,
        case.kwargs,
        dynamic_shapes=case.dynamic_shapes,
        min_cases=2,
        narrowing="constraints",
    )
    lower = next(stage for stage in result.stages if stage.name == "lower")
    assert lower.args["direct"] == lowered[True].n_direct


def test_check_mode_catches_a_wrong_value(monkeypatch):
    """With YOBX_CHECK_SHAPE_RULES, each value written directly is compared with what
    torch's fake kernel gives on the lowering's arguments."""
    monkeypatch.setenv("YOBX_CHECK_SHAPE_RULES", "1")
    (x, ids), dynamic_shapes = _patterns_inputs()
    captured = capture_module.capture(Patterns().eval(), (x, ids), {}, dynamic_shapes, None)
    lin = next(n for n in captured.graph_module.graph.nodes if n.target == "lin")
    value = lin.meta["val"]
    with value.fake_mode:
        lin.meta["val"] = value.to(torch.float64)
    with pytest.raises(OnnxExportError, match="direct lowering of aten.linear.default: dtype"):
        lower_to_aten(captured.graph_module)
    # the make_fx path computes its own value
    assert lower_to_aten(captured.graph_module, direct=False).n_direct == 0


class WritesIntoAView(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        y[:, 0] += 1
        return y.transpose(0, 1) + 1


def test_graph_that_writes_goes_through_make_fx():
    """A graph the passes left with an in-place write: no value of the capture is
    written directly (the lowering could mutate it); the export still matches eager."""
    x = torch.randn(3, 4)
    dynamic_shapes = ({0: "batch"},)
    tracer = CustomTracer()
    graph = tracer.trace(
        WritesIntoAView(),
        concrete_args={"x": x},
        dynamic_shapes={"x": {0: "batch"}},
        remove_inplace=False,
    )
    assert writes_anything(graph)
    graph_module = torch.fx.GraphModule(tracer.traced_model, graph)
    assert lower_to_aten(graph_module).n_direct == 0
    export_and_validate(WritesIntoAView(), (x,), dynamic_shapes=dynamic_shapes)


def _node(op: str, target, n_args: int = 2) -> torch.fx.Node:
    graph = torch.fx.Graph()
    inputs = [graph.placeholder(f"a{i}") for i in range(n_args)]
    return graph.create_node(op, target, tuple(inputs))


T = torch.empty(2, 3)
MASK = torch.empty(2, 3, dtype=torch.bool)
IMAGE = torch.empty(1, 2, 3, 4)


class LinearWithHook(torch.nn.Linear):
    pass


@pytest.mark.parametrize(
    ("op", "target", "args", "kwargs", "expected"),
    [
        ("call_function", operator.add, (T, T), {}, aten.add.Tensor),
        ("call_function", operator.mul, (2, T), {}, aten.mul.Tensor),
        ("call_function", operator.sub, (2, T), {}, None),  # rsub: make_fx
        ("call_function", operator.add, (T, True), {}, None),  # bool promotes otherwise
        ("call_function", torch.add, (T, T), {"alpha": 2}, None),
        ("call_function", F.relu, (T,), {"inplace": True}, None),
        ("call_function", F.softmax, (T,), {"dim": -1, "dtype": torch.float64}, aten.softmax.int),
        ("call_function", F.softmax, (T,), {"dim": -1, "dtype": "float"}, None),
        ("call_function", F.softmax, (T,), {}, None),  # implicit dim
        ("call_function", F.gelu, (T,), {"approximate": "tanh"}, aten.gelu.default),
        ("call_function", F.embedding, (T, T), {"max_norm": 1.0}, None),
        ("call_function", operator.getitem, (T, (slice(None), slice(1, 2))), {}, None),
        ("call_function", operator.getitem, (T, (Ellipsis, slice(1, 2))), {}, aten.slice.Tensor),
        ("call_function", operator.getitem, (T, (Ellipsis, 0)), {}, None),
        ("call_function", operator.getitem, (T, (Ellipsis, slice(None, None, -1))), {}, None),
        ("call_function", torch.where, (MASK, T, T), {}, aten.where.self),
        ("call_function", F.interpolate, (IMAGE,), {"size": 5}, aten.upsample_nearest2d.vec),
        ("call_function", F.interpolate, (IMAGE,), {"scale_factor": 2.0}, None),
        ("call_function", F.interpolate, (IMAGE,), {"size": 5, "antialias": True}, None),
        ("call_method", "view", (T, torch.float16), {}, None),  # reinterprets the bytes
        ("call_method", "view", (T, 3, 2), {}, aten.view.default),
        ("call_method", "mean", (T,), {"dtype": torch.float64}, None),
        ("call_method", "sum", (T, (0, 1)), {}, aten.sum.dim_IntList),
        ("call_method", "to", (T, torch.float16), {}, None),  # may return its input
        # the copy; a contiguous tensor's own value is taken before (identity_value)
        ("call_method", "contiguous", (T,), {}, aten.clone.default),
        ("call_method", "contiguous", (T,), {"memory_format": torch.channels_last}, None),
    ],
)
def test_rule_forms(op, target, args, kwargs, expected):
    call = aten_call(_node(op, target, len(args)), args, kwargs)
    assert (call[0] if call is not None else None) is expected


def test_module_forms():
    node = _node("call_module", "m", 1)
    linear = torch.nn.Linear(3, 3)
    assert aten_call(node, (T,), {}, linear)[0] is aten.linear.default
    assert aten_call(node, (T,), {}, LinearWithHook(3, 3)) is None  # may override forward
    linear.register_forward_hook(lambda *a: None)
    assert aten_call(node, (T,), {}, linear) is None
    assert aten_call(node, (T,), {}, torch.nn.ReLU(inplace=True)) is None
    embedding = torch.nn.Embedding(4, 3, padding_idx=-1)
    _, (weight, indices, padding_idx), _ = aten_call(node, (T,), {}, embedding)
    assert padding_idx == 3  # normalized as F.embedding does


class ReturnsItsInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        y = self.drop(x).contiguous().to(torch.float32)
        return y.transpose(0, 1).contiguous() * 2


def test_operators_returning_their_input_take_its_value():
    x = torch.randn(3, 4)
    dynamic_shapes = ({0: "batch"},)
    lowered = both_lowerings(ReturnsItsInput().eval(), (x,), {}, dynamic_shapes)
    clones = {
        direct: [
            n.kwargs.get("memory_format")
            for n in lowered[direct].graph_module.graph.nodes
            if n.target is aten.clone.default
        ]
        for direct in (True, False)
    }
    # make_fx copies for the eval dropout; both copy for the transposed contiguous()
    assert clones[True] == [torch.contiguous_format]
    assert len(clones[False]) == 2
    assert lowered[True].n_direct == 6
    export_and_validate(ReturnsItsInput().eval(), (x,), dynamic_shapes=dynamic_shapes)
