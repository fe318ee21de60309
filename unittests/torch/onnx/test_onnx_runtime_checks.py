"""An exported model checks what it assumes: onnxruntime fails, naming the constraint,
the dimension and the source line, instead of returning values outside the constraints
(:mod:`yobx.torch.onnx.runtime_checks`); validation breaks every check once."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import onnxruntime
import pytest
import sympy
import torch

from yobx.torch.onnx import to_onnx as export_to_onnx
from yobx.torch.onnx.runtime_checks import (
    CHECK_NODE_PREFIX,
    RUNTIME_CHECKS_KEY,
    ModelCheck,
    failed_check,
    is_check_node,
)
from yobx.torch.onnx.validation import validate

from ._helpers import export_and_validate as export_validated

# the checks of constraints, so one capture: test_onnx_versions.py exports both sides
to_onnx = functools.partial(export_to_onnx, narrowing="constraints")
export_and_validate = functools.partial(export_validated, narrowing="constraints")


def _session(result) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _run(session, **feeds):
    return session.run(None, {k: v.numpy() for k, v in feeds.items()})


def _refused(session, **feeds) -> str:
    """The name of the check onnxruntime fails on."""
    with pytest.raises(Exception) as info:
        _run(session, **feeds)
    name = failed_check(str(info.value))
    assert name is not None, str(info.value)
    return name


class LongSequences(torch.nn.Module):
    def forward(self, x):
        if x.shape[2] > 16:  # the decision
            return x.sum(dim=2) * 2
        return x.mean(dim=2) + 1


def test_a_narrowed_branch_is_refused_outside_naming_constraint_dimension_and_line():
    model = LongSequences()
    result = export_and_validate(
        model, (torch.randn(2, 3, 8),), dynamic_shapes={"x": {0: "batch", 2: "seq"}}
    )
    assert [c.expression for c in result.constraints] == ["seq <= 16"]
    session = _session(result)
    for seq in (2, 9, 16):
        x = torch.randn(3, 3, seq)
        np.testing.assert_allclose(_run(session, x=x)[0], model(x).numpy(), atol=1e-5)
    for seq in (17, 40):
        name = _refused(session, x=torch.randn(2, 3, seq))
        assert "seq <= 16 (range)" in name
        assert "seq is axis 2 of x" in name
        assert f"{__file__}:" in name and name.startswith(CHECK_NODE_PREFIX)
    # the validation broke the check once and saw onnxruntime refuse
    cases = [c for c in result.validation.cases if c.check is not None]
    assert [c.check for c in cases] == ["seq <= 16"]
    assert cases[0].error is None and "seq=17" in cases[0].description
    assert result.validation.n_checks_fired == 1


def test_without_runtime_checks_the_model_is_silently_wrong_outside():
    model = LongSequences()
    result = to_onnx(
        model,
        (torch.randn(2, 3, 8),),
        dynamic_shapes={"x": {0: "batch", 2: "seq"}},
        runtime_checks=False,
    )
    assert result.runtime_checks == []
    assert not any(is_check_node(n) for n in result.model.graph)
    assert RUNTIME_CHECKS_KEY not in result.model.metadata_props
    # the constraint is still reported, and the model does return (wrong) values
    assert [c.expression for c in result.constraints] == ["seq <= 16"]
    x = torch.randn(2, 3, 17)
    got = _run(_session(result), x=x)[0]
    assert not np.allclose(got, model(x).numpy(), atol=1e-3)


def test_validation_fails_when_a_check_does_not_fire():
    """A model whose checks were left out, validated as if it had them: onnxruntime
    returns values where it must refuse, and the report is not ok."""
    model = LongSequences()
    x = torch.randn(2, 3, 8)
    dynamic_shapes = {"x": {0: "batch", 2: "seq"}}
    checked = to_onnx(model, (x,), dynamic_shapes=dynamic_shapes)
    unchecked = to_onnx(model, (x,), dynamic_shapes=dynamic_shapes, runtime_checks=False)
    unchecked.runtime_checks = checked.runtime_checks
    report = unchecked.validate(model, (x,))
    assert not report.ok
    (case,) = [c for c in report.cases if c.check is not None]
    assert "returned values" in case.error


class Cached(torch.nn.Module):
    """A decode step: the mask covers the cache and the new tokens."""

    def forward(self, x, cache, mask):
        keys = torch.cat([cache, x], dim=1)
        return keys * mask[:, :, None]


def test_a_relation_between_inputs_is_checked():
    model = Cached()
    inputs = (torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.ones(2, 8))
    result = export_and_validate(
        model,
        inputs,
        dynamic_shapes=(
            {0: "batch", 1: "seq"},
            {0: "batch", 1: "past"},
            {0: "batch", 1: "total"},
        ),
    )
    assert [c.expression for c in result.constraints] == ["total == past + seq"]
    session = _session(result)
    x, cache, mask = torch.randn(3, 2, 4), torch.randn(3, 4, 4), torch.ones(3, 6)
    np.testing.assert_allclose(
        _run(session, x=x, cache=cache, mask=mask)[0], model(x, cache, mask).numpy(), atol=1e-6
    )
    name = _refused(session, x=x, cache=cache, mask=torch.ones(3, 7))
    assert "total == past + seq (relation)" in name
    # inputs sharing the name `batch` must agree: declared, checked too
    name = _refused(session, x=x, cache=torch.randn(2, 4, 4), mask=mask)
    assert "cache.size(0) == batch (declared)" in name
    assert result.validation.n_checks_fired == len(result.runtime_checks) >= 3


class Quarters(torch.nn.Module):
    def forward(self, x):
        return x.view(x.shape[0], x.shape[1] // 4, 4).sum(dim=-1)


def test_a_divisibility_is_checked():
    model = Quarters()
    result = export_and_validate(
        model, (torch.randn(2, 8),), dynamic_shapes={"x": {0: "batch", 1: "n"}}
    )
    assert "n % 4 == 0" in [c.expression for c in result.constraints]
    session = _session(result)
    x = torch.randn(3, 12)
    np.testing.assert_allclose(_run(session, x=x)[0], model(x).numpy(), atol=1e-6)
    assert "n % 4 == 0" in _refused(session, x=torch.randn(2, 10))


class Positions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(32, 4))

    def forward(self, x):
        torch._check(x.shape[1] >= 3)
        return x + self.table[: x.shape[1]]


def test_declared_range_and_torch_check_are_checked():
    seq = torch.export.Dim("seq", max=24)
    result = export_and_validate(
        Positions(), (torch.randn(2, 5, 4),), dynamic_shapes={"x": {0: "batch", 1: seq}}
    )
    expressions = [c.expression for c in result.runtime_checks]
    assert "seq <= 24 (declared)" in expressions
    assert any(e.startswith("torch._check(") for e in expressions)
    session = _session(result)
    assert "seq <= 24 (declared)" in _refused(session, x=torch.randn(2, 25, 4))
    assert "torch._check(" in _refused(session, x=torch.randn(2, 2, 4))
    # every check was broken once by the validation, and onnxruntime refused
    assert result.validation.n_checks_fired == len(result.runtime_checks)
    metadata = json.loads(result.model.metadata_props[RUNTIME_CHECKS_KEY])
    assert [m["expression"] for m in metadata] == expressions
    # a declared range is located at the call declaring it (its dynamic_shapes): the
    # helper's call of to_onnx
    declared = [m for m in metadata if m["kind"] == "declared"]
    assert declared and all("onnx/_helpers.py:" in m["location"] for m in declared)


class Ratio(torch.nn.Module):
    def forward(self, x, y):
        if x.shape[0] // y.shape[0] >= 2:
            return x[: y.shape[0]] + y
        return x.sum() + y


def test_a_division_by_a_size_zero_at_run_time_breaks_the_check():
    """onnxruntime's integer division by zero would stop the process: the check fails
    instead, as Python raises there."""
    result = to_onnx(
        Ratio(),
        (torch.randn(6, 3), torch.randn(2, 3)),
        dynamic_shapes={"x": {0: "n"}, "y": {0: "m"}},
    )
    assert any("//" in c.expression for c in result.constraints)
    session = _session(result)
    name = _refused(session, x=torch.randn(6, 3), y=torch.randn(0, 3))
    assert "//" in name


class HalfOfAHalf(torch.nn.Module):
    def forward(self, y):
        half = y[..., : y.shape[1] // 2]
        if half.shape[-1] % 2 != 0:
            half = torch.nn.functional.pad(half, (0, 1))
        return half[..., : half.shape[1] // 2] * 2


def test_a_check_with_exact_fractions():
    """`min(length, length/2 - (length % 2)/2) % 2 == 0`: the fractions are kept exact
    (a scale), not rounded."""
    model = HalfOfAHalf()
    result = export_and_validate(
        model, (torch.randn(2, 8),), dynamic_shapes={"y": {1: "length"}}, min_cases=2
    )
    session = _session(result)
    for length in (4, 12, 16, 20):
        y = torch.randn(2, length)
        np.testing.assert_allclose(_run(session, y=y)[0], model(y).numpy(), atol=1e-6)
    for length in (6, 10, 14):
        holds = min(length, length // 2) % 2 == 0
        assert not holds
        assert "% 2 == 0" in _refused(session, y=torch.randn(2, length))


class ConstantAndInput(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] > 8:
            return x * 2, torch.ones(3)
        return x + 1, torch.zeros(3)


def test_an_output_computed_from_no_input_is_gated_too():
    result = to_onnx(ConstantAndInput(), (torch.randn(4),), dynamic_shapes={"x": {0: "n"}})
    session = _session(result)
    assert session.run(["output_1"], {"x": np.ones(4, np.float32)})[0].tolist() == [0, 0, 0]
    with pytest.raises(Exception, match="n <= 8"):
        session.run(["output_1"], {"x": np.ones(9, np.float32)})


class Scaled(torch.nn.Module):
    def forward(self, x, k: int):
        if k > 3:
            return x[:, :k] * 2
        return x[:, :k]


def test_a_dynamic_int_input_is_checked_on_its_value():
    model = Scaled()
    result = export_and_validate(
        model, (torch.randn(2, 8), 2), dynamic_shapes={"x": {0: "batch"}, "k": "k"}
    )
    assert "k <= 3" in [c.expression for c in result.constraints]
    session = _session(result)
    assert "k is the int input k" in _refused(
        session, x=torch.randn(2, 8), k=torch.tensor(5, dtype=torch.int64)
    )


def test_ort_optimized_models_check_too():
    model = LongSequences()
    result = export_and_validate(
        model,
        (torch.randn(2, 3, 8),),
        dynamic_shapes={"x": {0: "batch", 2: "seq"}},
        optimize="ort",
    )
    assert result.runtime_checks
    assert "seq <= 16" in _refused(_session(result), x=torch.randn(2, 3, 20))


def test_model_check_holds_evaluates_sizes_as_the_model():
    n, m = sympy.Symbol("n", integer=True, nonnegative=True), sympy.Symbol("m", integer=True)
    from torch.utils._sympy.functions import FloorDiv

    check = ModelCheck(
        "c",
        "n // m >= 2",
        "other",
        "",
        sympy.Ge(FloorDiv(n, m), 2),
        {n: ("x", 0, 1, 0), m: ("y", 0, 1, 0)},
    )
    assert check.reads() == [("x", 0), ("y", 0)]
    assert check.holds({("x", 0): 6, ("y", 0): 3})
    assert not check.holds({("x", 0): 5, ("y", 0): 3})
    # Python raises on a division by zero: the check does not hold
    assert not check.holds({("x", 0): 5, ("y", 0): 0})


def test_a_user_validation_outside_the_constraints_reports_the_check():
    model = LongSequences()
    result = to_onnx(model, (torch.randn(2, 3, 8),), dynamic_shapes={"x": {2: "seq"}})
    report = validate(model, result, [(torch.randn(2, 3, 30),)])
    assert not report.ok
    assert "yobx check failed: seq <= 16" in report.cases[0].error


def test_a_fact_the_declared_ranges_settle_is_no_check():
    """SegFormer's convolutions ask ``(((h - 1)//4 - 1)//2 + 1) * (...) >= 0``, which
    interval arithmetic proves for every size: adopted, it became a check no size could
    break, and validation reported it as never exercised on a correct model."""
    pytest.importorskip("transformers")
    from yobx.models.architectures import build

    case = build("segformer")
    result = export_to_onnx(
        case.model, case.args, case.kwargs, dynamic_shapes=case.dynamic_shapes, validate=True
    )
    assert result.validation.ok, result.validation.format()
    assert not any(">= 0" in c.expression for c in result.constraints)


def test_a_shared_division_keeps_its_condition_in_every_check():
    """Two checks computing ``m % (n // 4)``: the second reads the first's nodes and
    still fails where ``n // 4`` is 0 (Python raises there); inside a disjunction, the
    division counts only for its disjunct."""
    import onnx_ir as ir
    from torch.utils._sympy.functions import FloorDiv, PythonMod

    from yobx.torch.onnx.runtime_checks import CHECK_NODE_PREFIX, _CheckGraph
    from yobx.torch.tracing.constraints.runtime_checks import RuntimeCheck

    n, m = sympy.Symbol("n", integer=True), sympy.Symbol("m", integer=True)
    remainder = PythonMod(m, FloorDiv(n, 4))
    guarded = sympy.Or(sympy.Lt(n, 4), sympy.Eq(remainder, 0))
    alone = sympy.Lt(remainder, 100)
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["n", "m"]))
    graph = ir.Graph([x], [], nodes=[], opset_imports={"": 18})
    identity = ir.node("Identity", [x])
    graph.append(identity)
    graph.outputs.append(identity.outputs[0])
    identity.outputs[0].name = "y"
    builder = _CheckGraph(graph, {"x": x})
    sources = {n: ("x", 0, 1, 0), m: ("x", 1, 1, 0)}
    for name, condition in (("first", guarded), ("second", alone)):
        builder.check(condition, sources, CHECK_NODE_PREFIX + name, RuntimeCheck(condition, name))
    builder.gate()
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=10))
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )

    def failing(rows: int, columns: int) -> str | None:
        try:
            session.run(None, {"x": np.zeros((rows, columns), dtype=np.float32)})
        except Exception as e:
            return failed_check(str(e))
        return None

    assert failing(8, 4) is None
    assert failing(8, 3) == CHECK_NODE_PREFIX + "first"
    # n // 4 == 0: the first check holds (its guard), the second divides by zero
    assert failing(3, 5) == CHECK_NODE_PREFIX + "second"


class MathOfASize(torch.nn.Module):
    """A decision on ``math.<function>(n / 20)``: torch keeps it as
    ``OpaqueUnaryFn_<function>``; increasing on (0, 1.5] but for ``cos``."""

    def __init__(self, function: str):
        super().__init__()
        self.function = function
        self.sign = -1 if function == "cos" else 1

    def forward(self, x):
        # read from math while tracing: torch.fx wraps math's functions in place
        function = getattr(math, self.function)
        if self.sign * function(x.shape[0] / 20) > self.sign * function(0.2):
            return x * 2
        return x - 1


@pytest.mark.parametrize("function", ["sqrt", "cos", "sin", "tan", "cosh", "sinh", "tanh", "log2"])
def test_a_math_function_of_a_size_is_checked(function):
    # onnxruntime has float64 kernels for some of them only: the others are composed
    model = MathOfASize(function)
    result = to_onnx(model, (torch.randn(6, 3),), dynamic_shapes={"x": {0: "n"}})
    assert any(f"OpaqueUnaryFn_{function}" in c.expression for c in result.runtime_checks), [
        c.expression for c in result.runtime_checks
    ]
    session = _session(result)
    for n in (5, 6, 9, 30):
        x = torch.randn(n, 3)
        np.testing.assert_allclose(_run(session, x=x)[0], model(x).numpy())
    for n in (1, 3, 4):
        assert _refused(session, x=torch.randn(n, 3))


def test_a_check_whose_guard_divides_by_zero_where_it_does_not_hold_passes():
    # `... when (dim >= 2) and ... // ((dim + 3)//4) != 4`: at dim = 0 the guard's
    # division by 0 broke the check (the model refused widths of 0, where eager runs)
    from ..tracing.test_tracing_constraints import ChunkCounts

    model = ChunkCounts()
    result = export_to_onnx(model, (torch.randn(7, 8),), dynamic_shapes=({0: "seq", 1: "dim"},))
    assert any("//4" in c.expression for c in result.runtime_checks)
    session = _session(result)
    for shape in ((7, 8), (7, 0), (1, 0), (7, 13), (3, 4)):
        x = torch.randn(*shape)
        for got, expected in zip(_run(session, x=x), model(x), strict=True):
            np.testing.assert_allclose(got, expected.numpy(), atol=1e-5)
            assert got.shape == tuple(expected.shape)


def test_a_guard_dividing_by_zero_where_none_of_its_conditions_fails_is_checked():
    # `... when (batch < 1) and ... // ((dim + 3)//4) == 4` at batch = dim = 0: the
    # choice between versions would divide by zero there, so the check counts its
    # guard as failing and refuses the sizes by name (a kernel of a branch failed when
    # the guard counted as false); at batch = 3 the guard fails on `batch < 1`
    from ..tracing.test_tracing_versions import ChunksOfAnEmptyBatch

    model = ChunksOfAnEmptyBatch()
    dims = {"x": {0: "dim", 1: "batch", 2: "dim"}, "y": {2: "width", 3: "dim"}}
    example = {"x": torch.randn(8, 8, 8), "y": torch.randn(3, 4, 8, 8)}
    session = _session(export_to_onnx(model, (), example, dynamic_shapes=dims))
    for dim, batch in ((8, 8), (13, 5), (0, 3)):
        x, y = torch.randn(dim, batch, dim), torch.randn(3, 4, 5, dim)
        (got,) = _run(session, x=x, y=y)
        np.testing.assert_allclose(got, model(x, y).numpy(), atol=1e-5)
    refused = _refused(session, x=torch.randn(0, 0, 0), y=torch.randn(3, 4, 5, 0))
    assert "batch < 1" in refused, refused
