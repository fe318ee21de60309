"""Export of the shape-dependent patterns the tracer supports, validated with
onnxruntime on the example sizes and on other sizes of each dynamic dimension."""

import pytest
import torch
import torch.nn.functional as F

from unittests.torch.onnx._helpers import export_and_validate, onnx_dims


class ShapeBranch(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] == 0:
            return x
        return torch.full(x.shape[:2], 1.0) + x.sum(dim=-1)


class LenAndLoop(torch.nn.Module):
    def forward(self, x):
        total = x.new_zeros(())
        for d in x.shape:
            total = total + d
        return x * len(x) + total


class MaskSetitem(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        y[y > 0] = 0
        return y


class SliceSetitem(torch.nn.Module):
    def forward(self, x, y):
        x = x * 1
        n = y.shape[1]
        x[:, :n] = y
        return x


class InplaceOps(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        y.add_(1)
        y.mul_(x)
        return y.relu_()


class SymbolicSlices(torch.nn.Module):
    def forward(self, x):
        n = x.shape[1]
        return x[:, 1 : n - 1] * 2, x[:, n // 2 :], x[..., -1], x[:, :, None]


class Views(torch.nn.Module):
    def forward(self, x):
        b, s, d = x.shape
        y = x.view(b, s, 2, d // 2).permute(0, 2, 1, 3).reshape(b * 2, s, d // 2)
        z = y.transpose(1, 2).flatten(1).unsqueeze(0).squeeze(0)
        return z, x.unsqueeze(1).expand(b, 3, s, d)


class SplitCatStack(torch.nn.Module):
    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        c, d = torch.split(x, [3, 5], dim=-1)
        return torch.cat([b, a], dim=-1) + torch.cat([d, c], -1), torch.stack([a, b], dim=1)


class Creation(torch.nn.Module):
    def forward(self, x):
        s = x.shape[1]
        positions = torch.arange(s, dtype=torch.float32)
        mask = torch.ones(s, s).tril() + torch.zeros(x.shape[0], s, s)
        causal = torch.full((s, s), float("-inf")).triu(1)
        return x + positions[None, :, None], mask.softmax(-1) + causal.exp()


class Reductions(torch.nn.Module):
    def forward(self, x):
        return (
            x.mean(-1),
            x.sum(1, keepdim=True),
            x.max(dim=-1).values,
            x.amax(1),
            torch.cumsum(x, dim=1),
            x.pow(2).rsqrt(),
        )


class Elementwise(torch.nn.Module):
    def forward(self, x):
        return (
            F.gelu(x) + F.silu(x) + torch.tanh(x) + torch.sigmoid(x) + F.relu(x),
            torch.cos(x) * torch.sin(x),
            torch.where(x > 0, x, -x),
            x.masked_fill(x < 0, 0.5),
            (x > 0.1).to(torch.int64) + (x <= 0).long(),
            x.to(torch.float64) * 2,
        )


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        s = q.shape[2]
        mask = torch.ones(s, k.shape[2], dtype=torch.bool).tril(k.shape[2] - s)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return a, b, F.dropout(a, 0.5, training=False)


class MatMuls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
        self.embedding = torch.nn.Embedding(10, 8)

    def forward(self, x, ids):
        y = torch.einsum("bsd,btd->bst", x, x)
        z = torch.bmm(x, x.transpose(1, 2)) + x @ x.transpose(1, 2)
        e = self.embedding(ids)
        return self.linear(x + e), y + z, torch.log_softmax(y, -1)


class Norms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(8)
        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x):
        rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return self.ln(x), rms, F.layer_norm(x, (8,))


class Vmap(torch.nn.Module):
    def forward(self, x, y):
        return torch.vmap(lambda a, b: (a * b).sum(-1) + a.max())(x, y)


class Cond(torch.nn.Module):
    def forward(self, x):
        def true_fn(x):
            return x.cos()

        def false_fn(x):
            return x.sin() + 1

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv1d(4, 6, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 6, 3)
        self.bn = torch.nn.BatchNorm2d(6).eval()

    def forward(self, x1, x2):
        a = F.max_pool1d(self.conv1(x1), 2)
        b = F.avg_pool2d(F.relu(self.bn(self.conv2(x2))), 2)
        return a, b


class Conv1dLength(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 6, 3, padding=1)

    def forward(self, x):
        return F.max_pool1d(self.conv(x), 2)


def _r(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


B_S = {0: "batch", 1: "seq"}
# Slicing x[:, :4] or x[:, 1:n-1] needs a lower bound on the sequence to be sound.
LONG_SEQ = {0: "batch", 1: torch.export.Dim("seq", min=4)}

CASES = {
    "shape_branch": (ShapeBranch(), (_r(3, 5, 4),), {"x": B_S}),
    "len_and_loop": (LenAndLoop(), (_r(3, 5, 4),), {"x": {1: "seq"}}),
    "mask_setitem": (MaskSetitem(), (_r(3, 5),), {"x": B_S}),
    "slice_setitem": (SliceSetitem(), (_r(3, 6), _r(3, 4)), {"x": LONG_SEQ, "y": {0: "batch"}}),
    "inplace_ops": (InplaceOps(), (_r(3, 5),), {"x": B_S}),
    "symbolic_slices": (SymbolicSlices(), (_r(2, 6, 4),), {"x": LONG_SEQ}),
    "views": (Views(), (_r(2, 5, 8),), {"x": B_S}),
    "split_cat_stack": (SplitCatStack(), (_r(2, 5, 8),), {"x": B_S}),
    "creation": (Creation(), (_r(2, 5, 3),), {"x": B_S}),
    "reductions": (Reductions(), (_r(2, 5, 3).abs() + 0.1,), {"x": B_S}),
    "elementwise": (Elementwise(), (_r(2, 5, 3),), {"x": B_S}),
    "attention": (
        Attention(),
        (_r(2, 2, 3, 4), _r(2, 2, 8, 4), _r(2, 2, 8, 4)),
        {"q": {0: "batch", 2: "seq"}, "k": {0: "batch", 2: "total"}, "v": {0: "batch", 2: "total"}},
    ),
    "matmuls": (
        MatMuls(),
        (_r(2, 5, 8), torch.randint(0, 10, (2, 5))),
        {"x": B_S, "ids": B_S},
    ),
    "norms": (Norms(), (_r(2, 5, 8),), {"x": B_S}),
    "vmap": (Vmap(), (_r(3, 4, 5), _r(3, 4, 5)), {"x": B_S, "y": B_S}),
    "cond": (Cond(), (_r(3, 4),), {"x": B_S}),
    "conv_pool_batchnorm": (
        Conv(),
        (_r(2, 4, 8), _r(2, 4, 9, 9)),
        {"x1": {0: "batch"}, "x2": {0: "batch"}},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pattern_exports_and_matches_eager(name):
    model, args, dynamic_shapes = CASES[name]
    result = export_and_validate(model.eval(), args, dynamic_shapes=dynamic_shapes)
    dims = onnx_dims(result.model_proto)
    # Every dynamic input dimension keeps the user's name.
    for input_name, axes in dynamic_shapes.items():
        assert input_name in dims, (input_name, dims)
        for axis, dim in axes.items():
            dim_name = dim if isinstance(dim, str) else dim.__name__
            assert dims[input_name][axis] == dim_name, (input_name, dims)


def test_conv1d_dynamic_length():
    x = _r(2, 4, 8)
    result = export_and_validate(
        Conv1dLength().eval(), (x,), dynamic_shapes={"x": {0: "batch", 2: "length"}}
    )
    assert onnx_dims(result.model_proto)["x"] == ["batch", 4, "length"]


class BaddbmmReshape(torch.nn.Module):
    """baddbmm on symbolic sizes, and reshape(n, -1) which lowers to aten.sym_numel."""

    def forward(self, query, key, bias):
        scores = bias.baddbmm(query, key.transpose(-1, -2), beta=1.0, alpha=0.5)
        # BLOOM's reshape(batch * heads, -1, head_dim): the -1 is seq for every size
        heads = query.transpose(1, 2).reshape(query.shape[0] * 2, -1, 4)
        return scores.softmax(-1), heads * 2


def test_baddbmm_and_numel_with_dynamic_sizes():
    dims = {0: "batch", 1: "seq"}
    result = export_and_validate(
        BaddbmmReshape().eval(),
        (_r(2, 6, 8), _r(2, 6, 8), _r(2, 1, 6)),
        dynamic_shapes={"query": dims, "key": dims, "bias": {0: "batch", 2: "seq"}},
    )
    assert onnx_dims(result.model_proto)["query"] == ["batch", "seq", 8]


class ListIndex(torch.nn.Module):
    """Falcon's pattern: indexing with a Python list builds an index tensor."""

    def forward(self, x):
        return x[..., [-2], :] * 2 + x[..., [-1], :]


def test_list_index_constant():
    result = export_and_validate(
        ListIndex().eval(), (_r(2, 5, 3, 4),), dynamic_shapes={"x": {0: "batch", 1: "seq"}}
    )
    assert onnx_dims(result.model_proto)["x"] == ["batch", "seq", 3, 4]


class _Attention(torch.nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, q, k, v, mask=None):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, **self.options
        )


@pytest.mark.parametrize(
    ("shape", "options", "with_mask"),
    [
        ((2, 5, 6), {}, False),  # the default scale of a dynamic width (fuzz_onnx seed 1)
        ((5, 6), {}, False),
        ((2, 5, 6), {"is_causal": True}, False),
        ((2, 5, 6), {"scale": 0.3}, True),
    ],
)
def test_attention_of_rank_2_or_3_with_a_dynamic_width(shape, options, with_mask):
    q = torch.randn(*shape)
    k, v = torch.randn(*shape), torch.randn(*shape)
    dims = {len(shape) - 1: "width", len(shape) - 2: "seq"}
    inputs = (q, k, v)
    dynamic_shapes = (dims, dims, dims)
    if with_mask:
        inputs += (torch.randn(shape[-2], shape[-2]),)
        dynamic_shapes += ({0: "seq", 1: "seq"},)
    export_and_validate(_Attention(**options), inputs, dynamic_shapes=dynamic_shapes)
