"""Integer remainders by a constant 0 in a version captured at size 0
(yobx.torch.onnx.zero_divisors): the model loads in onnxruntime and is exact."""

import numpy as np
import onnxruntime
import torch

from unittests.torch.onnx._helpers import export_and_validate


class SortedAlong(torch.nn.Module):
    """``take_along_dim`` normalizes its indices with ``index % width``: a constant 0 in
    the version captured at width 0 (fuzz_onnx seed 513)."""

    def forward(self, x):
        return torch.take_along_dim(x, x.argsort(1), 1), x[..., 1:].unsqueeze(1)


def test_a_remainder_by_a_constant_zero_loads_and_is_exact():
    # onnxruntime refused to create the session ("Integer modulo by zero")
    model = SortedAlong()
    result = export_and_validate(model, (torch.randn(3, 5),), dynamic_shapes=({1: "width"},))
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for width in (5, 2, 1, 0):
        x = torch.randn(3, width)
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        for expected, value in zip(model(x), got):
            np.testing.assert_allclose(expected.numpy(), value, atol=1e-6)
