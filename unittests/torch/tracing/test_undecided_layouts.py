"""``x.contiguous()`` where the sizes do not settle whether ``x`` is contiguous: a copy,
not a decision narrowing the capture (a decode step traced from one new token); a
write into that copy or into ``x`` (it reaches the other at some sizes only) makes the
layout a decision again, each side captured, as for a reshape (a view of ``x`` at some
sizes, a copy at others)."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
import torch

from unittests.torch.tracing._helpers import check_trace
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.validation import validate
from yobx.torch.passes import MUTATIONS_KEY
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


def _matches_eager_in_onnxruntime(model, example: dict, dims: dict, sizes: list[dict]) -> None:
    """The ONNX model of ``model`` computes what eager computes on each input set of
    ``sizes``: its outputs, and the inputs it writes into after the call."""
    result = to_onnx(model, kwargs=example, dynamic_shapes=dims)
    output = next(n for n in result.graph_module.graph.nodes if n.op == "output")
    mutations = output.meta.get(MUTATIONS_KEY, ())
    report = validate(model, result, [((), inputs) for inputs in sizes], mutations=mutations)
    assert report.ok, report.reasons()
    assert all(not case.skipped for case in report.cases)


@pytest.mark.parametrize("seq", [1, 4])
def test_a_write_into_the_copy_decides_the_layout(seq):
    """Written into, the result's layout matters: it becomes a decision, each side
    captured (at ``seq == 1`` the write reaches ``y``, at others a copy), in the graph
    and in ONNX."""
    model = WritesIntoContiguousOfTransposed()
    others = [{"x": torch.randn(3, s, 3)} for s in (1, 2, 5)]
    dims = {"x": {0: "batch", 1: "seq"}}
    check_trace(model, {"x": torch.randn(2, seq, 3)}, dims, other_inputs=others)
    sizes = [{"x": torch.randn(b, s, 3)} for b, s in ((2, 1), (3, 1), (3, 2), (1, 5), (2, 4))]
    _matches_eager_in_onnxruntime(model, {"x": torch.randn(2, seq, 3)}, dims, sizes)


class WritesIntoReshapeOfSlice(torch.nn.Module):
    """The reshape is a view where the kept columns are one (``n // 2 == 1``) or the
    rows are (``a == 1``): there the write doubles half of ``x``, elsewhere a copy."""

    def forward(self, x):
        w = x[:, : x.shape[1] // 2].reshape(-1)
        w.mul_(2)
        return x + 1


class WritesIntoContiguousOfSlice(torch.nn.Module):
    def forward(self, x):
        w = x[:, : x.shape[1] // 2].contiguous()
        w.mul_(2)
        return x + 1


class WritesIntoTheInputOfAContiguous(torch.nn.Module):
    """The write goes into ``x``; ``w`` sees it where it is ``x``'s view (``a == 1``)."""

    def forward(self, x):
        w = x[:, : x.shape[1] // 2].contiguous()
        x.mul_(2)
        return w + 0


@pytest.mark.parametrize(
    "model",
    [WritesIntoReshapeOfSlice(), WritesIntoContiguousOfSlice(), WritesIntoTheInputOfAContiguous()],
    ids=lambda m: type(m).__name__,
)
@pytest.mark.parametrize("shape", [(3, 6), (1, 6), (3, 2), (2, 9)])
def test_a_write_through_a_view_at_some_sizes_matches_eager_at_every_size(model, shape):
    """Each example, on either side of the decisions, exports a model that writes into
    ``x`` exactly where eager does (``x`` is an output of the ONNX model)."""
    dims = {"x": {0: "a", 1: "n"}}
    shapes = [(3, 6), (1, 6), (3, 2), (3, 3), (2, 9), (1, 3), (4, 1)]
    sizes = [{"x": torch.randn(*s)} for s in shapes]
    check_trace(model, {"x": torch.randn(*shape)}, dims, other_inputs=sizes)
    _matches_eager_in_onnxruntime(model, {"x": torch.randn(*shape)}, dims, sizes)


class WritesAfterInterpolating(torch.nn.Module):
    def forward(self, x):
        up = torch.nn.functional.interpolate(x, size=x.shape[-1] * 3 // 2 + 1, mode="nearest")
        x[..., -1:] += 1
        return up, x.flatten(1, 2)


def test_a_write_after_interpolating_leaves_the_interpolated_tensor():
    """``interpolate`` always returns a new tensor: the write into its input after it
    does not reach it (the passes took it for a possible alias, and the export refused
    the write)."""
    dims = {"x": {0: "batch", 2: "length"}}
    sizes = [{"x": torch.randn(b, 3, n)} for b, n in ((2, 4), (1, 7), (3, 2))]
    _matches_eager_in_onnxruntime(WritesAfterInterpolating(), sizes[0], dims, sizes)


def test_a_write_into_the_copy_without_versions_names_the_decision():
    with pytest.raises(SpecializationError, match=r"add_' needs `seq == 1`"):
        check_trace(
            WritesIntoContiguousOfTransposed(),
            {"x": torch.randn(2, 1, 3)},
            {"x": {0: "batch", 1: "seq"}},
            tracer_kwargs={"narrowing": "constraints"},
        )


class WritesIntoContiguousOfStaticTranspose(torch.nn.Module):
    """``t`` has static sizes: its transpose's ``contiguous()`` is a copy at every size,
    the write stays in it (the passes could not prove the copy and refused the write)."""

    def forward(self, x):
        t = x.amax(0)
        w = t.transpose(0, 1).contiguous()
        w.add_(1)
        return t + 1, w


def test_a_write_into_contiguous_of_a_static_transpose_leaves_its_input():
    dims = {"x": {0: "width"}}
    sizes = [{"x": torch.randn(w, 4, 3)} for w in (5, 2, 1)]
    _matches_eager_in_onnxruntime(WritesIntoContiguousOfStaticTranspose(), sizes[0], dims, sizes)


class WritesIntoContiguousOfAFreshTensor(torch.nn.Module):
    """``contiguous()`` and ``reshape`` of tensors laid out as fresh ones are views at
    every size: the writes reach ``t`` and ``u`` (the shape rules compute a new fake
    tensor for them, whose storage said copy: the writes were dropped, found by
    fuzz_onnx 9669 and 9728)."""

    def forward(self, x):
        t = torch.nn.functional.avg_pool1d(x, 2)
        w = t.contiguous()
        w.add_(w.shape[-1])
        u = x[0, : x.shape[1] // 2].transpose(0, 0).contiguous()
        u.add_(1)
        v = (x * 2).reshape(-1)
        v.mul_(3)
        return t + 1, x + 0, u


def test_writes_into_views_of_fresh_tensors_reach_them():
    dims = {"x": {0: "d", 1: "s", 2: "w"}}
    sizes = [{"x": torch.randn(*s)} for s in ((3, 5, 8), (2, 4, 6), (1, 1, 2))]
    _matches_eager_in_onnxruntime(WritesIntoContiguousOfAFreshTensor(), sizes[0], dims, sizes)
