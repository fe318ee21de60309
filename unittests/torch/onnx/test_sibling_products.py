"""4-bit products of the same input computed as one
(:mod:`yobx.torch.onnx.sibling_products`): the same outputs, the same dequantized
weights, fewer ``MatMulNBits`` nodes."""

from __future__ import annotations

import copy

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from unittests.torch.onnx._helpers import run_ir_model
from yobx.torch.onnx.quantize import dequantized_weights, quantized_products
from yobx.torch.onnx.sibling_products import fuse_sibling_products

_COLUMNS = {"q": 32, "k": 16, "v": 48, "other": 32}


def _quantized(accuracy_levels: dict[str, int] | None = None) -> ir.Model:
    """``x`` times the weights ``q``, ``k`` and ``v`` ``[64, N]``, ``y`` times
    ``other``, quantized by onnxruntime's quantizer (4 bits, blocks of 32)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    generator = np.random.default_rng(0)
    nodes, initializers, outputs = [], [], []
    for name, columns in _COLUMNS.items():
        weight = generator.standard_normal((64, columns)).astype(np.float32)
        initializers.append(numpy_helper.from_array(weight, name))
        source = "y" if name == "other" else "x"
        nodes.append(helper.make_node("MatMul", [source, name], [f"{name}_out"]))
        outputs.append(helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None))
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 64]) for n in "xy"]
    graph = helper.make_graph(nodes, "products", inputs, outputs, initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    quantizer = MatMulNBitsQuantizer(proto, bits=4, block_size=32, is_symmetric=True)
    quantizer.process()
    model = ir.serde.deserialize_model(quantizer.model.model)
    for node in model.graph:
        name = node.inputs[1].name.removesuffix("_Q4")
        if accuracy_levels and name in accuracy_levels:
            node.attributes["accuracy_level"] = ir.AttrInt64(
                "accuracy_level", accuracy_levels[name]
            )
    return model


def _ops(model: ir.Model) -> list[str]:
    return [node.op_type for node in model.graph]


@pytest.mark.parametrize("batch", [1, 3])
def test_products_of_one_input_become_one_and_compute_the_same(batch):
    model = _quantized()
    original = copy.deepcopy(model)
    assert fuse_sibling_products(model) == 2
    assert _ops(model).count("MatMulNBits") == 2 and _ops(model).count("Split") == 1
    # each weight keeps its own name in the file: the checkpoint's names still apply
    assert {v.name for v in model.graph.initializers.values()} >= {
        f"{name}_Q4" for name in _COLUMNS
    }
    assert quantized_products(model) == quantized_products(original) == 4
    generator = np.random.default_rng(batch)
    feeds = {n: generator.standard_normal((batch, 64)).astype(np.float32) for n in "xy"}
    for got, expected in zip(run_ir_model(model, feeds), run_ir_model(original, feeds)):
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    fused, unfused = dequantized_weights(model), dequantized_weights(original)
    assert sorted(fused) == sorted(unfused) == sorted(_COLUMNS)
    for name, weight in unfused.items():
        assert weight.shape == (_COLUMNS[name], 64)
        np.testing.assert_array_equal(fused[name].numpy(), weight.numpy())


def test_products_computing_at_other_levels_stay_apart():
    # v at accuracy level 4 (int8 activations): only q and k are one product
    model = _quantized({"v": 4})
    assert fuse_sibling_products(model) == 1
    assert _ops(model).count("MatMulNBits") == 3
