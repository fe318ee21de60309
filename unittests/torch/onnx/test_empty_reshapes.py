"""Reshapes of an empty tensor to a shape with ``-1`` in a version captured at size 0
(yobx.torch.onnx.empty_reshapes): the model loads in onnxruntime and is exact."""

import numpy as np
import onnxruntime
import torch

from unittests.torch.onnx._helpers import export_and_validate


class NormedWithAFirstRow(torch.nn.Module):
    """``group_norm`` reshapes its input to ``(rows, groups, -1)``: ``(0, 1, -1)`` in the
    version captured where ``heads`` is 0 (``x[:1]`` has a version there; fuzz_onnx seed
    7081)."""

    def forward(self, x):
        rows = torch.cat([x, x[:1]], 0)
        return torch.nn.functional.group_norm(rows.permute(1, 0), 1)


def test_a_reshape_of_an_empty_tensor_to_minus_one_loads_and_is_exact():
    # onnxruntime refused to create the session ("Product cannot be 0 in combination
    # with -1"), for a branch that runs only at size 0
    model = NormedWithAFirstRow()
    result = export_and_validate(model, (torch.randn(3, 3),), dynamic_shapes=({0: "h", 1: "h"},))
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for heads in (3, 5, 1, 0):
        x = torch.randn(heads, heads)
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        expected = model(x)
        assert got.shape == tuple(expected.shape), heads
        np.testing.assert_allclose(expected.numpy(), got, rtol=1e-5, atol=1e-5)
