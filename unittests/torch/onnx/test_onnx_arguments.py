"""Python scalar arguments, opsets and cache names (issue 12, items 5 to 7)."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch.export import Dim

import yobx
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.export import supported_opsets
from yobx.torch.onnx.validation import validate

from ._helpers import export_and_validate, onnx_dims


class _Scaled(torch.nn.Module):
    def forward(self, x, alpha=1.0, flag=False, k=1):
        y = x * alpha + k
        return -y if flag else y


@pytest.mark.parametrize("as_keywords", [False, True], ids=["positional", "keyword"])
def test_python_scalars_are_constants_with_guards(as_keywords):
    model, x = _Scaled(), torch.randn(3, 4)
    if as_keywords:
        args, kwargs = (x,), {"alpha": 2.5, "flag": True, "k": 3}
    else:
        args, kwargs = (x, 2.5, True, 3), {}
    result = export_and_validate(model, args, kwargs, dynamic_shapes={"x": {0: "n"}})
    assert [i.name for i in result.model_proto.graph.input] == ["x"]
    guards = [str(g) for g in result.guards]
    for expected in ("alpha == 2.5", "flag == True", "k == 3"):
        assert any(expected in g for g in guards), guards
    # the constants are the example's: other sizes of x, same scalars
    others = [((torch.randn(6, 4), *args[1:]), kwargs), ((torch.randn(1, 4), *args[1:]), kwargs)]
    report = validate(model, result, others)
    assert report.ok and report.n_checked == 2, report.format()


def test_int_declared_dynamic_is_an_input():
    model = _Scaled()
    result = export_and_validate(
        model,
        (torch.randn(3, 4),),
        {"k": 3},
        dynamic_shapes={"x": {0: "n"}, "k": Dim.DYNAMIC},
        min_cases=4,
    )
    assert onnx_dims(result.model_proto)["k"] == []
    labels = [case.description for case in result.validation.cases]
    assert any(label.startswith("k=") for label in labels), labels
    report = validate(model, result, [((torch.randn(5, 4),), {"k": -7})])
    assert report.ok and report.n_checked == 1, report.format()


def test_float_declared_dynamic_is_refused_clearly():
    with pytest.raises(ValueError, match="only int arguments can be dynamic"):
        to_onnx(_Scaled(), (torch.randn(3, 4), 2.0), dynamic_shapes=(None, Dim.DYNAMIC))


class _Small(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.layer_norm(x.relu(), (4,)).sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("opset", list(supported_opsets()))
def test_opset_is_honoured(opset):
    model = _Small()
    result = to_onnx(model, (torch.randn(3, 4),), dynamic_shapes={"x": {0: "n"}}, opset=opset)
    imports = {o.domain: o.version for o in result.model_proto.opset_import}
    assert imports[""] == opset
    onnx.checker.check_model(result.model_proto)
    report = validate(model, result, [(torch.randn(3, 4),), (torch.randn(7, 4),)])
    assert report.ok and report.n_checked == 2, report.format()


@pytest.mark.parametrize("opset", [17, 7, 99, "18", 18.0, True])
def test_unsupported_opset_names_the_range(opset):
    supported = supported_opsets()
    message = f"to_onnx writes ONNX opsets {supported.start} to {supported.stop - 1}"
    with pytest.raises(ValueError, match=message):
        to_onnx(_Small(), (torch.randn(3, 4),), opset=opset)


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gemma"])
def test_decode_step_cache_names_do_not_collide(architecture):
    pytest.importorskip("transformers")
    from yobx.models.architectures import decoders

    case = getattr(decoders, f"{architecture}_decode")()
    result = to_onnx(case.model, case.args, case.kwargs, dynamic_shapes=case.dynamic_shapes)
    inputs = [i.name for i in result.model_proto.graph.input]
    assert inputs == [
        "input_ids",
        "attention_mask",
        "past_key_values.0.key",
        "past_key_values.0.value",
        "past_key_values.1.key",
        "past_key_values.1.value",
    ]
    assert result.output_names == [
        "logits",
        "present.0.key",
        "present.1.key",
        "present.0.value",
        "present.1.value",
    ]
    dims = onnx_dims(result.model_proto)
    assert dims["past_key_values.0.key"][:3] == ["batch", dims["past_key_values.0.key"][1], "past"]
    assert dims["present.0.key"][2] == "past+seq"
    assert dims["attention_mask"] == ["batch", "total"]
    # three (batch, seq, past) sizes: the example's and two others
    report = validate(case.model, result, [((), case.kwargs), *case.other_inputs])
    assert report.ok and report.n_checked == 3, report.format()
    shapes = {case_.outputs[1].shape for case_ in report.cases}
    assert len(shapes) == 3, shapes


class BuiltinNamedArguments(torch.nn.Module):
    def forward(self, input, id):
        input.mul_(2)
        return input + id


def test_arguments_named_like_builtins_keep_their_names():
    # torch.fx names their placeholders input_1 and id_1: the ONNX inputs do not
    result = to_onnx(
        BuiltinNamedArguments(),
        (torch.randn(2, 3), torch.randn(2, 3)),
        dynamic_shapes=({0: "b"}, {0: "b"}),
        validate=True,
    )
    assert [i.name for i in result.model_proto.graph.input] == ["input", "id"]
    assert result.validation.ok, result.validation.format()
    assert result.model_proto.producer_name == "yobx"
    assert result.model_proto.producer_version == yobx.__version__
