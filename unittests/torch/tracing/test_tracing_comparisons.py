"""Behaviour 3: comparisons on dynamic dimensions are decided when provable, otherwise
adopted from the example as constraints the graph checks (or refused for named Dims)."""

import pytest
import torch
from torch.export import Dim
from torch.fx.proxy import TraceError

from yobx.torch.tracing import ConstraintViolationError, CustomTracer, StrictDimensionError

from ._helpers import check_trace, trace_module

#: these tests look at the constraints themselves: the other side of a decision is not
#: captured (test_tracing_versions.py does)
CONSTRAINTS = {"narrowing": "constraints"}


class EmptyCheck(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] == 0:
            return x
        if x.shape[0] >= 1 and x.shape[1] != 1:
            return x * 2
        return x


def test_provable_from_default_bounds_and_recorded():
    tracer, graph, _ = check_trace(
        EmptyCheck(),
        {"x": torch.randn(3, 4)},
        {"x": {0: "batch", 1: "seq"}},
        other_inputs=[{"x": torch.randn(7, 2)}],
    )
    text = [str(g) for g in tracer.guards]
    assert any(t.startswith("batch == 0 -> False (bounds)") for t in text), text
    assert any("seq" in t and "True" in t for t in text), text
    assert all(__file__ in g.location for g in tracer.guards)
    output = next(n for n in graph.nodes if n.op == "output")
    assert [str(g) for g in output.meta["guards"]] == text


class Large(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] >= 100:
            return x.sum(0)
        return x.mean(0)


def test_unprovable_is_adopted_with_location_and_checked():
    tracer, _, gm = check_trace(
        Large(),
        {"x": torch.randn(3, 4)},
        {"x": {0: "batch"}},
        [{"x": torch.randn(50, 4)}],
        tracer_kwargs=CONSTRAINTS,
    )
    (constraint,) = tracer.constraints
    assert (constraint.expression, constraint.kind) == ("batch <= 99", "range")
    assert constraint.location.startswith(f"{__file__}:")
    assert tracer.range_constraints == {"batch": (2, 99)}
    # never silently wrong: outside the constraint the graph refuses to run
    with pytest.raises(ConstraintViolationError, match=r"batch <= 99.*batch=120"):
        gm(torch.randn(120, 4))


def test_unprovable_with_a_named_dim_raises_with_location_and_fix():
    with pytest.raises(StrictDimensionError) as info:
        trace_module(Large(), {"x": torch.randn(3, 4)}, {"x": {0: Dim("batch")}})
    msg = str(info.value)
    assert f"{__file__}:" in msg
    assert "batch <= 99" in msg
    assert 'batch = torch.export.Dim("batch", max=99)' in msg
    assert info.value.dimensions == ("batch",)


def test_bounds_from_dim_make_it_provable():
    batch = Dim("batch", min=100, max=1000)
    x = torch.randn(120, 4)
    tracer, _, gm = check_trace(
        Large(), {"x": x}, {"x": {0: batch}}, other_inputs=[{"x": torch.randn(300, 4)}]
    )
    assert any(str(g).startswith("batch >= 100 -> True") for g in tracer.guards)


def test_bounds_upper_make_it_false():
    batch = Dim("batch", max=50)
    check_trace(
        Large(),
        {"x": torch.randn(3, 4)},
        {"x": {0: batch}},
        other_inputs=[{"x": torch.randn(9, 4)}],
    )


class Checked(torch.nn.Module):
    def forward(self, x, y):
        torch._check(x.shape[0] > y.shape[0])
        if x.shape[0] > y.shape[0]:
            return x[: y.shape[0]] + y
        return x


def test_torch_check_adds_relation_between_dimensions():
    tracer, _, _ = check_trace(
        Checked(),
        {"x": torch.randn(5, 3), "y": torch.randn(2, 3)},
        {"x": {0: "n"}, "y": {0: "m"}},
        other_inputs=[{"x": torch.randn(9, 3), "y": torch.randn(4, 3)}],
    )
    reasons = {g.reason for g in tracer.guards}
    assert "torch._check" in reasons
    assert any(g.expression == "n > m" and g.value is True for g in tracer.guards)


class Unchecked(torch.nn.Module):
    def forward(self, x, y):
        if x.shape[0] > y.shape[0]:
            return x[: y.shape[0]] + y
        return x


def test_relation_without_check_is_adopted():
    tracer, _, gm = check_trace(
        Unchecked(),
        {"x": torch.randn(5, 3), "y": torch.randn(2, 3)},
        {"x": {0: "n"}, "y": {0: "m"}},
        [{"x": torch.randn(9, 3), "y": torch.randn(4, 3)}],
        tracer_kwargs=CONSTRAINTS,
    )
    assert [(c.expression, c.kind) for c in tracer.constraints] == [("n > m", "other")]
    with pytest.raises(ConstraintViolationError, match="n > m"):
        gm(torch.randn(2, 3), torch.randn(4, 3))


def test_relation_with_named_dims_suggests_a_check():
    with pytest.raises(StrictDimensionError, match=r"torch._check\(n > m\)"):
        trace_module(
            Unchecked(),
            {"x": torch.randn(5, 3), "y": torch.randn(2, 3)},
            {"x": {0: Dim("n")}, "y": {0: Dim("m")}},
        )


def test_specialize_undecidable_records_guard():
    tracer, _, _ = trace_module(
        Large(),
        {"x": torch.randn(3, 4)},
        {"x": {0: Dim("batch")}},
        tracer_kwargs={"specialize_undecidable": True},
    )
    assert any(
        g.reason == "adopted" and g.expression == "batch >= 100" and g.value is False
        for g in tracer.guards
    )
    assert [c.expression for c in tracer.constraints] == ["batch <= 99"]


class AssertAndOr(torch.nn.Module):
    def forward(self, x):
        assert x.shape[0] > 0, "empty"
        n = x.shape[0]
        ok = (n > 1) and (n != 0 or n < 2)
        return x + 1 if ok and bool(n) else x


def test_assert_and_or_bool():
    check_trace(
        AssertAndOr(),
        {"x": torch.randn(3, 2)},
        {"x": {0: "batch"}},
        other_inputs=[{"x": torch.randn(8, 2)}],
    )


class StaticCompare(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] == 4:
            return x + 1
        return x


def test_static_comparisons_are_plain_python():
    tracer, _, _ = check_trace(StaticCompare(), {"x": torch.randn(3, 4)}, {"x": {0: "batch"}})
    assert tracer.guards == []


class MismatchedBroadcast(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def test_operation_needing_unproven_equality_is_a_relation():
    tracer, _, gm = check_trace(
        MismatchedBroadcast(),
        {"x": torch.randn(3, 4), "y": torch.randn(3, 4)},
        {"x": {0: "a"}, "y": {0: "b"}},
        [{"x": torch.randn(6, 4), "y": torch.randn(6, 4)}],
    )
    assert [(c.expression, c.kind) for c in tracer.constraints] == [("a == b", "relation")]
    with pytest.raises(ConstraintViolationError, match="a == b"):
        gm(torch.randn(3, 4), torch.randn(1, 4))


def test_operation_needing_unproven_equality_with_named_dims_suggests_derived():
    with pytest.raises(StrictDimensionError) as info:
        trace_module(
            MismatchedBroadcast(),
            {"x": torch.randn(3, 4), "y": torch.randn(3, 4)},
            {"x": {0: Dim("a")}, "y": {0: Dim("b")}},
        )
    assert "a == b" in str(info.value)
    ((constraint, fix),) = info.value.needed
    assert constraint.kind == "relation"
    assert fix.startswith(("b = a", "a = b"))


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


def test_data_dependent_branch_raises():
    with pytest.raises(TraceError, match="data-dependent"):
        trace_module(DataDependent(), {"x": torch.randn(3, 4)})


def test_example_outside_declared_range():
    with pytest.raises(ValueError, match="outside its range"):
        trace_module(Large(), {"x": torch.randn(3, 4)}, {"x": {0: Dim("batch", min=10)}})


def test_bad_inputs_have_clear_errors():
    tracer = CustomTracer()
    with pytest.raises(TypeError, match="nn.Module or a callable"):
        tracer.trace(42)
    with pytest.raises(TypeError, match="valid names are"):
        tracer.trace(Large(), concrete_args={"y": torch.randn(2, 2)})
    # A parameter without an example traces as torch.fx does; the first decision
    # that needs its value says which example to pass.
    with pytest.raises(TraceError, match=r"pass an example: concrete_args=\{'x'"):
        tracer.trace(Large(), concrete_args={})
    with pytest.raises(ValueError, match="not among the traced inputs"):
        tracer.trace(
            Large(), concrete_args={"x": torch.randn(2, 2)}, dynamic_shapes={"z": {0: "batch"}}
        )
    with pytest.raises(ValueError, match="names axis 5"):
        tracer.trace(
            Large(), concrete_args={"x": torch.randn(2, 2)}, dynamic_shapes={"x": {5: "batch"}}
        )
    with pytest.raises(ValueError, match="size 3 in one input"):
        tracer.trace(
            MismatchedBroadcast(),
            concrete_args={"x": torch.randn(3, 2), "y": torch.randn(4, 2)},
            dynamic_shapes={"x": {0: "n"}, "y": {0: "n"}},
        )


class Unsupported(torch.nn.Module):
    def forward(self, x):
        return x.reshape(7, -1)


def test_failing_operation_names_user_line():
    with pytest.raises(TraceError) as info:
        trace_module(Unsupported(), {"x": torch.randn(3, 4)})
    assert f"{__file__}:" in str(info.value)
    assert "reshape" in str(info.value)


def test_float_of_a_specialized_symbolic_float_keeps_its_value():
    """A real Python float of ``math.sqrt(x.shape[-1])`` with specialization bakes
    sqrt(5), not 2 (the traced code's ``float`` keeps it symbolic, the builtin itself,
    called from elsewhere, does not)."""
    import builtins
    import math

    class Model(torch.nn.Module):
        def forward(self, x):
            return x / builtins.float(math.sqrt(x.shape[-1]))

    x = torch.randn(2, 5)
    tracer = CustomTracer(specialize_undecidable=True)
    graph = tracer.trace(Model(), concrete_args={"x": x}, dynamic_shapes={"x": {1: "d"}})
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    torch.testing.assert_close(gm(x), Model()(x))
    assert [(c.expression, c.kind) for c in tracer.constraints] == [("d == 5", "value")]
    with pytest.raises(ConstraintViolationError, match="d == 5"):
        gm(torch.randn(2, 6))
