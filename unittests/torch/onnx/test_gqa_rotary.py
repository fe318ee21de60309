"""The rotation of queries and keys applied by ``GroupQueryAttention`` itself
(:mod:`yobx.torch.onnx.gqa_rotary`): exact for any positions (padded rows, offsets, a
batch sharing its angles), and left to the model when its angles are not their first
half twice."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime
import pytest
import torch

from yobx.torch.onnx.gqa_rotary import duplicated_halves

from .test_gqa_fusion import HEAD, HEADS, KV_HEADS, RepeatedCacheAttention

pytest.importorskip("transformers")


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class RotaryCacheAttention(RepeatedCacheAttention):
    """:class:`RepeatedCacheAttention` whose queries and keys are rotated by angles
    computed from ``positions`` (``(batch, seq)``, or ``(1, seq)`` shared by the batch);
    ``halves`` is the ratio of the second half's frequencies to the first's (1:
    transformers' ``cat(freqs, freqs)``)."""

    def __init__(self, halves: float = 1.0):
        super().__init__()
        self.halves = halves
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, HEAD, 2) / HEAD)))

    def forward(self, x, attention_mask, positions, past_key_values):
        batch, seq, _ = x.shape
        ((past_key, past_value),) = past_key_values
        freqs = positions[..., None].float() * self.inv_freq
        angles = torch.cat([freqs, freqs * self.halves], dim=-1)
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]
        q = self.q(x).view(batch, seq, HEADS, HEAD).transpose(1, 2)
        k, v = self.kv(x).view(batch, seq, 2, KV_HEADS, HEAD).unbind(2)
        k = k.transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return self._attend(q, k, v.transpose(1, 2), attention_mask, past_key, past_value)

    def _attend(self, q, k, v, attention_mask, past_key, past_value):
        batch, _, seq, _ = q.shape
        key = torch.cat([past_key, k], dim=2)
        value = torch.cat([past_value, v], dim=2)
        total = past_key.shape[2] + seq
        groups = HEADS // KV_HEADS
        keys = key[:, :, None].expand(batch, KV_HEADS, groups, total, HEAD)
        values = value[:, :, None].expand(batch, KV_HEADS, groups, total, HEAD)
        keys = keys.reshape(batch, HEADS, total, HEAD)
        values = values.reshape(batch, HEADS, total, HEAD)
        allowed = torch.arange(total)[None, :] <= torch.arange(seq)[:, None] + (total - seq)
        allowed = allowed[None, None] & attention_mask.bool()[:, None, None, :]
        bias = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=bias)
        return out.transpose(1, 2).reshape(batch, seq, HEADS * HEAD), key, value


def _inputs(batch: int, seq: int, past: int, padding: int, shared: bool, offset: int = 0):
    """Left padding on the last row; positions from the mask as generation computes
    them (padded positions 1), plus ``offset``; one row shared by the batch if asked."""
    mask = torch.ones((batch, past + seq), dtype=torch.int64)
    mask[-1, :padding] = 0
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)[:, past:] + offset
    if shared:
        positions = positions[:1]
    cache = (torch.randn(batch, KV_HEADS, past, HEAD), torch.randn(batch, KV_HEADS, past, HEAD))
    return (torch.randn(batch, seq, HEADS * HEAD), mask, positions, (cache,))


def _shapes(shared: bool) -> tuple:
    return (
        {0: "batch", 1: "seq"},
        {0: "batch", 1: "total"},
        {1: "seq"} if shared else {0: "batch", 1: "seq"},
        (({0: "batch", 2: "past"},) * 2,),
    )


_CASES = [(2, 1, 5, 2, 0), (3, 1, 7, 0, 40), (1, 1, 4, 0, 1000), (2, 4, 3, 1, 0), (2, 3, 0, 1, 5)]


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("halves", [1.0, 1.5])
def test_the_operator_rotates_only_angles_of_equal_halves_and_stays_exact(halves, shared):
    from yobx.torch.onnx import to_onnx

    torch.manual_seed(0)
    model = RotaryCacheAttention(halves).eval()
    result = to_onnx(
        model, _inputs(2, 3, 4, 0, shared), dynamic_shapes=_shapes(shared), optimize="ort"
    )
    fused = [
        n
        for n in ir.traversal.RecursiveGraphIterator(result.model.graph)
        if n.op_type == "GroupQueryAttention"
    ]
    assert fused, "the attention was not fused"
    assert {n.attributes.get_int("do_rotary", 0) for n in fused} == {int(halves == 1.0)}
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    for batch, seq, past, padding, offset in _CASES:
        example = _inputs(batch, seq, past, padding, shared, offset)
        with torch.no_grad():
            expected = model(*example)
        x, mask, positions, ((key, value),) = example
        tensors = (x, mask, positions, key, value)
        got = session.run(None, dict(zip(names, [t.numpy() for t in tensors])))
        for mine, theirs in zip(got, expected):
            np.testing.assert_allclose(mine, theirs.numpy(), atol=1e-5, rtol=1e-5)


def _angle_graph(second_half: str, through_if: bool) -> ir.Value:
    """``Cos(Concat(f, <second_half>))`` where ``second_half`` is ``"same"`` (f itself)
    or ``"other"`` (another value), returned through an ``If`` if asked."""
    f = ir.Value(name="f", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["b", "s", 4]))
    g = ir.Value(name="g", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["b", "s", 4]))

    def angle(prefix: str) -> tuple[list[ir.Node], ir.Value]:
        concat = ir.node("Concat", [f, f if second_half == "same" else g], attributes={"axis": -1})
        cos = ir.node("Cos", [concat.outputs[0]])
        cast = ir.node("Cast", [cos.outputs[0]], attributes={"to": ir.DataType.FLOAT})
        for i, node in enumerate((concat, cos, cast)):
            node.outputs[0].name = f"{prefix}{i}"
        cast.outputs[0].shape = ir.Shape(["b", "s", 8])
        return [concat, cos, cast], cast.outputs[0]

    if not through_if:
        nodes, out = angle("a")
        ir.Graph([f, g], [out], nodes=nodes)
        return out
    then_nodes, then_out = angle("t")
    else_nodes, else_out = angle("e")
    cond = ir.Value(name="c", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    choice = ir.node(
        "If",
        [cond],
        attributes={
            "then_branch": ir.AttrGraph("then_branch", ir.Graph([], [then_out], nodes=then_nodes)),
            "else_branch": ir.AttrGraph("else_branch", ir.Graph([], [else_out], nodes=else_nodes)),
        },
    )
    ir.Graph([f, g, cond], [choice.outputs[0]], nodes=[choice])
    return choice.outputs[0]


def test_duplicated_halves_reads_the_nodes_computing_the_angles():
    assert duplicated_halves(_angle_graph("same", through_if=False))
    assert not duplicated_halves(_angle_graph("other", through_if=False))
    assert duplicated_halves(_angle_graph("same", through_if=True))
    assert not duplicated_halves(_angle_graph("other", through_if=True))
