"""Real architectures beyond decoder LLMs, traced with string dimension names.

Each case (tiny configuration, random weights, :mod:`yobx.models.architectures`) is
traced with its dynamic dimensions named, and the graph is compared with eager on the
example and on two other sizes. Sizes where the graph relies on a fact of the example
that does not hold (``stress_sizes``) must be refused by the graph's runtime checks or
computed right: never computed wrong.
"""

import copy

import pytest
import torch

from yobx.torch.tracing import ConstraintViolationError, CustomTracer
from yobx.torch.tracing.inputs import bind_arguments

from ._helpers import assert_same

pytest.importorskip("transformers")

CASES = [
    "vit",
    "deit",
    "swin",
    "segformer",
    "wav2vec2",
    "clip",
    "distilbert",
    "llama_decode",
    "qwen2_decode",
    "t5",
    "mamba",
    "mixtral",
    "unet_block_branches",
    "unet_block_computed_pads",
]


def _build(name):
    if name.startswith("unet") or name == "autoencoder_kl":
        pytest.importorskip("diffusers")
    from yobx.models.architectures import build

    return build(name)


def _run(model, args, kwargs):
    # a decode step appends to its cache: every run gets its own copy of the inputs
    args, kwargs = copy.deepcopy((args, kwargs))
    with torch.no_grad():
        return model(*args, **kwargs)


def _flat(value):
    return [v for v in torch.utils._pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("name", CASES)
def test_architecture_traces_with_named_dimensions(name):
    case = _build(name)
    tracer = CustomTracer()
    concrete = bind_arguments(case.model.forward, *copy.deepcopy((case.args, case.kwargs)))
    graph = tracer.trace(case.model, concrete_args=concrete, dynamic_shapes=case.dynamic_shapes)
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    # the declared dimensions stay dynamic on the placeholders
    names = set(tracer.dimension_names.values())
    for axes in case.dynamic_shapes.values():
        declared = {
            a for a in (axes.values() if isinstance(axes, dict) else []) if isinstance(a, str)
        }
        assert declared <= names, (declared, names)
    checked = 0
    for args, kwargs in [(case.args, case.kwargs), *case.other_inputs]:
        expected = _run(case.model, args, kwargs)
        got = _run(gm, args, kwargs)
        assert_same(_flat(expected), _flat(got), atol=1e-4, rtol=1e-4)
        checked += 1
    assert checked == 3
    for sizes in case.stress_sizes:
        kwargs = case.inputs_at(sizes)
        expected = _run(case.model, (), kwargs)
        try:
            got = _run(gm, (), kwargs)
        except ConstraintViolationError:
            continue
        assert_same(_flat(expected), _flat(got), atol=1e-4, rtol=1e-4)


def test_decode_step_reports_the_mask_relation():
    case = _build("llama_decode")
    # the constraint itself, not the version capturing its other side
    tracer = CustomTracer(narrowing="constraints")
    concrete = bind_arguments(case.model.forward, case.args, case.kwargs)
    tracer.trace(case.model, concrete_args=concrete, dynamic_shapes=case.dynamic_shapes)
    expressions = [c.expression for c in tracer.constraints]
    # the attention mask covers the cache and the new tokens
    assert any("total" in e and "past" in e and "seq" in e for e in expressions), expressions
