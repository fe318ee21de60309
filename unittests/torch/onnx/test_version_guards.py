"""The decisions torch takes while lowering each version of a capture alone
(yobx.torch.onnx.version_guards): proved by the version's capture, or adopted as its
constraint and checked where the model selects it; a merged version and the graph
choosing between the versions check them too."""

from __future__ import annotations

import types

import onnxruntime
import pytest
import sympy
import torch

from yobx.torch.onnx import capture as capture_module
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.lowering import lower_to_aten
from yobx.torch.onnx.runtime_checks import failed_check
from yobx.torch.onnx.version_guards import check_version_lowering_guards, version_snapshots


def _session(result) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def test_a_version_lowered_through_make_fx_checks_what_its_lowering_decided():
    """A vision transformer's versions lowered by make_fx alone: torch's kernels decide
    on the number of patches from each version's example (``max(1, h//8)*max(1, w//8)
    != 1``), which the capture did not prove. The decision becomes the version's
    constraint, and the model refuses the sizes outside it (one patch) instead of
    running a graph lowered for others; elsewhere it matches eager."""
    pytest.importorskip("transformers")
    from yobx.models.architectures import build
    from yobx.torch.onnx.validation import validate

    case = build("vit")
    result = to_onnx(
        case.model,
        case.args,
        case.kwargs,
        dynamic_shapes=case.dynamic_shapes,
        direct_lowering=False,
    )
    assert len(result.versions) == 3
    lowered = [c for c in result.constraints if "!= 1" in c.expression]
    assert lowered and all(c.when for c in lowered), result.constraints
    for sizes in ({"batch": 1, "height": 16, "width": 64}, {"batch": 2, "height": 32, "width": 32}):
        report = validate(case.model, result, [((), case.inputs_at(sizes))])
        assert report.ok and report.n_checked == 1, report.format()
    one_patch = case.inputs_at({"batch": 1, "height": 8, "width": 8})
    with pytest.raises(Exception) as info:
        feeds = {k: v.numpy() for k, v in one_patch.items() if isinstance(v, torch.Tensor)}
        _session(result).run(None, feeds)
    assert "!= 1 when" in (failed_check(str(info.value)) or ""), str(info.value)


class Three(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] + 2 == 5:
            return x * 2
        return x - 1


def _judged(guard_of, top: bool = False, merge: bool = False):
    """The checks of the capture of ``Three`` (two versions: ``d == 3`` and ``d != 3``)
    after judging one guard ``guard_of(symbol of d)`` added to the lowering of the
    version ``d != 3`` (or of the graph choosing between them with ``top``); with
    ``merge``, the version ``d == 3`` is computed by the other's graph."""
    captured = capture_module.capture(
        Three(), (torch.randn(2, 3),), {}, ({1: "d"},), None, narrowing="versions"
    )
    tracer = captured.tracer
    general = next(v for v in tracer.versions if "!=" in v.when)
    pinned = next(v for v in tracer.versions if v is not general)
    if merge:
        pinned.computed_by = general
    snapshots, known = version_snapshots(tracer), tracer.dims.snapshot()
    lowered = lower_to_aten(captured.graph_module)
    owner = tracer if top else general.tracer
    guard = types.SimpleNamespace(expr=guard_of(owner.dims.by_name["d"].node._expr))
    node = next(iter(captured.graph_module.graph.nodes))
    if top:
        lowered.guards.append((guard, node))
    else:
        lowered.version_guards.append((general.tracer.dims, [(guard, node)]))
    check_version_lowering_guards(captured, lowered, snapshots, known)
    symbol = tracer.dims.by_name["d"].node._expr

    def passes(d: int) -> bool:
        return all(bool(c.condition.subs(symbol, d)) for c in tracer.checks)

    return captured, passes


def test_a_decision_of_a_version_lowering_is_its_constraint_checked_when_selected():
    captured, passes = _judged(lambda d: sympy.Le(d, 40))
    assert [c.expression for c in captured.constraints] == ["d <= 40"]
    assert captured.constraints[0].when == "(d + 2 != 5)"
    assert passes(3) and passes(4) and passes(40)
    assert not passes(41)


def test_a_decision_the_version_proves_adds_nothing():
    captured, passes = _judged(lambda d: sympy.Ge(d, 0))
    assert captured.constraints == []
    assert passes(0) and passes(3) and passes(100)


def test_a_merged_version_checks_the_decisions_of_the_graph_computing_it():
    """``d == 3`` computed by the graph of ``d != 3``, lowered for ``d >= 4``: the
    merged version's inputs are refused rather than computed by a graph lowered for
    other sizes; ``d <= 40`` holds at ``d == 3`` and is not checked there."""
    _, passes = _judged(lambda d: sympy.Ge(d, 4), merge=True)
    assert not passes(3)
    assert passes(4) and passes(10)
    captured, passes = _judged(lambda d: sympy.Le(d, 40), merge=True)
    assert passes(3) and not passes(41)
    merged = [c for c in captured.tracer.checks if c.expression.endswith("when (d + 2 == 5)")]
    assert not merged, merged
    _, passes = _judged(lambda d: sympy.Ge(d, 4), merge=False)
    assert passes(3)  # not merged: the version d == 3 runs its own graph


def test_a_decision_of_the_graph_choosing_between_versions_is_checked_for_every_input():
    captured, passes = _judged(lambda d: sympy.Le(d, 40), top=True)
    assert passes(3) and passes(40)
    assert not passes(41)
    check = captured.tracer.checks[-1]
    assert check.expression == "d <= 40" and check.kind == "lowering to aten"
