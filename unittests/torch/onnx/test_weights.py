"""Meta-device export and apply_weights: a model exported without its weights and given
them from a state dict or safetensors files computes what the model exported with its
weights computes."""

import json
import os

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from safetensors.torch import save_file

from yobx.models import TinyLLM, TinyLLMConfig, tiny_llm
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.weights import (
    WeightsMismatchError,
    WeightsNotAppliedError,
    empty_weights,
    is_pending,
    load_weights_into,
    pending_weights,
)

CONFIG = TinyLLMConfig()


def _inputs(batch=2, seq=3, past=5):
    _, _, kwargs, dynamic_shapes = tiny_llm(batch=batch, seq=seq, past=past)
    return kwargs, dynamic_shapes


def _feeds(session, kwargs):
    flat = [kwargs["input_ids"], *(t for kv in kwargs["past_key_values"] for t in kv)]
    return {i.name: t.numpy() for i, t in zip(session.get_inputs(), flat)}


def _run(path, kwargs):
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, _feeds(session, kwargs))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The tiny-llm demo exported with its weights, and its weights on disk."""
    directory = tmp_path_factory.mktemp("weights")
    model, _, kwargs, dynamic_shapes = tiny_llm()
    path = str(directory / "real.onnx")
    to_onnx(model, (), kwargs, dynamic_shapes=dynamic_shapes, filename=path)
    state = model.state_dict()
    single = str(directory / "model.safetensors")
    save_file(state, single)
    # shards with a Hugging Face index: layers in one file, everything else in another
    names = sorted(state)
    shard_names = {
        "model-00001-of-00002.safetensors": [n for n in names if n.startswith("layers.")],
        "model-00002-of-00002.safetensors": [n for n in names if not n.startswith("layers.")],
    }
    weight_map = {}
    for shard, members in shard_names.items():
        save_file({n: state[n] for n in members}, str(directory / shard))
        weight_map.update(dict.fromkeys(members, shard))
    index = directory / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return {
        "model": model,
        "path": path,
        "state": state,
        "single": single,
        "shards": [str(directory / s) for s in shard_names],
        "index": str(index),
        "directory": directory,
    }


def _meta_export(dynamic_shapes=True):
    kwargs, shapes = _inputs()
    with empty_weights():
        model = TinyLLM(CONFIG).eval()
    assert model.lm_head.weight.device.type == "meta"
    assert model.rotary.inv_freq.device.type == "cpu"  # computed in __init__
    return to_onnx(model, (), kwargs, dynamic_shapes=shapes if dynamic_shapes else None)


@pytest.mark.parametrize("kind", ["single", "shards", "index", "directory", "state"])
def test_meta_export_with_applied_weights_matches_real_export(reference, kind, tmp_path):
    result = _meta_export()
    assert result.dynamic_dimensions[:2] == ["batch", "seq"]
    source = reference[kind]
    applied = result.apply_weights(source)
    assert set(applied.applied) == set(reference["state"])
    assert applied.kept == ["rotary.inv_freq"]  # non-persistent: the model computed it
    path = str(tmp_path / "meta.onnx")
    result.save(path, external_data=True)
    assert result.files == [path, path + ".data"]
    onnx.checker.check_model(path)
    # at the example's sizes and at others: same outputs as the model exported with
    # its weights
    for batch, seq, past in [(2, 3, 5), (3, 7, 2)]:
        kwargs, _ = _inputs(batch, seq, past)
        expected = _run(reference["path"], kwargs)
        got = _run(path, kwargs)
        for e, g in zip(expected, got):
            np.testing.assert_array_equal(e, g)
        with torch.no_grad():
            eager = reference["model"](**kwargs)["logits"].numpy()
        np.testing.assert_allclose(got[0], eager, atol=1e-5, rtol=1e-5)


def test_meta_export_reads_no_weight(reference):
    result = _meta_export()
    assert result.weight_bytes > 0
    # every parameter is an initializer without data, named after the state dict
    assert set(pending_weights(result.model)) == set(reference["state"])
    # the graph is checked and described without its weights
    assert result.n_onnx_nodes > 0
    assert "logits" in result.output_names
    with pytest.raises(WeightsNotAppliedError, match="call result.apply_weights"):
        result.model_proto


def test_save_before_apply_weights_says_what_to_do(tmp_path):
    result = _meta_export()
    path = tmp_path / "x.onnx"
    with pytest.raises(WeightsNotAppliedError, match="apply_weights") as info:
        result.save(path)
    assert "21 weights have no data" in str(info.value)
    assert not path.exists()


def test_weight_initializers_keep_state_dict_names(reference):
    model, _, kwargs, dynamic_shapes = tiny_llm()
    result = to_onnx(model, (), kwargs, dynamic_shapes=dynamic_shapes)
    initializers = set(result.model.graph.initializers)
    # every parameter, even the all-ones norm weights a deduplication would merge
    assert set(model.state_dict()) <= initializers
    assert "rotary.inv_freq" in initializers


def test_fully_meta_model_needs_its_computed_buffers(reference, tmp_path):
    kwargs, shapes = _inputs()
    with torch.device("meta"):
        model = TinyLLM(CONFIG).eval()
    assert model.rotary.inv_freq.device.type == "meta"
    result = to_onnx(model, (), kwargs, dynamic_shapes=shapes)
    assert "rotary.inv_freq" in result.weight_names.names
    inv_freq = result.model.graph.initializers["rotary.inv_freq"].const_value
    assert is_pending(inv_freq), inv_freq
    with pytest.raises(WeightsMismatchError, match="non-persistent buffers") as info:
        result.apply_weights(reference["single"])
    assert "'rotary.inv_freq'" in str(info.value)
    assert "empty_weights()" in str(info.value)
    # taken from the source when it has them
    state = dict(reference["state"])
    state["rotary.inv_freq"] = reference["model"].rotary.inv_freq
    applied = result.apply_weights(state)
    assert applied.applied["rotary.inv_freq"] == "rotary.inv_freq"
    path = str(tmp_path / "full_meta.onnx")
    result.save(path)
    for e, g in zip(_run(reference["path"], kwargs), _run(path, kwargs)):
        np.testing.assert_array_equal(e, g)


def test_missing_and_unexpected_names_are_listed(reference):
    result = _meta_export()
    state = dict(reference["state"])
    del state["norm.weight"]
    del state["layers.1.mlp.up_proj.weight"]
    state["layers.9.extra.weight"] = torch.zeros(3)
    with pytest.raises(WeightsMismatchError) as info:
        result.apply_weights(state)
    message = str(info.value)
    assert "missing from the source: 'layers.1.mlp.up_proj.weight', 'norm.weight'" in message
    assert "not parameters or buffers of the model: 'layers.9.extra.weight'" in message
    # nothing was applied: saving still refuses
    with pytest.raises(WeightsNotAppliedError):
        result.save("never_written.onnx")


def test_unexpected_names_ignored_when_not_strict(reference, tmp_path):
    result = _meta_export()
    state = dict(reference["state"])
    state["optimizer.step"] = torch.zeros(1)
    applied = result.apply_weights(state, strict=False)
    assert applied.ignored == ["optimizer.step"]
    result.save(tmp_path / "m.onnx")


_MODEL_SIDE = r"'lm_head.weight' is torch.float32 \[128, 32\] in the model, "


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t[:, :-1].contiguous(), _MODEL_SIDE + r"torch.float32 \[128, 31\]"),
        (lambda t: t.to(torch.float16), _MODEL_SIDE + r"torch.float16 \[128, 32\]"),
    ],
    ids=["shape", "dtype"],
)
def test_shape_and_dtype_mismatches_are_errors(reference, change, message, tmp_path):
    result = _meta_export()
    state = dict(reference["state"])
    state["lm_head.weight"] = change(state["lm_head.weight"])
    path = str(tmp_path / "bad.safetensors")
    save_file(state, path)
    with pytest.raises(WeightsMismatchError, match=message) as info:
        result.apply_weights(path)
    assert path in str(info.value)


def test_apply_weights_on_real_export_replaces_them(reference, tmp_path):
    # a model exported with other (random) weights gets the reference's
    with torch.random.fork_rng():
        torch.manual_seed(5)
        model = TinyLLM(CONFIG).eval()
    kwargs, shapes = _inputs()
    result = to_onnx(model, (), kwargs, dynamic_shapes=shapes)
    result.apply_weights(reference["index"])
    path = str(tmp_path / "replaced.onnx")
    result.save(path)
    assert result.files == [path]  # small: one file
    for e, g in zip(_run(reference["path"], kwargs), _run(path, kwargs)):
        np.testing.assert_array_equal(e, g)


class TiedModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.head = torch.nn.Linear(8, 20, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids))


def test_tied_weights_found_under_any_name(tmp_path):
    torch.manual_seed(0)
    model = TiedModel().eval()
    ids = torch.randint(0, 20, (2, 4))
    expected = model(ids).detach().numpy()
    # a checkpoint keeping only the head's name
    path = str(tmp_path / "tied.safetensors")
    save_file({"head.weight": model.head.weight.detach().clone()}, path)
    with empty_weights():
        meta = TiedModel().eval()
    result = to_onnx(meta, (ids,), dynamic_shapes={"ids": {0: "batch", 1: "seq"}})
    assert len(result.model.graph.initializers) == 1
    applied = result.apply_weights(path)
    assert list(applied.applied.values()) == ["head.weight"]
    onnx_path = str(tmp_path / "tied.onnx")
    result.save(onnx_path)
    session = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"ids": ids.numpy()})[0], expected, atol=1e-6)
    # the eager model built without weights gets them too, tied
    load_weights_into(meta, path)
    assert meta.embed.weight is meta.head.weight
    np.testing.assert_allclose(meta(ids).detach().numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("external_data", [None, False, True])
def test_save_small_model_external_data_choice(tmp_path, external_data):
    model, _, kwargs, dynamic_shapes = tiny_llm()
    result = to_onnx(model, (), kwargs, dynamic_shapes=dynamic_shapes)
    path = str(tmp_path / "m.onnx")
    result.save(path, external_data=external_data)
    outside = os.path.exists(path + ".data")
    assert outside == bool(external_data)
    onnx.checker.check_model(path)
    kwargs2, _ = _inputs(3, 4, 6)
    with torch.no_grad():
        expected = model(**kwargs2)["logits"].numpy()
    np.testing.assert_allclose(_run(path, kwargs2)[0], expected, atol=1e-5)


def test_validate_refuses_meta_model_with_a_way_out():
    kwargs, shapes = _inputs()
    with empty_weights():
        model = TinyLLM(CONFIG).eval()
    with pytest.raises(Exception, match="meta device") as info:
        to_onnx(model, (), kwargs, dynamic_shapes=shapes, validate=True)
    assert "apply_weights" in str(info.value)


def test_validate_after_apply_weights_and_save(reference, tmp_path):
    kwargs, shapes = _inputs()
    with empty_weights():
        model = TinyLLM(CONFIG).eval()
    result = to_onnx(model, (), kwargs, dynamic_shapes=shapes)
    result.apply_weights(reference["single"])
    result.save(tmp_path / "m.onnx")
    load_weights_into(model, reference["single"])
    report = result.validate(model, (), kwargs)
    assert report.ok, report.format()
    assert report.n_checked >= 3
    assert [s.name for s in result.stages][-3:] == ["weights", "save", "validate"]


def test_bad_sources_are_clear(tmp_path):
    result = _meta_export()
    with pytest.raises(ValueError, match="does not exist"):
        result.apply_weights(str(tmp_path / "none.safetensors"))
    with pytest.raises(ValueError, match="expected a .safetensors file"):
        result.apply_weights(str(tmp_path / "weights.bin"))
    bad_index = tmp_path / "model.safetensors.index.json"
    bad_index.write_text("{}")
    with pytest.raises(ValueError, match="has no 'weight_map'"):
        result.apply_weights(str(bad_index))
