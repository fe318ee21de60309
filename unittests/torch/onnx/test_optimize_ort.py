"""``to_onnx(optimize=...)``: the default optimizer and onnxscript's fusions for
onnxruntime (``optimize="ort"``)."""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir as ir
import onnxruntime
import pytest
import torch

from unittests.torch.onnx._helpers import export_and_validate
from yobx.models import load_model
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.optimize import OPTIMIZE_LEVELS


def _domains(result) -> collections.Counter:
    return collections.Counter(node.domain or "ai.onnx" for node in result.model.graph)


def _llama_inputs(batch: int, seq: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + seq)
    return {
        "input_ids": torch.randint(0, 99, (batch, seq), generator=generator),
        "attention_mask": torch.ones((batch, seq), dtype=torch.int64),
    }


def _run(result, inputs: dict[str, torch.Tensor]) -> np.ndarray:
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    feeds = {name: value.numpy() for name, value in inputs.items()}
    return session.run(None, feeds)[0]


def test_ort_fuses_a_llama_and_matches_eager():
    model, args, kwargs, dynamic_shapes = load_model("hf:LlamaForCausalLM")
    result = export_and_validate(model, args, kwargs, dynamic_shapes, optimize="ort")
    fusions = next(s for s in result.stages if s.name == "fuse").args["fusions"]
    assert fusions.get("rms_normalization", 0) >= 1, fusions
    assert "com.microsoft" in _domains(result), _domains(result)
    # the weights keep their state-dict names: a checkpoint can still be applied
    assert "model.layers.0.mlp.up_proj.weight" in result.model.graph.initializers
    # two more sizes of the dynamic dimensions, against eager
    for batch, seq in ((1, 3), (3, 17)):
        inputs = _llama_inputs(batch, seq)
        with torch.no_grad():
            expected = model(**inputs).logits.numpy()
        np.testing.assert_allclose(_run(result, inputs), expected, atol=1e-4, rtol=1e-4)


def test_default_has_no_contrib_operator_and_same_outputs_as_ort():
    model, args, kwargs, dynamic_shapes = load_model("hf:LlamaForCausalLM")
    default = to_onnx(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    fused = to_onnx(model, args, kwargs, dynamic_shapes=dynamic_shapes, optimize="ort")
    assert "com.microsoft" not in _domains(default)
    assert len(fused.model.graph) < len(default.model.graph)
    inputs = _llama_inputs(2, 9)
    np.testing.assert_allclose(_run(fused, inputs), _run(default, inputs), atol=1e-4, rtol=1e-4)


def test_ort_without_a_matching_pattern_still_matches_eager():
    model, args, kwargs, dynamic_shapes = load_model("tiny-cnn")
    export_and_validate(model, args, kwargs, dynamic_shapes, optimize="ort")


@pytest.mark.parametrize("bad", ["ORT", "fast", True, None, 1])
def test_bad_optimize_value_lists_the_accepted_ones(bad):
    model, args, kwargs, dynamic_shapes = load_model("tiny-cnn")
    with pytest.raises(ValueError) as info:
        to_onnx(model, args, kwargs, dynamic_shapes=dynamic_shapes, optimize=bad)
    for level in OPTIMIZE_LEVELS:
        assert repr(level) in str(info.value)
    assert repr(bad) in str(info.value)


def test_ort_fuses_after_an_opset_conversion():
    model, args, kwargs, dynamic_shapes = load_model("hf:LlamaForCausalLM")
    result = export_and_validate(model, args, kwargs, dynamic_shapes, optimize="ort", opset=21)
    assert result.model.opset_imports[""] == 21
    assert "com.microsoft" in _domains(result), _domains(result)


@pytest.mark.parametrize("name", ["hf:GPT2LMHeadModel", "hf:BertModel"])
def test_ort_fusions_of_models_with_gemms_load_and_match_eager(name):
    # onnxscript's fusions drop the Reshape before GPT2's Gemm (a 3-d Gemm input
    # onnxruntime refuses to load): the Gemms become MatMul + Add first
    model, args, kwargs, dynamic_shapes = load_model(name)
    result = export_and_validate(model, args, kwargs, dynamic_shapes, optimize="ort", min_cases=2)
    fuse = next(stage for stage in result.stages if stage.name == "fuse")
    optimize = next(stage for stage in result.stages if stage.name == "optimize")
    # a Gemm of a weight read transposed (BERT's pooler) became MatMul + Add with the
    # weight stored [in, out] before the fusions (weight_layout), the others in them
    converted = fuse.args["fusions"].get("gemm_to_matmul_add", 0)
    assert converted + optimize.args["weights_transposed"] > 0, (fuse.args, optimize.args)
    assert not any(
        node.op_type == "Gemm" for node in ir.traversal.RecursiveGraphIterator(result.model.graph)
    )
    # onnxruntime's SkipLayerNormalization is several times slower on the CPU than
    # Add + LayerNormalization: none is left
    assert all(node.op_type != "SkipLayerNormalization" for node in result.model.graph)


def _skip_layer_norm_model(with_bias: bool, outputs: list[str]):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    hidden = 16
    initializers = [
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), name)
        for name in ("gamma", "beta", "bias")
    ]
    inputs = ["x", "skip", "gamma", "beta"] + (["bias"] if with_bias else [])
    node = helper.make_node(
        "SkipLayerNormalization", inputs, outputs, domain="com.microsoft", epsilon=1e-5
    )
    shape = ["batch", 5, hidden]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "skip")],
        [
            helper.make_tensor_value_info(
                n, TensorProto.FLOAT, shape if n in ("y", "sum") else ["batch", 5, 1]
            )
            for n in outputs
            if n
        ],
        initializers if with_bias else initializers[:2],
    )
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    proto.ir_version = 10
    onnx.checker.check_model(proto)
    return proto


@pytest.mark.parametrize(
    "with_bias, outputs, split",
    [
        (True, ["y"], True),
        (False, ["y"], True),
        (True, ["y", "", "", "sum"], True),  # the sum of the residual is read
        (True, ["y", "mean", "", ""], False),  # the mean has no Add + LayerNorm form
    ],
)
def test_skip_layer_normalization_is_split_with_the_same_outputs(with_bias, outputs, split):
    import onnx_ir as ir

    from yobx.torch.onnx.optimize import _split_skip_layer_normalizations

    proto = _skip_layer_norm_model(with_bias, outputs)
    model = ir.serde.deserialize_model(proto)
    assert _split_skip_layer_normalizations(model) == int(split)
    ops = [node.op_type for node in model.graph]
    assert ("SkipLayerNormalization" in ops) != split, ops
    rng = np.random.default_rng(1)
    for batch in (1, 3):
        feeds = {n: rng.standard_normal((batch, 5, 16)).astype(np.float32) for n in ("x", "skip")}
        sessions = [
            onnxruntime.InferenceSession(p.SerializeToString(), providers=["CPUExecutionProvider"])
            for p in (proto, ir.serde.serialize_model(model))
        ]
        before, after = (s.run(None, feeds) for s in sessions)
        assert len(before) == len(after)
        for b, a in zip(before, after):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_ort_fusions_apply_inside_the_versions_of_a_decode_step():
    # the fused rotary embedding of a branch choosing between versions imported the
    # default domain at version 1 (a subgraph has no opsets of its own): the inliner
    # refused it and the model fell back to the example's side, refusing prefill
    transformers = pytest.importorskip("transformers")
    from yobx.torch.tracing.inputs import cache_dynamic_shapes

    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=100,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    cache = transformers.DynamicCache(config=config)
    for layer in range(2):
        cache.update(torch.randn(2, 1, 3, 32), torch.randn(2, 1, 3, 32), layer)
    kwargs = {
        "input_ids": torch.randint(0, 100, (2, 2)),
        "attention_mask": torch.ones(2, 5, dtype=torch.int64),
        "cache": cache,
    }
    shapes = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "cache": cache_dynamic_shapes(cache, {0: "batch", 2: "past"}),
    }
    result = export_and_validate(model, (), kwargs, shapes, optimize="ort")
    assert not result.version_fallback, result.version_fallback
    assert len(result.versions) > 1
    fused = [
        node.op_type
        for node in ir.traversal.RecursiveGraphIterator(result.model.graph)
        if node.domain == "com.microsoft"
    ]
    # the fusions run inside the versions (the rotary embeddings matched there; with
    # no attention fusion to consume them they are inlined back), and attention is not
    # fused in a step with a cache: slower in onnxruntime (yobx.torch.onnx.ort_fusions)
    fusions = next(s for s in result.stages if s.name == "fuse").args["fusions"]
    assert fusions.get("rotary_embedding", 0) > 0, fusions
    assert "sdpa" not in fusions and "sdpa_via_mha" not in fusions, fusions
    # the norms read their weights from the main graph: they are fused inside the
    # versions too (outer_values_aliased), and the aliases are gone afterwards
    assert fusions.get("rms_normalization", 0) > 0, fusions
    assert fusions.get("skip_rms_normalization", 0) > 0, fusions
    assert "SkipSimplifiedLayerNormalization" in fused, sorted(set(fused))
    everywhere = list(ir.traversal.RecursiveGraphIterator(result.model.graph))
    assert not [n for n in everywhere if (n.name or "").startswith("yobx_outer_alias")]
    assert "MultiHeadAttention" not in fused, sorted(set(fused))
    # the fusions ran before the versions were merged: their Transpose + MatMul of
    # each weight became a FusedMatMul; plain MatMul nodes read the weights [in, out]
    # again once merged, as quantizers expect them
    initializers = set(result.model.graph.initializers.values())
    readers = collections.Counter(
        node.op_type
        for node in ir.traversal.RecursiveGraphIterator(result.model.graph)
        if len(node.inputs) > 1 and node.inputs[1] in initializers
    )
    assert readers["MatMul"] >= 14 and not readers["FusedMatMul"], readers
    # prefill (an empty cache) and decode (one token) are among the cases compared
    whens = {case.description.split("]")[0] for case in result.validation.cases}
    assert any("past < 1" in when for when in whens), whens


def test_an_encoder_keeps_its_attention_fusions():
    """Only a step with a key-value cache goes without attention fusions: a BERT
    encoder's attention still becomes onnxruntime's, with the same outputs."""
    model, args, kwargs, dynamic_shapes = load_model("hf:BertModel")
    result = export_and_validate(model, args, kwargs, dynamic_shapes, optimize="ort")
    fused = {node.op_type for node in result.model.graph if node.domain == "com.microsoft"}
    assert fused & {"MultiHeadAttention", "Attention"}, sorted(fused)


def test_a_step_with_a_cache_is_recognised_by_its_names():
    from yobx.torch.onnx.ort_fusions import takes_a_cache

    def model(inputs, outputs):
        float_ = ir.TensorType(ir.DataType.FLOAT)
        graph = ir.Graph(
            [ir.Value(name=n, type=float_) for n in inputs],
            [ir.Value(name=n, type=float_) for n in outputs],
            nodes=[],
        )
        return ir.Model(graph, ir_version=10)

    assert takes_a_cache(model(["input_ids", "past_key_values.0.key"], ["logits"]))
    assert takes_a_cache(model(["x"], ["logits", "present.0.key"]))
    assert takes_a_cache(model(["x"], ["present_1.0.decoder.value"]))
    assert not takes_a_cache(model(["input_ids", "attention_mask"], ["last_hidden_state"]))
    assert not takes_a_cache(model(["x"], ["presentation"]))
