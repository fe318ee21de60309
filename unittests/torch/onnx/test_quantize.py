"""to_onnx(quantize="int4"): every weight MatMul becomes onnxruntime's MatMulNBits, and
the validation compares with the eager model on the dequantized weights."""

import warnings

import numpy as np
import onnx_ir as ir
import onnxruntime
import pytest
import torch

from unittests.torch.onnx._helpers import NestedVersions
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.errors import OnnxExportError
from yobx.torch.onnx.quantize import (
    QUANTIZATION_KEY,
    dequantized_weights,
    exact_products,
    quantize_model,
    quantized_products,
    quantized_weights,
    weights_swapped,
)
from yobx.torch.onnx.weights import empty_weights

transformers = pytest.importorskip("transformers")


def _llama(seed: int = 0):
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=50,
        use_cache=False,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


SHAPES = {"input_ids": {0: "batch", 1: "seq"}}


def _ids(batch: int, seq: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(batch * 10 + seq)
    return torch.randint(0, 50, (batch, seq), generator=generator)


def _weight_linears(model: torch.nn.Module) -> set[str]:
    return {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }


def _ops(model: ir.Model, op_type: str) -> list[ir.Node]:
    return [n for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.op_type == op_type]


def _logits(model: ir.Model, ids: torch.Tensor) -> np.ndarray:
    proto = ir.serde.serialize_model(model)
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"input_ids": ids.numpy()})[0]


def test_every_linear_weight_is_quantized_and_validated_on_its_dequantized_values():
    model = _llama()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = to_onnx(model, (), {"input_ids": _ids(2, 7)}, dynamic_shapes=SHAPES, quantize="int4")
    assert result.model.metadata_props[QUANTIZATION_KEY] == "int4, block 32"
    # every weight of a linear layer, whatever version of the graph reads it
    quantized = {name.removesuffix("_Q4") for name in quantized_weights(result.model)}
    assert quantized == _weight_linears(model)
    # per layer: the queries', keys' and values' products as one, the output's, gate
    # and up as one, down's; then the head's
    assert len(_ops(result.model, "MatMulNBits")) == 2 * 4 + 1
    assert not [
        n for n in _ops(result.model, "MatMul") if any(i.is_initializer() for i in n.inputs)
    ]
    report = result.validate(model, (), {"input_ids": _ids(2, 7)})
    assert report.ok, report.format()
    assert report.max_abs_error < 1e-4, report.format()
    assert any("dequantized" in note for note in report.notes)
    # the user's model is left as it was
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name]), name
    # what the comparison with the dequantized weights is worth: the float weights
    # give other values (the quantization error), the dequantized ones the same
    ids = _ids(3, 5)
    got = _logits(result.model, ids)
    with torch.no_grad():
        floating = model(input_ids=ids).logits.numpy()
        with weights_swapped(model, dequantized_weights(result.model)):
            dequantized = model(input_ids=ids).logits.numpy()
    assert np.abs(got - floating).max() > 1e-3
    np.testing.assert_allclose(got, dequantized, atol=1e-5, rtol=1e-4)


def test_int8_activations_are_set_and_the_graph_is_checked_at_the_exact_level(tmp_path):
    model = _llama(4)
    kwargs = {"input_ids": _ids(2, 7)}
    result = to_onnx(
        model, (), kwargs, dynamic_shapes=SHAPES, quantize="int4", quantize_accuracy_level=4
    )
    assert result.model.metadata_props[QUANTIZATION_KEY] == (
        "int4, block 32, accuracy level 4 (int8 activations)"
    )
    nodes = _ops(result.model, "MatMulNBits")
    assert nodes and {n.attributes["accuracy_level"].value for n in nodes} == {4}
    # the graph checked exactly at level 0, and left at level 4 after the check
    report = result.validate(model, (), kwargs)
    assert report.ok, report.format()
    assert report.max_abs_error < 1e-4, report.format()
    assert any("accuracy level 0" in note for note in report.notes), report.notes
    assert {n.attributes["accuracy_level"].value for n in nodes} == {4}
    levels = [
        a.i
        for n in result.model_proto.graph.node
        for a in n.attribute
        if a.name == "accuracy_level"
    ]
    assert levels and set(levels) == {4}
    # saved with its weights outside: onnxruntime loads a copy at level 0 beside the
    # file, removed after the check
    result.save(tmp_path / "int4.onnx", external_data=True)
    assert len(result.files) == 2
    report = result.validate(model, (), kwargs)
    assert report.ok and report.max_abs_error < 1e-4, report.format()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["int4.onnx", "int4.onnx.data"]
    # at level 4 the activations are quantized: close to level 0, not equal
    with exact_products(result.model) as changed:
        assert changed == len(nodes)
        exact = _logits(result.model, _ids(3, 5))
    fast = _logits(result.model, _ids(3, 5))
    assert 0 < np.abs(fast - exact).max() < 0.1 * np.abs(exact).max()


def test_an_unknown_accuracy_level_is_refused():
    with pytest.raises(ValueError, match="accuracy_level=5: use one of"):
        to_onnx(
            torch.nn.Linear(4, 4), (torch.randn(2, 4),), quantize="int4", quantize_accuracy_level=5
        )


def test_dequantized_weights_are_within_half_a_step_of_the_weights():
    model = _llama(1)
    result = to_onnx(model, (), {"input_ids": _ids(2, 4)}, quantize="int4", quantize_block_size=16)
    weights = dequantized_weights(result.model)
    assert set(weights) == _weight_linears(model)
    for name, parameter in model.named_parameters():
        if name not in weights:
            continue
        original = parameter.detach()
        blocks = original.reshape(original.shape[0], -1, 16)
        # symmetric: the block's largest magnitude is 8 steps (levels -8 to 7), values
        # rounded to the nearest level, half a step away at most, but for a weight of
        # the opposite sign as large, clamped to 7 steps
        step = blocks.abs().amax(-1, keepdim=True) / 8
        error = (weights[name].reshape(blocks.shape) - blocks).abs()
        assert (error <= step + 1e-6).all(), name
        assert (error <= step / 2 + 1e-6).float().mean() > 0.99, name
        levels = [torch.unique(block).numel() for block in weights[name].reshape(-1, 16)]
        assert max(levels) <= 16


def test_a_meta_export_quantizes_once_its_weights_are_applied():
    real = _llama(2)
    with empty_weights():
        meta = _llama(2)
    result = to_onnx(meta, (), {"input_ids": _ids(2, 6)}, dynamic_shapes=SHAPES)
    with pytest.raises(OnnxExportError, match=r"apply_weights\(\.\.\.\) first"):
        result.quantize()
    with pytest.raises(OnnxExportError, match="exported on the meta device"):
        to_onnx(meta, (), {"input_ids": _ids(2, 6)}, quantize="int4")
    result.apply_weights(real.state_dict())
    assert result.quantize() == quantized_products(result.model) > 0
    report = result.validate(real, (), {"input_ids": _ids(2, 6)})
    assert report.ok, report.format()
    with pytest.raises(OnnxExportError, match="quantized already"):
        quantize_model(result.model)
    with pytest.raises(OnnxExportError, match="apply the weights before quantizing"):
        result.apply_weights(real.state_dict())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quantize": "int8"}, "quantize='int8'"),
        ({"quantize": "int4", "quantize_block_size": 24}, "block_size=24"),
        ({"quantize": "int4", "quantize_block_size": 8}, "block_size=8"),
    ],
)
def test_bad_quantization_options_say_what_is_accepted(options, message):
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match=message):
        to_onnx(model, (torch.randn(2, 4),), **options)


def test_weights_quantized_in_nested_versions_are_warned_about():
    # onnxruntime prepacks the 4-bit weights of a subgraph's node only when they are
    # initializers of the graph just above: versions nested in versions run slowly
    torch.manual_seed(0)
    model = NestedVersions().eval()
    x = torch.randn(2, 3, 32)
    shapes = ({0: "b", 1: "s"},)
    with pytest.warns(UserWarning, match="2 of the 4 quantized .* nested two levels deep"):
        result = to_onnx(model, (x,), dynamic_shapes=shapes, quantize="int4")
    assert len(result.versions) == 4
    assert len(_ops(result.model, "MatMulNBits")) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        single = to_onnx(
            model, (x,), dynamic_shapes=shapes, quantize="int4", narrowing="constraints"
        )
    assert not single.versions
    assert len(_ops(single.model, "MatMulNBits")) == 1


def test_a_decoder_choosing_between_versions_quantizes_without_warning():
    # the versions' branches are merged: every weight is multiplied in the main graph
    model = _llama(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = to_onnx(
            model, (), {"input_ids": _ids(2, 7)}, dynamic_shapes=SHAPES, quantize="int4"
        )
    assert len(result.versions) > 2
    assert len(quantized_weights(result.model)) == len(_weight_linears(model))
