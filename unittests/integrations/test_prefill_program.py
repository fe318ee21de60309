"""The prefill component made from the decode step's graph, its cache empty
(yobx.integrations.prefill_program): the runner's inputs and outputs, the choices on
``past == 0`` folded, the same logits as eager at other sizes and the same greedy
tokens as ``model.generate``; exported on its own when the decode step does not cover
an empty cache."""

from __future__ import annotations

import onnx_ir as ir
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.exporters")

from yobx.integrations.prefill_program import prefill_from_decode  # noqa: E402
from yobx.integrations.transformers import (  # noqa: E402
    YobxExportConfig,
    YobxExporter,
    greedy_generate,
)
from yobx.models.huggingface import tiny_config  # noqa: E402
from yobx.torch.onnx.generate import mask_positions  # noqa: E402


def _model(architecture: str):
    config = tiny_config(architecture)
    config.use_cache = True
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return getattr(transformers, architecture)(config).eval()


def _prompt(vocab: int, batch: int, seq: int):
    generator = torch.Generator().manual_seed(batch * 10 + seq)
    ids = torch.randint(3, vocab, (batch, seq), generator=generator)
    mask = torch.ones((batch, seq), dtype=torch.int64)
    if batch > 1:
        mask[0, :2] = 0  # left padding, as generate pads
    return ids, mask


def _derived(program: ir.Model) -> bool:
    return any(
        node.name == "" and node.op_type == "ConstantOfShape" for node in program.graph
    ) or any(
        value.name.startswith("prefill_empty") for node in program.graph for value in node.outputs
    )


def _branch_nodes(program: ir.Model) -> int:
    """The nodes inside the branches of the ``If`` nodes of ``program``."""
    return sum(
        len(attribute.value)
        for node in ir.traversal.RecursiveGraphIterator(program.graph)
        if node.op_type == "If"
        for attribute in node.attributes.values()
    )


@pytest.mark.parametrize("architecture", ["GPT2LMHeadModel", "LlamaForCausalLM"])
def test_the_prefill_is_the_decode_step_on_an_empty_cache(architecture):
    model = _model(architecture)
    vocab = model.config.vocab_size
    ids, mask = _prompt(vocab, 2, 5)
    exported = YobxExporter().export_for_generation(
        model, {"input_ids": ids, "attention_mask": mask}, YobxExportConfig()
    )
    prefill = exported.components["prefill"].program
    decode = exported.components["decode"].program
    assert _derived(prefill)
    assert [v.name for v in prefill.graph.inputs] == [
        v.name for v in decode.graph.inputs if not v.name.startswith("cache.")
    ]
    assert [v.name for v in prefill.graph.outputs] == [v.name for v in decode.graph.outputs]
    # past = 0 in the dimensions, and the choices on it folded
    assert str(prefill.graph.inputs[1].shape[1]) == "seq"
    assert str(prefill.graph.outputs[1].shape[2]) == "seq"
    # (the checks and version choices reading past fold away)
    assert _branch_nodes(prefill) < _branch_nodes(decode)
    for batch, seq in [(3, 7), (1, 3), (1, 1)]:
        ids, mask = _prompt(vocab, batch, seq)
        positions = torch.from_numpy(mask_positions(mask.numpy()))
        inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        got = exported.runners["prefill"](**inputs)
        with torch.no_grad():
            expected = model(**inputs)
        torch.testing.assert_close(got.logits, expected.logits, atol=1e-4, rtol=1e-4)
    ids, mask = _prompt(vocab, 2, 6)
    with torch.no_grad():
        expected = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False
        )
    tokens = greedy_generate(exported, ids, mask, max_new_tokens=8)
    assert torch.equal(tokens, expected)


def test_a_decode_step_without_an_empty_cache_gets_a_prefill_of_its_own():
    # narrowed to the example's side, the decode step refuses past = 0
    model = _model("LlamaForCausalLM")
    ids, mask = _prompt(model.config.vocab_size, 2, 5)
    exported = YobxExporter().export_for_generation(
        model,
        {"input_ids": ids, "attention_mask": mask},
        YobxExportConfig(narrowing="constraints"),
    )
    assert not _derived(exported.components["prefill"].program)
    tokens = greedy_generate(exported, ids, mask, max_new_tokens=4)
    with torch.no_grad():
        expected = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False
        )
    assert torch.equal(tokens, expected)


def test_a_graph_without_a_cache_over_past_makes_no_prefill():
    inputs = [
        ir.Value(
            name="input_ids",
            shape=ir.Shape(["batch", "seq"]),
            type=ir.TensorType(ir.DataType.INT64),
        ),
        ir.Value(name="extra", shape=ir.Shape(["batch", 3]), type=ir.TensorType(ir.DataType.FLOAT)),
    ]
    node = ir.node("Identity", [inputs[0]])
    graph = ir.Graph(inputs, [node.outputs[0]], nodes=[node], opset_imports={"": 18})
    model = ir.Model(graph, ir_version=10)
    # an input the prefill does not take is no cache of (batch, heads, past, head)
    assert prefill_from_decode(model, ["input_ids"]) is None
    # an input the prefill takes that the step does not
    assert prefill_from_decode(model, ["input_ids", "extra", "position_ids"]) is None
