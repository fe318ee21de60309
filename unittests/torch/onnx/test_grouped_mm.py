"""``torch._grouped_mm`` with offsets (mixture-of-experts layers) in ONNX: a loop over
the experts, exact against eager, experts without rows and rows past the last offset
included."""

import numpy as np
import onnxruntime
import torch

from yobx.torch.onnx import to_onnx


class Experts(torch.nn.Module):
    """Rows sorted by expert, grouped by the cumulative counts, as transformers does."""

    def __init__(self, experts: int = 3):
        super().__init__()
        self.experts = experts
        self.weight = torch.nn.Parameter(torch.randn(experts, 8, 12))

    def forward(self, x, ids):
        order = ids.argsort(stable=True)
        counts = torch.histc(ids.float(), bins=self.experts, min=0, max=self.experts - 1)
        offsets = counts.cumsum(0).to(torch.int32)
        return torch._grouped_mm(x[order], self.weight, offs=offsets)


def test_grouped_mm_with_offsets_is_a_loop_over_the_experts():
    model = Experts()
    x, ids = torch.randn(7, 8), torch.tensor([0, 2, 2, 2, 2, 0, 2])  # expert 1: no row
    result = to_onnx(model, (x, ids), dynamic_shapes=({0: "rows"}, {0: "rows"}), validate=True)
    assert result.validation.ok, result.validation.format()
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for rows in (1, 5, 16):
        x, ids = torch.randn(rows, 8), torch.randint(0, 3, (rows,))
        (got,) = session.run(None, {"x": x.numpy(), "ids": ids.numpy()})
        np.testing.assert_allclose(got, model(x, ids).detach().numpy(), atol=1e-5, rtol=1e-5)


class Padded(torch.nn.Module):
    """Offsets ending before the last row: the rows past them are zeros."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(2, 8, 4))

    def forward(self, x, offsets):
        return torch._grouped_mm(x, self.weight, offs=offsets)


def test_rows_past_the_last_offset_are_zeros():
    model = Padded()
    x, offsets = torch.randn(6, 8), torch.tensor([2, 4], dtype=torch.int32)
    result = to_onnx(model, (x, offsets), dynamic_shapes=({0: "rows"}, None))
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (got,) = session.run(None, {"x": x.numpy(), "offsets": offsets.numpy()})
    expected = torch.cat([x[:2] @ model.weight[0], x[2:4] @ model.weight[1], torch.zeros(2, 4)])
    np.testing.assert_allclose(got, expected.detach().numpy(), atol=1e-5, rtol=1e-5)
