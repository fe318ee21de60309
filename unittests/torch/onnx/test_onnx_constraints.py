"""Constraints adopted by the capture reach the ONNX model and its validation.

The model states what it assumes of its inputs (``metadata_props["yobx.constraints"]``,
:attr:`ExportResult.constraints`), and validation only picks sizes inside the
constraints (an even dimension stays even, ``total == past + seq`` holds).
"""

import json

import pytest
import torch
from torch.export import Dim

from yobx.torch.onnx import to_onnx

from ._helpers import export_and_validate, onnx_dims


class Halves(torch.nn.Module):
    def forward(self, x):
        b, d = x.shape
        return x.reshape(b, d // 2, 2).sum(-1)


class MaskedStep(torch.nn.Module):
    def forward(self, x, cache, mask):
        return torch.cat([cache, x], dim=1) * mask[:, :, None]


def _metadata(result):
    props = {p.key: p.value for p in result.model_proto.metadata_props}
    return json.loads(props["yobx.constraints"])


def test_divisibility_is_reported_and_validation_keeps_it():
    result = export_and_validate(
        Halves(), (torch.randn(3, 6),), dynamic_shapes={"x": {0: "batch", 1: "d"}}
    )
    assert [(c.expression, c.kind) for c in result.constraints] == [("d % 2 == 0", "divisibility")]
    (entry,) = _metadata(result)
    assert entry["expression"] == "d % 2 == 0" and entry["kind"] == "divisibility"
    assert entry["location"].startswith(__file__)
    # every size validated keeps d even, and d itself was varied
    descriptions = [case.description for case in result.validation.cases]
    varied = [d for d in descriptions if "d=" in d]
    assert varied, descriptions
    for description in varied:
        sizes = dict(part.split("=") for part in description.split(","))
        assert int(sizes["d"]) % 2 == 0, description
    assert onnx_dims(result.model_proto)["x"][0] == "batch"


def test_relation_is_reported_and_validation_keeps_it():
    inputs = (torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.rand(2, 8))
    shapes = {
        "x": {0: "batch", 1: "seq"},
        "cache": {0: "batch", 1: "past"},
        "mask": {0: "batch", 1: "total"},
    }
    result = export_and_validate(MaskedStep(), inputs, dynamic_shapes=shapes)
    assert [c.expression for c in result.constraints] == ["total == past + seq"]
    assert result.range_constraints["total"][0] >= 4
    compared = [c for c in result.validation.cases[1:] if c.check is None]
    for case in compared:
        sizes = dict(part.split("=") for part in case.description.split(","))
        if {"past", "seq", "total"} <= set(sizes):
            assert int(sizes["total"]) == int(sizes["past"]) + int(sizes["seq"])


def test_no_constraint_no_metadata():
    result = to_onnx(
        torch.nn.Linear(4, 2), (torch.randn(3, 4),), dynamic_shapes={"input": {0: "b"}}
    )
    assert result.constraints == []
    assert "yobx.constraints" not in {p.key for p in result.model_proto.metadata_props}


@pytest.mark.parametrize(
    "dynamic_shapes",
    [
        {"x": {0: Dim.DYNAMIC}},
        {"x": {0: Dim.AUTO, 1: Dim.STATIC}},
        {"x": {0: "batch", 1: None}},
        {"x": [Dim.DYNAMIC, None]},
        ({0: "batch"},),
        [[Dim("batch"), None]],
    ],
    ids=["dynamic", "auto-static", "none-axis", "list-axes", "tuple", "list-of-list"],
)
@pytest.mark.parametrize("tracer", ["custom", "fx"])
def test_every_dynamic_shapes_form_exports(dynamic_shapes, tracer):
    class Model(torch.nn.Module):
        def forward(self, x):
            return x.relu() * 2

    result = export_and_validate(
        Model(), (torch.randn(3, 4),), dynamic_shapes=dynamic_shapes, tracer=tracer
    )
    dims = onnx_dims(result.model_proto)["x"]
    assert isinstance(dims[0], str) and dims[1] == 4, dims
