"""The architecture cases build, run eagerly, and their inputs have the documented sizes."""

import pytest
import torch

pytest.importorskip("transformers")

from yobx.models.architectures import ARCHITECTURES, FAMILIES, build
from yobx.models.architectures.base import measured_sizes

NEEDS_DIFFUSERS = {"unet2d", "unet2d_condition", "autoencoder_kl"}


def _build(name):
    if name in NEEDS_DIFFUSERS:
        pytest.importorskip("diffusers")
    return build(name)


def _clone(value):
    return torch.utils._pytree.tree_map(
        lambda t: t.clone() if isinstance(t, torch.Tensor) else t, value
    )


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_case_runs_at_documented_sizes(name):
    case = _build(name)
    assert case.name == name and case.family == FAMILIES[name]
    assert not case.model.training
    assert sum(p.numel() for p in case.model.parameters()) < 1_000_000
    assert len(case.other_inputs) == len(case.other_sizes) == 2
    assert measured_sizes(case.kwargs, case.dynamic_shapes) == case.sizes
    for (args, kwargs), sizes in zip(case.other_inputs, case.other_sizes):
        assert args == ()
        assert measured_sizes(kwargs, case.dynamic_shapes) == sizes
        assert sizes != case.sizes
    # every dynamic dimension takes another size in at least one of the other inputs
    for dim, size in case.sizes.items():
        assert any(sizes[dim] != size for sizes in case.other_sizes), dim
    stress = [case.inputs_at(sizes) for sizes in case.stress_sizes]
    for kwargs, sizes in zip(stress, case.stress_sizes):
        assert measured_sizes(kwargs, case.dynamic_shapes) == sizes
    with torch.no_grad():
        for kwargs in [case.kwargs, *(kw for _, kw in case.other_inputs), *stress]:
            case.model(**_clone(kwargs))


@pytest.mark.parametrize("name", ["vit", "llama_decode", "unet_block_branches"])
def test_case_is_deterministic(name):
    first, second = _build(name), _build(name)
    for (k1, v1), (k2, v2) in zip(
        first.model.state_dict().items(), second.model.state_dict().items()
    ):
        assert k1 == k2
        torch.testing.assert_close(v1, v2, rtol=0, atol=0)
    leaves = torch.utils._pytree.tree_leaves
    for a, b in zip(leaves(first.kwargs), leaves(second.kwargs)):
        assert type(a) is type(b)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)


def test_decode_inputs_relate_mask_and_cache():
    case = _build("llama_decode")
    for sizes in (case.sizes, *case.other_sizes):
        assert sizes["total"] == sizes["past"] + sizes["seq"]
    with pytest.raises(ValueError, match="total == past \\+ seq"):
        case.inputs_at({"total": 3})


def test_unknown_case():
    with pytest.raises(KeyError, match="unknown architecture case"):
        build("no-such-model")


def test_measured_sizes_detects_inconsistent_names():
    inputs = {"x": torch.zeros(2, 3), "y": torch.zeros(4)}
    assert measured_sizes(inputs, {"x": {0: "a", 1: "b"}, "y": ["c"]}) == {"a": 2, "b": 3, "c": 4}
    with pytest.raises(ValueError, match="'a' is 2 and 4"):
        measured_sizes(inputs, {"x": {0: "a"}, "y": {0: "a"}})
