"""squeeze, independent exports, broadcast slice assignment, complex dtypes
(issue 12, item 8)."""

from __future__ import annotations

import onnxruntime
import pytest
import torch

from yobx.torch.onnx import OnnxExportError, to_onnx
from yobx.torch.onnx.runtime_checks import is_check_node
from yobx.torch.onnx.validation import validate

from ._helpers import export_and_validate, onnx_dims


class _SqueezeFirst(torch.nn.Module):
    def forward(self, x):
        return x.squeeze(0) + 1


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_squeeze_of_a_non_unit_dimension_is_a_no_op(dynamic):
    model = _SqueezeFirst()
    dynamic_shapes = {"x": {0: "n"}} if dynamic else None
    result = export_and_validate(
        model, (torch.randn(3, 4),), dynamic_shapes=dynamic_shapes, min_cases=3 if dynamic else 1
    )
    assert "Squeeze" not in {n.op_type for n in result.model_proto.graph.node}
    if dynamic:
        report = validate(model, result, [(torch.randn(7, 4),), (torch.randn(2, 4),)])
        assert report.ok and report.n_checked == 2, report.format()


def test_squeeze_of_a_unit_dimension_still_squeezes():
    model = _SqueezeFirst()
    result = export_and_validate(model, (torch.randn(1, 4, 3),), dynamic_shapes={"x": {2: "n"}})
    assert onnx_dims(result.model_proto)["output"] == [4, "n"]


class _CondOnData(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))


class _CondOnSize(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.cond(
            x.shape[0] > 2, lambda x: x * self.weight, lambda x: x * 3 - self.weight, (x,)
        )


def test_independent_exports_do_not_interfere():
    """Exports of control flow in one process: each model exported, then the first
    again with other shapes, each validated at several sizes."""
    first = export_and_validate(_CondOnData(), (torch.randn(3, 4),), dynamic_shapes=({0: "n"},))
    second = export_and_validate(_CondOnSize(), (torch.randn(5, 4),), dynamic_shapes=({0: "m"},))
    again = export_and_validate(_CondOnData(), (torch.randn(6, 2),), dynamic_shapes=({1: "d"},))
    assert onnx_dims(first.model_proto)["x"] == ["n", 4]
    assert onnx_dims(second.model_proto)["x"] == ["m", 4]
    assert onnx_dims(again.model_proto)["x"] == [6, "d"]


class _BroadcastSliceAssignment(torch.nn.Module):
    def forward(self, K, v):
        K = K.clone()
        K[2:-2, 2:-2, :-1] = v[None, :, None]
        return K


def test_broadcast_slice_assignment_gives_a_valid_model():
    model = _BroadcastSliceAssignment()
    export_and_validate(model, (torch.randn(8, 8, 3), torch.randn(4)), min_cases=1)
    result = export_and_validate(
        model,
        (torch.randn(8, 8, 3), torch.randn(4)),
        dynamic_shapes={"K": {0: "n", 1: "m"}, "v": {0: "k"}},
    )
    report = validate(model, result, [(torch.randn(10, 7, 3), torch.randn(3))])
    assert report.ok and report.n_checked == 1, report.format()


class _ComplexInside(torch.nn.Module):
    def forward(self, x):
        z = x.to(torch.complex64) * 2
        return torch.view_as_real(z)


class _ComplexOutput(torch.nn.Module):
    def forward(self, x):
        return x.to(torch.complex64)


def test_complex_dtype_is_traced_and_exported_inside_the_model():
    model = _ComplexInside()
    result = export_and_validate(model, (torch.randn(3, 4),), dynamic_shapes={"x": {0: "n"}})
    assert onnx_dims(result.model_proto)["output"] == ["n", 4, 2]


def test_complex_output_is_refused_clearly():
    with pytest.raises(OnnxExportError, match=r"complex64 tensor.*view_as_real"):
        to_onnx(_ComplexOutput(), (torch.randn(3, 4),), dynamic_shapes={"x": {0: "n"}})


class _PaddedAttention(torch.nn.Module):
    """Attention over a padded batch: the padding queries see no key."""

    def forward(self, x, keep):
        q = x.unsqueeze(1)
        mask = (keep[:, None, :, None] & keep[:, None, None, :]).expand(-1, 1, -1, -1)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def test_attention_query_with_every_key_masked_gives_zeros_as_torch():
    """torch_lib filled the masked scores with the dtype's lowest value, so a fully
    masked row came out as the mean of the values where torch gives zeros."""
    x = torch.randn(2, 5, 4)
    keep = torch.tensor([[True, True, True, False, False], [True] * 5])
    model = _PaddedAttention()
    assert model(x, keep)[0, 0, 3].abs().max() == 0
    result = export_and_validate(
        model, (x, keep), dynamic_shapes=({0: "batch", 1: "seq"}, {0: "batch", 1: "seq"})
    )
    other_keep = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    report = validate(model, result, [(torch.randn(3, 3, 4), other_keep)])
    assert report.ok, report.format()


def test_attention_with_an_additive_mask_is_torch_libs():
    x = torch.randn(2, 5, 4)
    mask = torch.zeros(2, 1, 5, 5)
    mask[..., 3:] = -1e4

    class Additive(torch.nn.Module):
        def forward(self, x, mask):
            q = x.unsqueeze(1)
            return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)

    result = export_and_validate(
        Additive(), (x, mask), dynamic_shapes=({0: "b", 1: "s"}, {0: "b", 2: "s", 3: "s"})
    )
    model_nodes = [n for n in result.model_proto.graph.node if not is_check_node(n)]
    assert "Where" not in {n.op_type for n in model_nodes}


def test_attention_keeps_a_nan_of_the_inputs_as_torch():
    """Only the rows whose keys are all hidden become zeros: a NaN in the values stays a
    NaN in the rows attending to it, as in torch."""
    x = torch.randn(2, 5, 4)
    keep = torch.tensor([[True, True, True, False, False], [True] * 5])
    x[1, 2, 1] = float("nan")
    model = _PaddedAttention()
    expected = model(x, keep)
    assert expected.isnan().any() and not expected[0].isnan().any()
    result = to_onnx(
        model, (x, keep), dynamic_shapes=({0: "batch", 1: "seq"}, {0: "batch", 1: "seq"})
    )
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    (got,) = session.run(None, dict(zip(names, (x.numpy(), keep.numpy()))))
    got = torch.from_numpy(got)
    torch.testing.assert_close(got.isnan(), expected.isnan())
    torch.testing.assert_close(got.nan_to_num(), expected.nan_to_num(), atol=1e-5, rtol=1e-5)


class SameNameInAndOut(torch.nn.Module):
    """Named as a diffusers UNet names them: ``sample`` in, ``sample`` out."""

    def forward(self, sample, t):
        return {"sample": sample * t, "t": t + 1}


def test_an_output_named_like_an_input_gets_its_own_name():
    """ONNX names each value once: the output is ``sample_output``, not a refusal."""
    sample, t = torch.randn(2, 3), torch.randn(2, 3)
    dynamic_shapes = ({0: "batch"}, {0: "batch"})
    result = export_and_validate(SameNameInAndOut(), (sample, t), dynamic_shapes=dynamic_shapes)
    assert result.output_names == ["sample_output", "t_output"]
    assert [i.name for i in result.model_proto.graph.input] == ["sample", "t"]
