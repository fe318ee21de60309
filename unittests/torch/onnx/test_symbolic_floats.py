"""Symbolic floats (``x.shape[1] * 0.7``) are Python floats, computed in double in the
ONNX model, and take the dtype of the tensors they meet (``_torch_onnx_internals.
_symbolic_floats_in_double``, :mod:`yobx.torch.onnx.symbolic_scalars`)."""

import math

import numpy as np
import onnxruntime
import pytest
import torch

from yobx.torch.onnx import to_onnx


class Function(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function(x)


def _size_70_percent(x):
    # 90 * 0.7 is 62.99999999999999 in double, 63 in float32
    return x.new_zeros(int(x.shape[1] * 0.7))


CASES = {
    "size_from_a_float": _size_70_percent,
    "ceil_of_a_float": lambda x: x.new_zeros(math.ceil(x.shape[1] * 1.3)),
    "floor_of_a_quotient": lambda x: x.new_zeros(math.floor(x.shape[1] / 0.7)),
    "audio_resampling_size": lambda x: x.new_zeros(
        max(1, int(x.shape[1] * 44100 / 24000 * 960 / 512))
    ),
    "float_times_tensor": lambda x: x * (x.shape[1] * 0.7),
    "float16_times_quotient": lambda x: x.to(torch.float16) * (x.shape[1] / 7),
    "tensor_divided_by_sqrt": lambda x: x / math.sqrt(x.shape[1]),
    "full_of_a_quotient": lambda x: torch.full((2,), x.shape[1] / 3),
    "int_tensor_times_float": lambda x: (x.long() + 3) * (x.shape[1] / 7),
    "zero_d_plus_float": lambda x: x.sum() + x.shape[1] * 0.3,
    "tensor_of_a_float": lambda x: torch.tensor(x.shape[1] * 0.7),
    "arange_to_a_float": lambda x: torch.arange(0, x.shape[1] * 0.5, 0.5),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_symbolic_floats_match_eager_at_other_sizes(name):
    model = Function(CASES[name])
    result = to_onnx(model, (torch.randn(2, 16),), dynamic_shapes={"x": {1: "n"}})
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for n in (16, 7, 23, 90, 170, 330):
        x = torch.randn(2, n)
        expected = model(x).numpy()
        (got,) = session.run(None, {"x": x.numpy()})
        assert got.shape == expected.shape, (n, got.shape, expected.shape)
        assert got.dtype == expected.dtype, (n, got.dtype, expected.dtype)
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)
