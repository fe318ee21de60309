"""Nearest-neighbour resizing exported with torch's index arithmetic
(:mod:`yobx.torch.onnx.nearest_resize`): the ONNX model picks the same input positions
as eager at sizes other than the example, where ONNX ``Resize`` took others."""

import numpy as np
import onnxruntime
import pytest
import torch
import torch.nn.functional as F

from yobx.torch.onnx import to_onnx


class Resize(torch.nn.Module):
    """``F.interpolate`` of the last ``n`` axes to sizes computed from the input's, or
    by scale factors."""

    def __init__(self, mode, n, factors=None, scales=None):
        super().__init__()
        self.mode, self.n, self.factors, self.scales = mode, n, factors, scales

    def forward(self, x):
        if self.scales is not None:
            return F.interpolate(x, scale_factor=self.scales, mode=self.mode)
        sizes = [max(1, int(x.shape[-self.n + d] * f)) for d, f in enumerate(self.factors)]
        return F.interpolate(x, size=sizes, mode=self.mode)


def _session(result):
    return onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )


def _mismatches(model, result, sizes, n, dtype=torch.float32):
    """The spatial sizes (all axes the same) where onnxruntime differs from eager; the
    values are copies, so they must be equal, not close."""
    session = _session(result)
    wrong = []
    for size in sizes:
        x = torch.randn(2, 3, *([size] * n)).to(dtype)
        expected = model(x).numpy()
        (got,) = session.run(None, {"x": x.numpy()})
        if got.shape != expected.shape or not np.array_equal(got, expected):
            wrong.append(size)
    return wrong


def _dynamic(n):
    return {"x": {2 + d: f"d{d}" for d in range(n)}}


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_sizes_not_multiples_of_the_input_pick_torchs_positions(mode, n):
    # 1837/1000 = 44100/24000: an audio resampling; 20.5 takes the input position
    # 20.5 * 2/41 = 1 (a float32 boundary) at size 2; 0.45 shrinks
    factors = [1.8375, 20.5, 0.45][:n]
    model = Resize(mode, n, factors=factors)
    result = to_onnx(model, (torch.randn(2, 3, *([6] * n)),), dynamic_shapes=_dynamic(n))
    sizes = range(2, 40) if n == 1 else [2, 3, 4, 5, 7, 9, 13]
    assert _mismatches(model, result, sizes, n) == []


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("scale", [0.6, 1.7, 1.05, 2.05, 3.0])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_scale_factors_pick_torchs_positions(mode, scale, n):
    # 1.05 and 2.05 give sizes I and 2 * I below 20, where torch's 2-d nearest kernel
    # (alone) copies or halves instead of using the scale
    model = Resize(mode, n, scales=scale)
    example = torch.randn(2, 3, *([8] * n))
    result = to_onnx(model, (example,), dynamic_shapes=_dynamic(n))
    sizes = [2, 3, 5, 10, 17, 23, 32, 48, 64] if n < 3 else [2, 3, 5, 10, 17]
    assert _mismatches(model, result, sizes, n) == []


def test_power_of_two_scale_factors_stay_one_resize():
    # dst / 2 floored is exact: Resize computes it as torch does, in one node
    model = Resize("nearest", 2, scales=2.0)
    result = to_onnx(model, (torch.randn(2, 3, 8, 8),), dynamic_shapes=_dynamic(2))
    ops = [node.op_type for node in result.model_proto.graph.node]
    assert "Resize" in ops and "Gather" not in ops
    assert _mismatches(model, result, [1, 3, 8, 15], 2) == []


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_other_dtypes_use_torchs_arithmetic(dtype, mode):
    # float64 inputs: positions in double, rounded to float32 by floorf
    model = Resize(mode, 1, factors=[20.5])
    x = torch.randn(2, 3, 6).to(dtype)
    result = to_onnx(model, (x,), dynamic_shapes=_dynamic(1))
    assert _mismatches(model, result, range(2, 30), 1, dtype) == []


def _positions(size_in, size_out, exact, fused):
    """The translation's formula in numpy."""
    dst = np.arange(size_out)
    scale = np.float32(size_in) / np.float32(size_out)
    if exact and fused:
        source = (np.float64(scale) * (dst + 0.5) - 0.5).astype(np.float32)
        position = np.maximum(source, np.float32(0)) + np.float32(0.5)
    elif exact:
        source = scale * (dst + 0.5).astype(np.float32) - np.float32(0.5)
        position = np.maximum(source, np.float32(0)) + np.float32(0.5)
    else:
        position = dst.astype(np.float32) * scale
    return np.minimum(np.floor(position).astype(np.int64), size_in - 1)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_formula_agrees_with_torch_on_every_small_size(n):
    # the translation's formula against torch's kernels on every input size up to 24
    # and output size up to 90, along each axis (the ONNX tests above run the
    # translation itself on fewer sizes); 2 -> 41 is a position 1 up to a rounding,
    # which only the fused multiply-add of the 1-d and 3-d kernels gives
    for mode, exact in (("nearest", False), ("nearest-exact", True)):
        for axis in range(n):
            for size_in in range(1, 25):
                shape = [1] * n
                shape[axis] = size_in
                x = torch.arange(float(size_in)).reshape(1, 1, *shape)
                for size_out in range(1, 91):
                    sizes = [1] * n
                    sizes[axis] = size_out
                    got = F.interpolate(x, size=sizes, mode=mode).flatten().long().numpy()
                    expected = _positions(size_in, size_out, exact, fused=n != 2)
                    assert (got == expected).all(), (mode, axis, size_in, size_out)
