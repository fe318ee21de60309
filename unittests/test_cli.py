"""The ``yobx`` command run as a subprocess: files written, exit codes of bad input."""

import os
import subprocess
import sys

import onnx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_yobx(*args, cwd=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "yobx", *args],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env=env,
        timeout=600,
    )


def test_export_tiny_llm_dynamic_validate(tmp_path):
    output = tmp_path / "tiny_llm.onnx"
    result = run_yobx("export", "tiny-llm", "-o", str(output), "--dynamic", "--validate")
    assert result.returncode == 0, result.stderr
    model = onnx.load(str(output))
    onnx.checker.check_model(model)
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq"]
    for stage in ("capture", "lower", "translate", "optimize", "validate"):
        assert stage in result.stdout
    assert "dynamic dimensions  batch, seq, past, past+seq" in result.stdout
    assert "validation          OK" in result.stdout
    assert f"wrote {output}" in result.stdout


def test_export_factory_static_with_opset(tmp_path):
    output = tmp_path / "lstm.onnx"
    # A factory given as package.module:factory, exported without --dynamic.
    result = run_yobx(
        "export", "yobx.models:tiny_lstm", "-o", str(output), "--opset", "20", "--validate"
    )
    assert result.returncode == 0, result.stderr
    model = onnx.load(str(output))
    assert {o.domain: o.version for o in model.opset_import}[""] == 20
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 5]
    assert "none (use --dynamic)" in result.stdout


def test_trace_prints_graph_and_guards():
    result = run_yobx("trace", "tiny-llm", "--dynamic")
    assert result.returncode == 0, result.stderr
    assert "def forward" in result.stdout
    assert "input_ids" in result.stdout
    assert "guards (" in result.stdout
    assert "constraints (" in result.stdout and "ranges: batch in [" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("export", "no-such-model", "-o", "x.onnx"), "unknown model 'no-such-model'"),
        (("export", "yobx.no_such_module:f", "-o", "x.onnx"), "cannot import module"),
        (("export", "yobx.models:no_such_factory", "-o", "x.onnx"), "has no callable"),
        (("export", "yobx.models:ModelLoadError", "-o", "x.onnx"), "must return (model"),
        (("export", "tiny-llm", "-o", "/no/such/dir/x.onnx"), "cannot write"),
        (("trace", "no-such-model"), "unknown model"),
    ],
    ids=["unknown", "no-module", "no-factory", "bad-factory", "unwritable", "trace-unknown"],
)
def test_bad_input_exits_with_one_line(args, message):
    result = run_yobx(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("yobx: error: ")
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_bad_input_verbose_shows_traceback():
    result = run_yobx("export", "yobx.no_such_module:f", "-o", "x.onnx", "--verbose")
    assert result.returncode == 2
    assert "Traceback" in result.stderr


def test_factory_that_raises(tmp_path):
    (tmp_path / "broken_factory.py").write_text(
        "def make():\n    raise RuntimeError('weights missing')\n"
    )
    env_path = str(tmp_path)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env_path])
    result = subprocess.run(
        [sys.executable, "-m", "yobx", "export", "broken_factory:make", "-o", "x.onnx"],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        env=env,
        timeout=600,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "yobx: error: factory 'broken_factory:make' failed: RuntimeError: weights missing"
    )


_FACTORIES = """
import torch


class Model(torch.nn.Module):
    def forward(self, input_ids, attention_mask):
        return (input_ids * attention_mask).cumsum(dim=1)


class Other(torch.nn.Module):
    def forward(self, features):
        return features * 2


def by_role():
    ids = torch.randint(0, 9, (2, 5))
    return Model(), (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def unknown_role():
    return Other(), (torch.randn(3, 4),)
"""


def _run_factory(tmp_path, factory, *extra):
    (tmp_path / "role_factories.py").write_text(_FACTORIES)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, str(tmp_path)])
    output = tmp_path / "model.onnx"
    command = ["export", f"role_factories:{factory}", "-o", str(output), "--dynamic", *extra]
    result = subprocess.run(
        [sys.executable, "-m", "yobx", *command],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        env=env,
        timeout=600,
    )
    return result, output


def test_export_dynamic_derives_shapes_from_input_roles(tmp_path):
    result, output = _run_factory(tmp_path, "by_role", "--validate")
    assert result.returncode == 0, result.stderr
    assert "derived from the inputs' roles: input_ids: {0: 'batch', 1: 'seq'}" in result.stdout
    assert "validation          OK" in result.stdout
    model = onnx.load(str(output))
    for value in model.graph.input:
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        assert dims == ["batch", "seq"], (value.name, dims)


def test_export_dynamic_without_shapes_or_roles_fails(tmp_path):
    result, output = _run_factory(tmp_path, "unknown_role")
    assert result.returncode == 2, result.stdout
    assert "declares no dynamic shapes" in result.stderr
    assert "['features']" in result.stderr
    assert "dynamic_shapes" in result.stderr
    assert not output.exists()


def test_export_unsupported_opset_names_the_range(tmp_path):
    result = run_yobx("export", "tiny-cnn", "-o", str(tmp_path / "m.onnx"), "--opset", "17")
    assert result.returncode == 2
    assert "opset 17 is not supported: to_onnx writes ONNX opsets 18 to" in result.stderr
