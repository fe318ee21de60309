"""Outputs whose sizes depend on the data export with named dynamic dimensions,
also inside ``torch.cond`` branches (issue 12, item 4)."""

from __future__ import annotations

import pytest
import torch

from yobx.torch.onnx.validation import validate

from ._helpers import export_and_validate, onnx_dims


class _BooleanMask(torch.nn.Module):
    def forward(self, x):
        return x[x > 0]


class _Nonzero(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0)


class _WhereOneArgument(torch.nn.Module):
    def forward(self, x):
        return torch.where(x > 0)


class _MaskedSelect(torch.nn.Module):
    def forward(self, x):
        return torch.masked_select(x, x > 0) * 2


class _Unique(torch.nn.Module):
    def forward(self, x):
        return torch.unique(x.round())


class _Bincount(torch.nn.Module):
    def forward(self, x):
        return torch.bincount((x.abs() * 3).to(torch.int64).flatten())


class _RepeatInterleave(torch.nn.Module):
    def forward(self, x):
        repeats = (x[:, 0] > 0).to(torch.int64) * 2
        return torch.repeat_interleave(x, repeats, dim=0)


class _MaskInCond(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x[x > 0], lambda x: x[x < 0] * 2, (x,))


def _mask_sets(shape):
    """Inputs whose masks (``x > 0``) select none, all, and some of the elements."""
    some = torch.randn(*shape)
    return [(-torch.rand(*shape) - 0.1,), (torch.rand(*shape) + 0.1,), (some,)]


@pytest.mark.parametrize(
    ("model", "output_dim"),
    [
        (_BooleanMask(), ["getitem_dim0"]),
        (_Nonzero(), ["nonzero_dim0", 2]),
        (_MaskedSelect(), ["masked_select_dim0"]),
        (_Unique(), None),
        (_Bincount(), None),
        (_RepeatInterleave(), ["repeat_interleave_dim0", 3]),
        (_MaskInCond(), ["cond_0_dim0"]),
    ],
    ids=["mask", "nonzero", "masked_select", "unique", "bincount", "repeat_interleave", "cond"],
)
def test_data_dependent_output_size(model, output_dim):
    torch.manual_seed(0)
    result = export_and_validate(model, (torch.randn(5, 3),), dynamic_shapes={"x": {0: "n"}})
    dims = onnx_dims(result.model_proto)
    assert dims["x"] == ["n", 3]
    (output,) = result.output_names
    first = dims[output][0]
    assert isinstance(first, str) and first and not first.isdigit(), dims[output]
    if output_dim is not None:
        assert dims[output] == output_dim
    inputs = _mask_sets((5, 3)) + _mask_sets((8, 3)) + [(torch.randn(9, 3) * 4,)]
    report = validate(model, result, inputs)
    assert report.ok and report.n_checked == len(inputs), report.format()
    counts = {case.outputs[0].shape[0] for case in report.cases}
    # masks selecting none, all or some elements; more values, more distinct values
    assert len(counts) >= 3, counts


def test_where_gives_one_named_dimension_per_output():
    model = _WhereOneArgument()
    result = export_and_validate(model, (torch.randn(5, 3),), dynamic_shapes={"x": {0: "n"}})
    dims = onnx_dims(result.model_proto)
    assert dims["output_0"] == dims["output_1"] == ["where_0_dim0"]
    report = validate(model, result, _mask_sets((4, 3)))
    assert report.ok and report.n_checked == 3, report.format()
