"""inspect_model / run_inspect behind ``yobx inspect`` (the command itself, run as a
user runs it, is tested in test_cli.py)."""

import io
import json
import sys
import types

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch
from onnx import numpy_helper

from yobx.cli import main
from yobx.cli_support import CommandError
from yobx.inspect_command import inspect_model, run_inspect


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.linear(x)) * 2


def _model_and_onnx(factor: float = 2.0):
    torch.manual_seed(0)
    model = Model().eval()
    nodes = [
        oh.make_node("Gemm", ["x", "w", "b"], ["linear"], transB=1),
        oh.make_node("Relu", ["linear"], ["relu"]),
        oh.make_node("Mul", ["relu", "two"], ["mul"]),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, 4])],
        [oh.make_tensor_value_info("mul", onnx.TensorProto.FLOAT, [None, 3])],
        [
            numpy_helper.from_array(model.linear.weight.detach().numpy(), "w"),
            numpy_helper.from_array(model.linear.bias.detach().numpy(), "b"),
            numpy_helper.from_array(np.array(factor, dtype=np.float32), "two"),
        ],
    )
    return model, oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_inspect_model_ok_and_profile(tmp_path):
    model, proto = _model_and_onnx()
    out = io.StringIO()
    profile = str(tmp_path / "p.json")
    code = inspect_model(
        model, (torch.randn(3, 4),), onnx_model=proto, profile_path=profile, stream=out
    )
    text = out.getvalue()
    assert code == 0, text
    assert "stage 'eager': 1 calls" in text and "stage 'onnx': 3 calls" in text
    assert "compare 'graph' vs 'onnx': 3 matched calls" in text
    assert "no divergence" in text
    with open(profile) as f:
        events = json.load(f)["traceEvents"]
    assert {"stage:eager", "stage:graph", "stage:onnx"} <= {e["name"] for e in events}


def test_inspect_model_reports_divergence(tmp_path):
    model, proto = _model_and_onnx(factor=3.0)
    out = io.StringIO()
    code = inspect_model(model, (torch.randn(3, 4),), onnx_model=proto, stream=out, verbose=1)
    text = out.getvalue()
    assert code == 1
    assert "first divergence at 'mul'" in text
    assert "#  run  name" in text  # verbose=1 prints the tables


def test_run_inspect_bad_inputs(tmp_path, capsys):
    assert main(["inspect", "tiny-llm", "--onnx", str(tmp_path / "missing.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.onnx" in err and "does not exist" in err
    with pytest.raises(CommandError, match="does not exist") as info:
        run_inspect("tiny-llm", None, str(tmp_path / "no" / "dir" / "p.json"), 0)
    assert info.value.status == 2


def test_run_inspect_with_named_model(tmp_path, monkeypatch, capsys):
    model, proto = _model_and_onnx()
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    x = torch.randn(2, 4)

    import yobx.models

    def load_model(name):
        if name != "small":
            raise yobx.models.ModelLoadError(f"unknown model {name!r}")
        return model, (x,), {}, None

    fake = types.ModuleType("yobx.models")
    fake.load_model = load_model
    fake.ModelLoadError = yobx.models.ModelLoadError
    monkeypatch.setitem(sys.modules, "yobx.models", fake)
    assert run_inspect("small", str(path), str(tmp_path / "p.json.gz"), 0) == 0
    out = capsys.readouterr()
    assert "no divergence" in out.out and out.err == ""
    assert (tmp_path / "p.json.gz").exists()
    assert main(["inspect", "other"]) == 2
    assert capsys.readouterr().err.strip() == "yobx: error: unknown model 'other'"


def test_inspect_model_failure_says_the_model_raises(capsys):
    class Broken(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("broken model\nsecond line")

    with pytest.raises(CommandError) as info:
        inspect_model(Broken(), (torch.randn(2),))
    assert info.value.status == 3
    # the eager call before the recording fails: the model, not the recording
    assert str(info.value).startswith(
        "the model raises on the example inputs: RuntimeError: broken model;"
    )
    assert isinstance(info.value.__cause__, RuntimeError)


def test_inspect_says_when_timings_are_unreliable(monkeypatch):
    import io

    from yobx import inspect_command

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    monkeypatch.setattr(inspect_command.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    stream = io.StringIO()
    assert inspect_model(model, (torch.randn(2, 4),), stream=stream) == 0
    assert "note: the machine is busy (load 64.0 on" in stream.getvalue()
    monkeypatch.setattr(inspect_command.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    stream = io.StringIO()
    assert inspect_model(model, (torch.randn(2, 4),), stream=stream) == 0
    assert "busy" not in stream.getvalue()
