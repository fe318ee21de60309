"""Declared dynamic dimensions stay symbolic and named through lowering and translation,
and validation varies each of them (issue 12, items 1 to 3)."""

from __future__ import annotations

import math
import subprocess
import sys

import onnx_ir as ir
import pytest
import torch
import torch.nn.functional as F

from yobx.torch.onnx import OnnxExportError, to_onnx
from yobx.torch.onnx.validation import validate

from ._helpers import export_and_validate, onnx_dims


def _op_types(result) -> set[str]:
    return {node.op_type for node in result.model_proto.graph.node}


def _check_other_sizes(model, result, inputs_list):
    """onnxruntime equals eager on explicit inputs of other sizes."""
    report = validate(model, result, inputs_list)
    assert report.ok and report.n_checked == len(inputs_list), report.format()


class _DivideBySqrtOfSize(torch.nn.Module):
    def forward(self, x):
        return x / math.sqrt(x.shape[0])


class _SliceOfSizeOne(torch.nn.Module):
    # the example (size 2) makes the intermediate x[1:] of size 1
    def forward(self, x):
        return x[1:] * 2


class _DeadSliceAssignment(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        y[:, 1:] = y[:, :-1].clone()
        return x + 1


class _LastRowAssignment(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        y[y.shape[0] - 1] = -1.0
        return y


def test_math_of_a_dimension_is_computed_from_the_shape():
    model = _DivideBySqrtOfSize()
    result = export_and_validate(model, (torch.randn(4, 3),), dynamic_shapes={"x": {0: "n"}})
    assert onnx_dims(result.model_proto)["x"] == ["n", 3]
    assert {"Shape", "Sqrt"} <= _op_types(result)
    _check_other_sizes(model, result, [(torch.randn(9, 3),), (torch.randn(1, 3),)])


@pytest.mark.parametrize(
    ("model", "shape", "dynamic_shapes", "expected"),
    [
        (_SliceOfSizeOne(), (2, 3), {"x": {0: "n"}}, ["n", 3]),
        (_DeadSliceAssignment(), (3, 4), {"x": {0: "n", 1: "m"}}, ["n", "m"]),
        (_LastRowAssignment(), (3, 4), {"x": {0: "n"}}, ["n", 4]),
    ],
    ids=["size_one_intermediate", "dead_slice_assignment", "last_row_assignment"],
)
def test_declared_dimension_stays_symbolic(model, shape, dynamic_shapes, expected):
    result = export_and_validate(model, (torch.randn(*shape),), dynamic_shapes=dynamic_shapes)
    assert onnx_dims(result.model_proto)["x"] == expected
    for value in [*result.model_proto.graph.input, *result.model_proto.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            assert not dim.dim_param.isdigit(), (value.name, dim.dim_param)
    others = [(torch.randn(5, *shape[1:]),), (torch.randn(2 * shape[0], *shape[1:]),)]
    _check_other_sizes(model, result, others)


def test_dead_code_is_not_lowered():
    result = to_onnx(_DeadSliceAssignment(), (torch.randn(3, 4),), dynamic_shapes=({0: "n"},))
    targets = {str(n.target) for n in result.graph_module.graph.nodes}
    assert not any("setitem" in t or "clone" in t for t in targets), targets


def test_lost_dimension_is_an_error_naming_it():
    """The final check: a declared dimension that is a number in the ONNX inputs."""
    from yobx.torch.onnx.capture import capture
    from yobx.torch.onnx.declared import check_declared_dimensions, declared_dimensions
    from yobx.torch.onnx.dimensions import DimensionRenamer, rename_dimensions
    from yobx.torch.onnx.lowering import lower_to_aten
    from yobx.torch.onnx.translate import build_model

    model, args, dynamic_shapes = _LastRowAssignment(), (torch.randn(3, 4),), {"x": {0: "n"}}
    captured = capture(model, args, {}, dynamic_shapes)
    lowered = lower_to_aten(captured.graph_module)
    ir_model = build_model(lowered, ["output"])
    renamer = DimensionRenamer(dict(captured.dimension_names), captured.shape_env)
    rename_dimensions(ir_model, renamer)
    declared = declared_dimensions(model, args, {}, dynamic_shapes, captured.graph_module)
    check_declared_dimensions(ir_model, declared, renamer, captured, lowered)
    ir_model.graph.inputs[0].shape = ir.Shape([3, 4])
    with pytest.raises(OnnxExportError, match=r"'n' \(axis 0 of x\) is 3 in the ONNX model"):
        check_declared_dimensions(ir_model, declared, renamer, captured, lowered)
    ir_model.graph.inputs[0].shape = ir.Shape(["seq", 4])
    with pytest.raises(OnnxExportError, match="named 'seq' in the ONNX model instead of 'n'"):
        check_declared_dimensions(ir_model, declared, renamer, captured, lowered)


class _TwoInputs(torch.nn.Module):
    def forward(self, x, y):
        return x.sum(dim=1, keepdim=True) * y.mean()


def test_validation_varies_each_dimension_alone_and_together():
    model = _TwoInputs()
    args = (torch.randn(3, 4), torch.randn(5))
    result = export_and_validate(
        model, args, dynamic_shapes={"x": {0: "n", 1: "m"}, "y": {0: "k"}}, min_cases=5
    )
    labels = [case.description for case in result.validation.cases]
    assert labels[0] == "example"
    for name in ("n", "m", "k"):
        assert any(label.startswith(f"{name}=") and "," not in label for label in labels), labels
    assert any(label.count(",") == 2 for label in labels), labels
    table = str(result.validation)
    header = ["case", "output", "shape", "max", "abs", "max", "rel", "status"]
    assert table.splitlines()[0].split() == header
    assert "validation ok" in table.splitlines()[-1]


class _OnlyAtExampleSize(torch.nn.Module):
    # eager refuses every other size, in a way the capture does not see
    def forward(self, x):
        if not torch.fx._symbolic_trace.is_fx_tracing() and x.shape[0] != 3:
            raise ValueError("only 3 rows")
        return x * 2


def test_validation_fails_when_a_declared_dimension_cannot_be_varied():
    result = to_onnx(
        _OnlyAtExampleSize(), (torch.randn(3, 4),), dynamic_shapes={"x": {0: "n"}}, validate=True
    )
    report = result.validation
    assert not report.ok
    assert report.n_checked == 1
    assert any("'n' (axis 0 of x) was never compared" in r for r in report.reasons())
    assert "NOT OK" in str(report)


class _NumbersFromSizes(torch.nn.Module):
    """int(), float(), round() and math.ceil of dimensions (Never narrow, item 2)."""

    def forward(self, x):
        h, w = x.shape[-2:]
        up = F.interpolate(x, size=(int(h // 2), round(w * 0.75)), mode="nearest")
        padded = math.ceil(h / 4) * 4
        return up.sum((-1, -2)) / float(w) + F.pad(x, (0, 0, 0, padded - h)).sum((-1, -2))


def test_numbers_from_sizes_stay_symbolic_in_onnx():
    model = _NumbersFromSizes()
    result = to_onnx(
        model,
        (torch.randn(2, 3, 8, 6),),
        dynamic_shapes={"x": {0: "batch", 2: "h", 3: "w"}},
        validate=True,
    )
    assert result.validation.ok, result.validation.format()
    assert result.constraints == []
    shapes = [(1, 3, 5, 9), (3, 3, 13, 4), (2, 3, 2, 2)]
    _check_other_sizes(model, result, [(torch.randn(*s),) for s in shapes])


class _HalvesThenPadIfOdd(torch.nn.Module):
    # `width % 2 != 0` gives two versions; the even one knows `width == 2*q` and the
    # odd one `width == 2*q + 1`, each naming its own q after `width`
    def forward(self, x):
        a, b = x.split([x.shape[0] // 2, x.shape[0] - x.shape[0] // 2], 0)
        y = a.sum(0, keepdim=True) + b
        if x.shape[0] % 2 != 0:
            y = F.pad(y, (0, 1))
        return y


def test_versions_name_the_quotients_of_their_divisibility_apart():
    """Two versions name their quotient of ``width`` by 2 alike but mean other sizes
    (``width/2`` and ``(width - 1)/2``): the input stays ``width`` and the nodes both
    versions share get no name that onnxruntime would take for one size (it refused
    odd widths: "Shape mismatch attempting to re-use buffer")."""
    model = _HalvesThenPadIfOdd()
    result = to_onnx(model, (torch.randn(6),), dynamic_shapes={"x": {0: "width"}})
    assert onnx_dims(result.model_proto)["x"] == ["width"]
    names = {
        d.dim_param
        for v in [*result.model_proto.graph.value_info, *result.model_proto.graph.output]
        for d in v.type.tensor_type.shape.dim
    }
    assert names and not any("div2" in name for name in names), names
    _check_other_sizes(model, result, [(torch.randn(n),) for n in (2, 3, 5, 6, 7, 10)])


class _MaskOverCacheAndTokens(torch.nn.Module):
    def forward(self, ids, mask, past):
        total = past.shape[1] + ids.shape[1]
        if mask.shape[1] > total:
            mask = mask[:, -total:]
        elif mask.shape[1] < total:
            mask = F.pad(mask, (total - mask.shape[1], 0))
        return torch.cat([past, ids], 1) * mask


def test_an_axis_declared_as_a_sum_of_dimensions_is_named_and_checked():
    """``"past + seq"``: the ONNX input carries the sum as its dimension, the model has
    no version for masks longer or shorter than the sum, is exact at other sizes and
    refuses a mask of another length, naming the declaration."""
    import onnxruntime

    from yobx.torch.onnx.runtime_checks import failed_check

    model = _MaskOverCacheAndTokens()

    def inputs(batch, seq, past, extra=0):
        return {
            "ids": torch.randn(batch, seq),
            "mask": torch.rand(batch, past + seq + extra),
            "past": torch.randn(batch, past),
        }

    shapes = {
        "ids": {0: "batch", 1: "seq"},
        "mask": {0: "batch", 1: "past + seq"},
        "past": {0: "batch", 1: "past"},
    }
    result = export_and_validate(model, kwargs=inputs(2, 3, 5), dynamic_shapes=shapes)
    assert not result.versions
    assert onnx_dims(result.model_proto)["mask"] == ["batch", "past+seq"]
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for case in [(2, 3, 5), (1, 1, 0), (3, 1, 9), (1, 6, 0)]:
        feeds = inputs(*case)
        (got,) = session.run(None, {k: v.numpy() for k, v in feeds.items()})
        torch.testing.assert_close(torch.from_numpy(got), model(**feeds))
    feeds = inputs(2, 3, 5, extra=2)
    with pytest.raises(Exception) as info:
        session.run(None, {k: v.numpy() for k, v in feeds.items()})
    assert "mask.size(1) == past + seq" in (failed_check(str(info.value)) or ""), info.value


def test_dimension_names_take_common_factors_out_without_importing_sympy_physics():
    """``batch*past + batch*seq`` is named ``batch*(past+seq)`` (what sympy.simplify
    gave), without sympy.simplify's import of sympy.physics.units, a third of a second
    of a process's first export."""
    code = (
        "import sys, sympy\n"
        "from yobx.torch.onnx.dimensions import DimensionRenamer\n"
        "s0, s1, s2 = sympy.symbols('s0 s1 s2', integer=True, positive=True)\n"
        "names = {'s0': sympy.Symbol('batch'), 's1': sympy.Symbol('past'),"
        " 's2': sympy.Symbol('seq')}\n"
        "renamer = DimensionRenamer(names, None)\n"
        "print(renamer.expression(s0 * s1 + s0 * s2), renamer.expression(s1 + s2 + 1),"
        " renamer.expression(sympy.floor(s1 / 2 + sympy.Rational(1, 2))),"
        " 'sympy.physics.units' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["batch*(past+seq)", "past+seq+1", "floor(past/2+1/2)", "False"]
