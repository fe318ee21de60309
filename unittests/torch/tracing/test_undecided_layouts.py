"""``x.contiguous()`` where the sizes do not settle whether ``x`` is contiguous: a copy,
not a decision narrowing the capture (a decode step traced from one new token); a
write into that copy (it reaches ``x`` at some sizes only) makes the layout a decision
again, each side captured."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
import torch

from unittests.torch.tracing._helpers import check_trace
from yobx.torch.onnx import OnnxExportError, to_onnx
from yobx.torch.tracing import SpecializationError


class AttentionStep(torch.nn.Module):
    """One step of grouped-query attention over a cache: the attention output
    ``(batch, heads, seq, dim)`` transposed then made contiguous, which it already is
    when ``seq == 1`` (the example of a decode step)."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(16, 16)
        self.kv = torch.nn.Linear(16, 8)

    def forward(self, x, past, mask):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 4, 4).transpose(1, 2)
        k = torch.cat([past, self.kv(x).view(b, s, 2, 4).transpose(1, 2)], 2)
        total = k.shape[2]
        k4 = k[:, :, None].expand(b, 2, 2, total, 4).reshape(b, 4, total, 4)
        w = torch.softmax(q @ k4.transpose(2, 3) * 0.5 + mask, -1, dtype=torch.float32)
        out = torch.matmul(w, k4).transpose(1, 2).contiguous()
        return out.reshape(b, s, -1), k


class WritesIntoContiguousOfTransposed(torch.nn.Module):
    def forward(self, x):
        y = (x * 2).transpose(1, 2)
        z = y.contiguous()  # y itself when seq == 1, a copy otherwise
        z.add_(1)
        return y + 0


def _step_inputs(batch: int, seq: int, past: int) -> dict:
    generator = torch.Generator().manual_seed(batch * 100 + seq * 10 + past)
    return {
        "x": torch.randn(batch, seq, 16, generator=generator),
        "past": torch.randn(batch, 2, past, 4, generator=generator),
        "mask": torch.randn(batch, 1, seq, past + seq, generator=generator),
    }


STEP_DIMS = {
    "x": {0: "batch", 1: "seq"},
    "past": {0: "batch", 2: "past"},
    "mask": {0: "batch", 2: "seq", 3: "total"},
}


def test_a_step_traced_from_one_token_runs_several():
    model = AttentionStep().eval()
    others = [_step_inputs(3, 4, 2), _step_inputs(1, 7, 0), _step_inputs(2, 1, 9)]
    tracer, _, _ = check_trace(model, _step_inputs(2, 1, 5), STEP_DIMS, other_inputs=others)
    # no size fixed by the example (`total == past + seq` is the model's own relation)
    assert [c.expression for c in tracer.constraints] == ["total == past + seq"]


def test_the_onnx_step_from_one_token_runs_prefill_and_decode():
    model = AttentionStep().eval()
    example = _step_inputs(2, 1, 5)
    result = to_onnx(model, kwargs=example, dynamic_shapes=STEP_DIMS)
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for batch, seq, past in [(2, 1, 5), (3, 6, 0), (1, 3, 4)]:
        inputs = _step_inputs(batch, seq, past)
        got = session.run(None, {k: v.numpy() for k, v in inputs.items()})
        with torch.no_grad():
            expected = model(**inputs)
        for e, g in zip(expected, got):
            np.testing.assert_allclose(e.numpy(), g, atol=1e-5)


@pytest.mark.parametrize("seq", [1, 4])
def test_a_write_into_the_copy_decides_the_layout(seq):
    """Written into, the result's layout matters: it becomes a decision, each side
    captured (at ``seq == 1`` the write reaches ``y``). ONNX, where every write is
    functional, refuses the write that is a view at some sizes only, saying what to
    write instead."""
    model = WritesIntoContiguousOfTransposed()
    others = [{"x": torch.randn(3, s, 3)} for s in (1, 2, 5)]
    dims = {"x": {0: "batch", 1: "seq"}}
    check_trace(model, {"x": torch.randn(2, seq, 3)}, dims, other_inputs=others)
    refused = (OnnxExportError, SpecializationError)
    with pytest.raises(refused, match="a view at some sizes, a copy at others|add_' needs"):
        to_onnx(model, kwargs={"x": torch.randn(2, seq, 3)}, dynamic_shapes=dims)


def test_a_write_into_the_copy_without_versions_names_the_decision():
    with pytest.raises(SpecializationError, match=r"add_' needs `seq == 1`"):
        check_trace(
            WritesIntoContiguousOfTransposed(),
            {"x": torch.randn(2, 1, 3)},
            {"x": {0: "batch", 1: "seq"}},
            tracer_kwargs={"narrowing": "constraints"},
        )
