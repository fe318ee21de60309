"""Reshapes of an empty tensor to a shape with ``-1`` in a version captured at size 0
(yobx.torch.onnx.empty_reshapes): the model loads in onnxruntime and is exact."""

import numpy as np
import onnxruntime
import pytest
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


class AttendingEveryOtherRow(torch.nn.Module):
    """``scaled_dot_product_attention`` reshapes its transposed key to ``(1, 0, 1, 1)``
    in the version captured where ``dim`` is 0, which ``x[:, :1]`` has (fuzz_onnx seeds
    7424, 7943)."""

    def forward(self, x):
        rows = x[:, ::2]
        attended = torch.nn.functional.scaled_dot_product_attention(
            rows, rows, rows, is_causal=True
        )
        return attended + torch.cat([x, x[:, :1]], 1).sum()


class NormedWithAPaddedRow(torch.nn.Module):
    """``group_norm`` reshapes its normalized ``(3, 1, 0)`` back to the input's
    ``(3, 0, 3, 0)`` in the version captured where ``length`` is 0, which ``x[:, :1]``
    has (fuzz_onnx seed 7904)."""

    def forward(self, x):
        padded = torch.nn.functional.pad(x, (0, 0, 1, x.shape[-2] % 2))
        return torch.nn.functional.group_norm(padded, 1) + torch.cat([x, x[:, :1]], 1).sum()


class NormedOddRows(torch.nn.Module):
    """``group_norm``'s ``(0, 1, -1)`` target on a ``(0, length)`` input, whose other
    size is not static, in the version captured where ``seq`` is 0, which
    ``len(range(seq - 1))`` has (fuzz_onnx seed 8100)."""

    def forward(self, y):
        scaled = y * len(range(y.shape[0] - 1))
        return torch.nn.functional.group_norm(scaled[1::2], 1)


class NormedWithAChunk(torch.nn.Module):
    """``group_norm``'s normalized ``(0, 1, 0)``, out of its ``InstanceNormalization``
    whose shape nothing inferred yet, reshaped back to ``(0, 3, 0, 0)`` in the version
    captured where ``seq`` is 0, which ``y.chunk(4, 0)`` has (fuzz_onnx seed 10955)."""

    def forward(self, x):
        shifted = x + torch.arange(x.shape[-1])
        return torch.nn.functional.group_norm(shifted, 1), x[:, 0].chunk(4, 0)[0]


@pytest.mark.parametrize(
    "model, shape, dims, sizes",
    [
        # not at dim = 0: torch_lib's attention reshapes the empty rows to (-1, 0, 2),
        # which onnxruntime refuses at run time (torch.onnx's model too)
        (AttendingEveryOtherRow, (5, 5, 2), {0: "dim", 1: "dim"}, [(4, 4, 2), (1, 1, 2)]),
        # at length = 0, the version computes nothing (yobx.torch.onnx.empty_values):
        # onnxruntime's InstanceNormalization crashes the process on an empty input
        (
            NormedWithAPaddedRow,
            (3, 4, 2, 4),
            {1: "length", 3: "length"},
            [(3, 6, 2, 6), (3, 0, 2, 0)],
        ),
        # not at seq = 1: the rows are empty in the dynamic version, and torch_lib's
        # group_norm reshapes them to (0, 1, -1), which onnxruntime refuses at run time
        (NormedOddRows, (8, 3), {0: "seq", 1: "length"}, [(5, 4), (2, 3), (0, 2)]),
        (NormedWithAChunk, (7, 3, 7, 7), {0: "seq", 2: "seq", 3: "seq"}, [(8, 3, 8, 8)]),
    ],
)
def test_a_reshape_of_an_empty_tensor_reading_its_zeros_as_sizes_loads(model, shape, dims, sizes):
    # torch_lib computes the target from the input's shape with allowzero=0, where a 0
    # copies the input's size: the version at size 0 folded it to a constant whose 0
    # points past the input's axes, and onnxruntime refused to create the session
    # ("Invalid position of 0") for a branch that runs only at size 0
    model = model()
    result = export_and_validate(model, (torch.randn(*shape),), dynamic_shapes=(dims,))
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for size in [shape, *sizes]:
        x = torch.randn(*size)
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        expected = model(x)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for e, g in zip(expected, got):
            assert g.shape == tuple(e.shape), size
            np.testing.assert_allclose(e.numpy(), g, rtol=1e-5, atol=1e-5)
