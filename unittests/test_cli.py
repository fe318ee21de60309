"""The ``yobx`` command run as a user runs it: files written, stages on stderr, the
summary on stdout, exit codes of bad input.

The command is the installed ``yobx`` script when it runs this checkout; otherwise a
launcher equivalent to it (``from yobx.cli import main``, the current directory not on
``sys.path``) with this checkout on ``PYTHONPATH``.
"""

import functools
import json
import os
import re
import subprocess
import sys
import textwrap

import onnx
import pytest

from yobx.cli import main
from yobx.cli_support import CommandError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("capture", "passes", "lower", "translate", "optimize", "save", "validate")


@functools.cache
def _installed_checkout(tmp: str) -> str | None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run(
        [sys.executable, "-c", "import os, yobx; print(os.path.dirname(yobx.__path__[0]))"],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=env,
    )
    return probe.stdout.strip() or None


def _command(tmp_path_factory) -> tuple[list[str], dict]:
    tmp = str(tmp_path_factory.getbasetemp())
    script = os.path.join(os.path.dirname(sys.executable), "yobx")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if os.path.exists(script) and _installed_checkout(tmp) == ROOT:
        return [script], env
    launcher = os.path.join(tmp, "bin", "yobx_launcher.py")
    os.makedirs(os.path.dirname(launcher), exist_ok=True)
    with open(launcher, "w") as f:
        f.write("import sys\nfrom yobx.cli import main\nsys.exit(main())\n")
    env["PYTHONPATH"] = ROOT
    return [sys.executable, launcher], env


@pytest.fixture(scope="module")
def yobx_command(tmp_path_factory):
    command, env = _command(tmp_path_factory)

    def run(*args, cwd=None):
        return subprocess.run(
            [*command, *args],
            capture_output=True,
            text=True,
            cwd=cwd or ROOT,
            env=env,
            timeout=600,
        )

    run.command, run.env = command, env
    return run


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_export_tiny_llm_is_dynamic_by_default(yobx_command, tmp_path):
    output = tmp_path / "tiny_llm.onnx"
    result = yobx_command("export", "tiny-llm", "-o", str(output), "--validate")
    assert result.returncode == 0, result.stderr
    model = onnx.load(str(output))
    onnx.checker.check_model(model)
    assert _dims(model.graph.input[0]) == ["batch", "seq"]
    assert _dims(model.graph.input[1]) == ["batch", 4, "past", 8]
    # every stage on stderr, with its time, as it ends
    stage_lines = [line for line in result.stderr.splitlines() if line.startswith("yobx: ")]
    names = [line.split()[1] for line in stage_lines]
    for stage in STAGES:
        assert stage in names, result.stderr
    assert names.index("capture") < names.index("save") < names.index("validate")
    assert all(line.split()[3] == "s" for line in stage_lines), stage_lines
    # the summary on stdout
    out = result.stdout
    assert re.search(r"^inputs\n  input_ids +int64 +\[batch, seq\]$", out, re.M)
    assert re.search(r"^  past_key_values\.0\.key +float32 +\[batch, 4, past, 8\]$", out, re.M)
    assert re.search(r"^outputs\n  logits +float32 +\[batch, seq, 128\]$", out, re.M)
    assert re.search(r"^  present\.0\.key +float32 +\[batch, 4, past\+seq, 8\]$", out, re.M)
    assert "dynamic dimensions  batch, seq, past, past+seq" in out
    assert "constraints         none" in out
    assert "  example  " in out and "  batch=5  " in out  # the validation table
    assert "  OK: 5 input sets" in out
    assert f"wrote {output} (" in out
    assert "capture" not in out  # progress is not mixed with the summary


def test_export_static_opts_out(yobx_command, tmp_path):
    output = tmp_path / "lstm.onnx"
    result = yobx_command(
        "export", "yobx.models:tiny_lstm", "-o", str(output), "--static", "--opset", "20"
    )
    assert result.returncode == 0, result.stderr
    model = onnx.load(str(output))
    assert {o.domain: o.version for o in model.opset_import}[""] == 20
    assert _dims(model.graph.input[0]) == [2, 5]
    assert "dynamic dimensions  none (static)" in result.stdout


FACTORIES = """
import torch

class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask):
        hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        return self.head(hidden.sum(1))

def by_role():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 6))
    return Classifier().eval(), (ids, torch.ones(2, 6, dtype=torch.int64))

def declared():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8)
    return torch.nn.Linear(8, 3).eval(), (x,), {}, {"input": {0: "rows", 1: "cols"}}

def undeclared():
    return torch.nn.Linear(8, 3).eval(), (torch.randn(2, 8),)

class Noisy(torch.nn.Module):
    def forward(self, x):
        return x + torch.rand_like(x)

def noisy():
    # eager and every other run draw other numbers: the results disagree
    return Noisy(), (torch.randn(2, 3),), {}, {"x": {0: "batch"}}

class LongSequences(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] > 16:
            return x.sum(dim=1) * 2
        return x.mean(dim=1) + 1

def narrowed():
    return LongSequences(), (torch.randn(2, 8),), {}, {"x": {0: "batch", 1: "seq"}}

class Broken(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("broken model\\nsecond line")

def broken():
    return Broken(), (torch.randn(2, 3),), {}, {"x": {0: "batch"}}
"""


@pytest.fixture
def user_directory(tmp_path):
    (tmp_path / "mymodels.py").write_text(textwrap.dedent(FACTORIES))
    return tmp_path


def test_factory_in_current_directory_declares_dims(yobx_command, user_directory):
    result = yobx_command(
        "export", "mymodels:declared", "-o", "m.onnx", "--validate", cwd=user_directory
    )
    assert result.returncode == 0, result.stderr
    model = onnx.load(str(user_directory / "m.onnx"))
    assert _dims(model.graph.input[0]) == ["rows", "cols", 8]


def test_factory_dims_derived_from_input_roles(yobx_command, user_directory):
    result = yobx_command(
        "export", "mymodels.py:by_role", "-o", "r.onnx", "--validate", cwd=user_directory
    )
    assert result.returncode == 0, result.stderr
    model = onnx.load(str(user_directory / "r.onnx"))
    assert [_dims(i) for i in model.graph.input] == [["batch", "seq"], ["batch", "seq"]]
    assert "OK: " in result.stdout


def test_factory_without_dims_or_roles_says_how_to_declare(
    yobx_command, user_directory, capsys, monkeypatch
):
    monkeypatch.chdir(user_directory)
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)
    status = main(["export", "mymodels:undeclared", "-o", "u.onnx"])
    sys.modules.pop("mymodels", None)
    assert status == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith("yobx: error: 'mymodels:undeclared' declares no dynamic shapes")
    assert "'input' (float32 [2, 8])" in message
    assert "dynamic_shapes" in message and "--static" in message
    assert not (user_directory / "u.onnx").exists()
    # --static exports it as it is
    static = yobx_command(
        "export", "mymodels:undeclared", "-o", "u.onnx", "--static", cwd=user_directory
    )
    assert static.returncode == 0, static.stderr
    assert _dims(onnx.load(str(user_directory / "u.onnx")).graph.input[0]) == [2, 8]


def test_hf_config_and_sharded_weights(yobx_command, tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch

    from yobx.models.huggingface import tiny_config

    config = tiny_config("LlamaForCausalLM")
    with torch.random.fork_rng():
        torch.manual_seed(3)
        model = transformers.LlamaForCausalLM(config).eval()
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(str(checkpoint), max_shard_size="20KB")
    index = checkpoint / "model.safetensors.index.json"
    assert index.exists()
    output = tmp_path / "llama.onnx"
    result = yobx_command(
        "export",
        "hf:LlamaForCausalLM",
        "--config",
        str(checkpoint / "config.json"),
        "--weights",
        str(index),
        "-o",
        str(output),
        "--validate",
        "--external-data",
        "yes",
    )
    assert result.returncode == 0, result.stderr
    assert "yobx: weights" in result.stderr
    assert "OK: " in result.stdout
    assert f"wrote {output}.data (" in result.stdout
    onnx.checker.check_model(str(output))
    proto = onnx.load(str(output), load_external_data=False)
    names = {t.name for t in proto.graph.initializer}
    assert "model.layers.1.self_attn.q_proj.weight" in names


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("export", "no-such-model", "-o", "x.onnx"), "unknown model 'no-such-model'"),
        (("export", "yobx.no_such_module:f", "-o", "x.onnx"), "cannot import module"),
        (("export", "yobx.models:no_such_factory", "-o", "x.onnx"), "has no callable"),
        (("export", "yobx.models:ModelLoadError", "-o", "x.onnx"), "must return (model"),
        (("export", "tiny-llm", "-o", "/no/such/dir/x.onnx"), "cannot write"),
        (("export", "tiny-cnn", "--config", "c.json", "-o", "x.onnx"), "--config builds"),
        (("export", "tiny-cnn", "--weights", "w.bin", "-o", "x.onnx"), "expected a .safetensors"),
        (("trace", "no-such-model"), "unknown model"),
        (("export", "tiny-cnn", "--task", "text-generation", "-o", "x.onnx"), "a task applies"),
        (
            ("export", "hf:ViTModel", "--task", "text-generation", "-o", "x.onnx"),
            "ViTModel takes no past_key_values",
        ),
    ],
    ids=[
        "unknown",
        "no-module",
        "no-factory",
        "bad-factory",
        "unwritable",
        "config-without-weights",
        "bad-weights",
        "trace-unknown",
        "task-of-a-demo",
        "generation-without-cache",
    ],
)
def test_bad_input_exits_with_one_line(args, message, capsys, monkeypatch, tmp_path):
    # in this process (the subprocess tests cover the script): bad input is found
    # before anything is exported
    monkeypatch.chdir(tmp_path)
    status = main(list(args))
    captured = capsys.readouterr()
    assert status == 2, (captured.out, captured.err)
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("yobx: error: ")
    assert message in lines[0]
    assert "Traceback" not in captured.err
    assert not (tmp_path / "x.onnx").exists()


def test_validate_without_onnxruntime_says_what_to_install(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime fails
    status = main(["export", "tiny-cnn", "-o", str(tmp_path / "cnn.onnx"), "--validate"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err[-1] == (
        "yobx: error: --validate needs onnxruntime, a dependency of yobx: pip install onnxruntime"
    )


def test_validate_and_weights_need_no_extra():
    # pip install yobx gives a working --validate and --weights
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    names = {re.split(r"[<>=!~ ]", dependency)[0] for dependency in dependencies}
    assert {"onnxruntime", "safetensors", "onnx-ir"} <= names


def test_hf_weights_find_the_config_next_to_them(capsys, monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    from yobx.export_command import _config_next_to

    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CommandError, match="give --config path/to/config.json"):
        _config_next_to(str(tmp_path / "model.safetensors"), "hf:LlamaForCausalLM")
    (tmp_path / "config.json").write_text("{}")
    expected = str(tmp_path / "config.json")
    assert _config_next_to(str(tmp_path / "model.safetensors"), "hf:X") == expected
    assert _config_next_to(str(tmp_path), "hf:X") == expected


def test_trace_prints_graph_and_guards(yobx_command):
    result = yobx_command("trace", "tiny-llm")
    assert result.returncode == 0, result.stderr
    assert "def forward" in result.stdout
    assert "dimensions: " in result.stdout and "-> batch" in result.stdout
    assert "guards (" in result.stdout
    assert "constraints (" in result.stdout and "ranges: batch in [" in result.stdout
    # shapes in the user's dimension names, not the ShapeEnv's symbols
    assert 'input_ids: "i64[batch, seq]"' in result.stdout
    assert '"Sym(seq)"' in result.stdout


def test_bad_input_verbose_shows_traceback(yobx_command):
    result = yobx_command("export", "yobx.no_such_module:f", "-o", "x.onnx", "--verbose")
    assert result.returncode == 2
    assert "Traceback" in result.stderr


def test_factory_that_raises(yobx_command, tmp_path):
    (tmp_path / "broken_factory.py").write_text(
        "def make():\n    raise RuntimeError('weights missing')\n"
    )
    result = yobx_command("export", "broken_factory:make", "-o", "x.onnx", cwd=str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "yobx: error: factory 'broken_factory:make' failed: RuntimeError: weights missing"
    )


def test_export_unsupported_opset_names_the_range(capsys, tmp_path):
    status = main(["export", "tiny-cnn", "-o", str(tmp_path / "m.onnx"), "--opset", "17"])
    assert status == 2
    err = capsys.readouterr().err
    assert "opset 17 is not supported: to_onnx writes ONNX opsets 18 to" in err
    assert not (tmp_path / "m.onnx").exists()


def test_help_shows_the_exit_statuses(yobx_command):
    result = yobx_command("--help")
    assert result.returncode == 0, result.stderr
    assert "exit status (every command):" in result.stdout
    for line in (
        "  0    success",
        "  1    the result disagrees with eager PyTorch",
        "  2    bad input",
        "  3    the model could not be traced, exported or run",
        "  130  interrupted",
    ):
        assert line in result.stdout, result.stdout
    assert "exit status" in yobx_command("inspect", "--help").stdout


def test_exit_status_of_a_command_line_error(yobx_command):
    result = yobx_command("export", "tiny-cnn")  # no -o
    assert result.returncode == 2
    assert "required: -o/--output" in result.stderr


@pytest.mark.parametrize("command", ["export", "trace", "inspect"])
def test_exit_status_3_when_the_model_cannot_run(yobx_command, user_directory, command):
    args = ["-o", "b.onnx"] if command == "export" else []
    result = yobx_command(command, "mymodels:broken", *args, cwd=user_directory)
    assert result.returncode == 3, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("yobx: error: ") and "broken model" in lines[-1]
    assert "second line" not in result.stderr and "Traceback" not in result.stderr
    assert not (user_directory / "b.onnx").exists()


def test_constraints_are_checked_by_the_model_and_warned_about(yobx_command, user_directory):
    import numpy as np
    import onnxruntime

    narrowing = ("--narrowing", "constraints")
    result = yobx_command(
        "export", "mymodels:narrowed", "-o", "c.onnx", "--validate", *narrowing, cwd=user_directory
    )
    assert result.returncode == 0, (result.stdout, result.stderr)
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert "checked by the model: onnxruntime refuses" in warnings[0], result.stderr
    assert "seq <= 16 (range)" in warnings[1] and "mymodels.py:37]" in warnings[1]
    assert "runtime checks      1" in result.stdout
    assert "breaks `seq <= 16`: seq=17" in result.stdout
    assert "refused, naming the check" in result.stdout
    assert "1 runtime checks enforced" in result.stdout
    session = onnxruntime.InferenceSession(str(user_directory / "c.onnx"))
    with pytest.raises(Exception, match=r"seq <= 16 \(range\), needed at .*mymodels.py:37"):
        session.run(None, {"x": np.ones((2, 17), np.float32)})
    # asked for: no check, and the warning says what that means
    unchecked = yobx_command(
        "export",
        "mymodels:narrowed",
        "-o",
        "u.onnx",
        "--no-runtime-checks",
        *narrowing,
        cwd=user_directory,
    )
    assert unchecked.returncode == 0, unchecked.stderr
    assert "NOT checked by the model (--no-runtime-checks)" in unchecked.stderr
    assert "runtime checks      none" in unchecked.stdout
    session = onnxruntime.InferenceSession(str(user_directory / "u.onnx"))
    assert session.run(None, {"x": np.ones((2, 17), np.float32)})[0].shape == (2,)


def test_both_sides_of_a_branch_are_exported_and_printed(yobx_command, user_directory):
    import numpy as np
    import onnxruntime

    result = yobx_command(
        "export", "mymodels:narrowed", "-o", "v.onnx", "--validate", cwd=user_directory
    )
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "warning" not in result.stderr, result.stderr
    assert "versions            2 (an If on the inputs' sizes)" in result.stdout
    assert "version 2: seq > 16  [" in result.stdout and "mymodels.py:37]" in result.stdout
    assert "[version 2: (seq > 16)] example" in result.stdout
    session = onnxruntime.InferenceSession(str(user_directory / "v.onnx"))
    x = np.arange(2 * 40, dtype=np.float32).reshape(2, 40)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], x.sum(axis=1) * 2, rtol=1e-6)
    traced = yobx_command("trace", "mymodels:narrowed", cwd=user_directory)
    assert traced.returncode == 0, traced.stderr
    assert "versions (2, chosen from the inputs' sizes):" in traced.stdout
    assert "version 1: seq <= 16" in traced.stdout
    # --max-versions 1: one capture, the other side refused by the model's check
    one = yobx_command(
        "export", "mymodels:narrowed", "-o", "one.onnx", "--max-versions", "1", cwd=user_directory
    )
    assert one.returncode == 0, (one.stdout, one.stderr)
    assert "seq <= 16" in one.stderr and "beyond the budget of 1 version" in one.stdout
    assert "1 versions" not in one.stdout
    session = onnxruntime.InferenceSession(str(user_directory / "one.onnx"))
    with pytest.raises(Exception, match=r"seq <= 16"):
        session.run(None, {"x": x})


def test_exit_status_1_when_the_validation_fails(yobx_command, user_directory):
    result = yobx_command(
        "export", "mymodels:noisy", "-o", "n.onnx", "--validate", cwd=user_directory
    )
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.strip().splitlines()[-1] == "yobx: error: validation failed"
    assert "  FAILED: " in result.stdout
    assert (user_directory / "n.onnx").exists()  # written, and reported as disagreeing


def test_inspect_exit_statuses(yobx_command, user_directory):
    ok = yobx_command("inspect", "mymodels:declared", cwd=user_directory)
    assert ok.returncode == 0, (ok.stdout, ok.stderr)
    assert "no divergence" in ok.stdout
    diverges = yobx_command("inspect", "mymodels:noisy", cwd=user_directory)
    assert diverges.returncode == 1, (diverges.stdout, diverges.stderr)
    assert "first divergence at " in diverges.stdout
    missing = yobx_command("inspect", "mymodels:declared", "--onnx", "no.onnx", cwd=user_directory)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "yobx: error: ONNX file 'no.onnx' does not exist"
    unknown = yobx_command("inspect", "no-such-model", cwd=user_directory)
    assert unknown.returncode == 2
    assert "unknown model 'no-such-model'" in unknown.stderr


def test_text_generation_exports_the_step_with_its_cache_and_checks_generate(capsys, tmp_path):
    # a checkpoint: the model is built on the meta device, its versions (prefill,
    # decode) captured without eager runs, the weights streamed in, then generate
    # compared with model.generate (the tiny random model: test_generate.py)
    checkpoint = _saved_llama(tmp_path / "checkpoint")
    output = tmp_path / "step.onnx"
    argv = ["export", f"hf:{checkpoint}", "--task", "text-generation", "-o", str(output)]
    status = main([*argv, "--validate"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert re.search(r"past_key_values\.0\.key\s+float32\s+\[batch, 2, past, 8\]", captured.out)
    assert re.search(r"present\.0\.key\s+float32\s+\[batch, 2, past\+seq, 8\]", captured.out)
    verdicts = [line for line in captured.err.splitlines() if "generation:" in line]
    assert verdicts == [
        "yobx: generation: prompts of 1 token(s), 8 new: the same tokens as model.generate",
        "yobx: generation: prompts of 4 token(s), 8 new: the same tokens as model.generate",
    ]


def test_int4_quantization_of_a_checkpoint_generates_as_its_dequantized_weights(capsys, tmp_path):
    # the weights are streamed in, then quantized with int8 activations; the
    # validation and the generation compare the same graph at the exact level with the
    # model on the weights dequantized from the ONNX model's
    checkpoint = _saved_llama(tmp_path / "checkpoint")
    output = tmp_path / "int4.onnx"
    argv = ["export", f"hf:{checkpoint}", "-o", str(output), "--quantize", "int4"]
    status = main([*argv, "--block-size", "16", "--accuracy-level", "4", "--validate"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert re.search(r"yobx: quantize\s+\d", captured.err), captured.err
    verdicts = [line for line in captured.err.splitlines() if "generation:" in line]
    assert len(verdicts) == 2 and all("the same tokens as" in v for v in verdicts), verdicts
    import onnx

    model = onnx.load(str(output))
    described = "int4, block 16, accuracy level 4 (int8 activations)"
    assert model.metadata_props and any(
        p.key == "yobx.quantization" and p.value == described for p in model.metadata_props
    )
    # saved at the level asked for (the checks ran at level 0 and restored it)
    levels = {
        attribute.i
        for node in model.graph.node
        if node.op_type == "MatMulNBits"
        for attribute in node.attribute
        if attribute.name == "accuracy_level"
    }
    assert levels == {4}
    status = main([*argv, "--block-size", "24"])
    assert status == 2
    assert "block_size=24: use a power of two" in capsys.readouterr().err


def test_text2text_generation_exports_an_encoder_and_a_decoder_step(capsys, tmp_path):
    # a checkpoint written by save_pretrained, with weights large enough for the
    # tokens to vary: both graphs written, generation compared with model.generate
    transformers = pytest.importorskip("transformers")
    import torch

    from yobx.models.hf_seq2seq import hf_seq2seq_generation

    model = hf_seq2seq_generation("T5ForConditionalGeneration")["decoder"][0].model
    torch.manual_seed(2)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    model.save_pretrained(str(tmp_path / "t5"))
    output = tmp_path / "t5.onnx"
    argv = ["export", f"hf:{tmp_path / 't5'}", "--task", "text2text-generation", "-o"]
    status = main([*argv, str(output), "--validate"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert (tmp_path / "t5.encoder.onnx").exists() and (tmp_path / "t5.decoder.onnx").exists()
    assert re.search(
        r"past_key_values\.1\.encoder\.key\s+float32\s+\[batch, 4, cross_past, 8\]", captured.out
    )
    assert "yobx: generation: 8 new tokens: the same tokens as model.generate" in captured.err
    assert isinstance(transformers.T5Config.from_pretrained(str(tmp_path / "t5")).d_kv, int)
    refused = main(["export", "hf:LlamaForCausalLM", "--task", "text2text-generation", "-o", "x"])
    assert refused == 2
    assert "not an encoder-decoder model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("architecture", "task"),
    [
        ("GPT2LMHeadModel", "text-generation"),
        ("T5ForConditionalGeneration", "text2text-generation"),
        ("WhisperForConditionalGeneration", "text2text-generation"),
        ("BertModel", "feature-extraction"),
        ("ViTForImageClassification", "feature-extraction"),
    ],
)
def test_the_task_defaults_from_the_architecture(capsys, architecture, task):
    pytest.importorskip("transformers")
    import argparse

    from yobx.export_command import choose_task

    options = argparse.Namespace(model=f"hf:{architecture}", task=None, weights=None, config=None)
    choose_task(options)
    assert options.task == task
    said = capsys.readouterr().err
    generation = task != "feature-extraction"
    assert (f"yobx: task {task}, the default for {architecture}" in said) == generation
    asked = argparse.Namespace(model="hf:GPT2LMHeadModel", task="feature-extraction")
    choose_task(asked)
    assert asked.task == "feature-extraction"


@pytest.mark.parametrize(
    ("architecture", "task", "kind"),
    [
        ("ViTForImageClassification", "image-classification", "feature-extraction"),
        ("Wav2Vec2ForCTC", "automatic-speech-recognition", "feature-extraction"),
        ("WhisperForConditionalGeneration", "automatic-speech-recognition", "text2text-generation"),
        ("BertModel", "image-classification", None),
        ("LlamaForCausalLM", "automatic-speech-recognition", None),
    ],
)
def test_a_task_is_checked_against_the_architecture(architecture, task, kind):
    pytest.importorskip("transformers")
    import argparse

    from yobx.cli_support import CommandError
    from yobx.export_command import choose_task

    options = argparse.Namespace(model=f"hf:{architecture}", task=task, weights=None, config=None)
    if kind is None:
        with pytest.raises(CommandError, match=f"{architecture} does not do {task}"):
            choose_task(options)
    else:
        choose_task(options)
        assert options.task == kind


def test_a_default_generation_task_the_cache_cannot_serve_exports_the_outputs(capsys):
    # Qwen3-Next's cache has linear-attention layers, which take no keys and values:
    # by default, its outputs without the cache, said so; asked for, a clear refusal
    pytest.importorskip("transformers")
    import argparse

    from yobx.cli_support import CommandError
    from yobx.export_command import _load, choose_task

    options = argparse.Namespace(
        model="hf:Qwen3NextForCausalLM", task=None, weights=None, config=None
    )
    choose_task(options)
    model, args, kwargs, _ = _load(options)
    assert options.task == "feature-extraction" and "cache" not in kwargs
    assert "exporting hf:Qwen3NextForCausalLM without its cache" in capsys.readouterr().err
    asked = argparse.Namespace(
        model="hf:Qwen3NextForCausalLM", task="text-generation", weights=None, config=None
    )
    with pytest.raises(CommandError, match="LinearAttentionLayer"):
        _load(asked)


def _saved_llama(directory):
    transformers = pytest.importorskip("transformers")
    import torch

    from yobx.models.huggingface import tiny_config

    with torch.random.fork_rng():
        torch.manual_seed(5)
        model = transformers.LlamaForCausalLM(tiny_config("LlamaForCausalLM")).eval()
    model.save_pretrained(str(directory))
    return directory


def test_a_checkpoint_directory_or_a_cached_model_id_exports_with_its_weights(
    capsys, monkeypatch, tmp_path
):
    checkpoint = _saved_llama(tmp_path / "checkpoint")
    status = main(["export", f"hf:{checkpoint}", "-o", str(tmp_path / "a.onnx"), "--validate"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert f"checkpoint {checkpoint} (LlamaForCausalLM)" in captured.err
    # the same files as a model id of the local Hugging Face cache (offline)
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    snapshot = cache / "models--tiny--llama" / "snapshots" / "0123abcd"
    snapshot.parent.mkdir(parents=True)
    checkpoint.rename(snapshot)
    (cache / "models--tiny--llama" / "refs").mkdir()
    (cache / "models--tiny--llama" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    status = main(["export", "hf:tiny/llama", "-o", str(tmp_path / "b.onnx"), "--validate"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "(LlamaForCausalLM)" in captured.err
    # a model id missing from the cache: bad input, saying that nothing is downloaded
    status = main(["export", "hf:tiny/missing", "-o", str(tmp_path / "c.onnx")])
    err = capsys.readouterr().err
    assert status == 2 and "not in the local Hugging Face cache" in err, err
    assert "yobx downloads nothing" in err


def test_export_profile_is_written(capsys, tmp_path):
    profile = tmp_path / "stages.json"
    status = main(
        ["export", "tiny-cnn", "-o", str(tmp_path / "cnn.onnx"), "--profile", str(profile)]
    )
    assert status == 0, capsys.readouterr().err
    names = {event["name"] for event in json.loads(profile.read_text())["traceEvents"]}
    assert {"capture", "translate", "save"} <= names


def test_interrupt_exits_with_130(capsys, monkeypatch):
    import yobx.cli

    def interrupted(options):
        raise KeyboardInterrupt

    monkeypatch.setattr(yobx.cli, "_trace", interrupted)
    assert main(["trace", "tiny-cnn"]) == 130
    assert capsys.readouterr().err.strip() == "yobx: interrupted"


def test_factory_module_that_fails_to_import_is_bad_input(capsys, monkeypatch, tmp_path):
    (tmp_path / "bad_syntax_factory.py").write_text("def make(:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "bad_syntax_factory", raising=False)
    assert main(["trace", "bad_syntax_factory:make"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("yobx: error: cannot import module 'bad_syntax_factory': SyntaxError")
    assert "\n" not in err


STRICT_FACTORY = """
import torch


class Positions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(32, 4))

    def forward(self, x):
        return x + self.table[: x.shape[1]]


def make():
    seq = torch.export.Dim("seq")
    return Positions(), (torch.randn(2, 7, 4),), {}, {"x": {1: seq}}
"""


def test_a_yobx_error_is_printed_in_full_with_its_fix(capsys, monkeypatch, tmp_path):
    # a StrictDimensionError ends with the dynamic_shapes to paste: the CLI keeps it
    (tmp_path / "strict_factory.py").write_text(STRICT_FACTORY)
    monkeypatch.chdir(tmp_path)
    status = main(["trace", "strict_factory:make"])
    err = capsys.readouterr().err
    assert status == 3, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("yobx: error: trace failed: ")
    assert len(lines) > 2, err
    assert "seq" in lines[-1] or any("Dim" in line for line in lines[1:]), err
    assert "Traceback" not in err


def test_error_message_keeps_yobx_errors_whole_and_cuts_others():
    from yobx.cli_support import error_message
    from yobx.torch.tracing import TracingError

    ours = TracingError("the constraint is needed\ndeclare it:\n  {'x': {1: seq}}")
    assert error_message(ours, "trace failed: ") == (
        "trace failed: the constraint is needed\ndeclare it:\n  {'x': {1: seq}}"
    )
    theirs = RuntimeError("first line\n" + "torch internals\n" * 20)
    assert error_message(theirs) == ("RuntimeError: first line [...] (-v shows the whole error)")
    assert error_message(ValueError("one line")) == "ValueError: one line"


def test_help_and_version_do_not_import_torch():
    code = (
        "import sys, contextlib, io\n"
        "from yobx.cli import main\n"
        "for option in ('--help', '--version'):\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        try:\n"
        "            main([option])\n"
        "        except SystemExit as e:\n"
        "            assert e.code == 0, e.code\n"
        "    print(out.getvalue().splitlines()[0])\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("usage: yobx")
    assert re.fullmatch(r"yobx \d+\.\d+\.\d+\S*", lines[1]), lines
    assert lines[2] == "False"


def test_a_closed_pipe_ends_quietly(yobx_command, tmp_path):
    command = [*yobx_command.command, "trace", "tiny-cnn"]
    reader = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=yobx_command.env
    )
    reader.stdout.readline()
    reader.stdout.close()  # as `| head -1` does
    err = reader.stderr.read().decode()
    reader.stderr.close()
    assert reader.wait(timeout=600) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


BOUNDED_FACTORY = """
import torch


class Cumulative(torch.nn.Module):
    def forward(self, x):
        return x.cumsum(1)


def make():
    seq = torch.export.Dim("seq", max=32)
    return Cumulative(), (torch.randn(2, 7),), {}, {"x": {0: "batch", 1: seq}}
"""


def test_a_declared_maximum_is_in_the_summary_and_the_metadata(capsys, monkeypatch, tmp_path):
    (tmp_path / "bounded_factory.py").write_text(BOUNDED_FACTORY)
    monkeypatch.chdir(tmp_path)
    assert main(["export", "bounded_factory:make", "-o", "m.onnx"]) == 0
    out = capsys.readouterr().out
    assert "dynamic dimensions  batch, seq in [2, 32]" in out, out
    metadata = {p.key: p.value for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}
    assert json.loads(metadata["yobx.dimension_ranges"]) == {"batch": [2, None], "seq": [2, 32]}


def test_list_prints_every_tested_architecture_by_family(capsys):
    from yobx.models.hf_families import KNOWN_TO_EXPORT

    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--list"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for family, names in KNOWN_TO_EXPORT.items():
        line = next(line for line in out.splitlines() if line.strip().startswith(family + ":"))
        assert all(name in line for name in names), line


def test_validate_compares_on_the_input_sets_a_factory_gives(capsys, tmp_path):
    # a factory's fifth element (hf: gives its own inputs of other sizes the same way)
    argv = ["export", "unittests.models.factories:five", "-o", str(tmp_path / "f.onnx")]
    status = main([*argv, "--validate"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert re.search(r"given inputs 1\s+\S+\s+\[?5", captured.out), captured.out
