"""Guards of specializations name the condition itself (issue 11, item 5).

With ``specialize_undecidable=True`` (or ``Dim.AUTO``), a decision the example settles
makes a dimension static. The guard reported for it must read ``batch == 3`` or
``2*batch == 6``: rendered after the symbol was replaced by its value, it read
``True -> True`` and nothing said the graph holds for ``batch == 3`` only.
"""

import operator
import warnings

import pytest
import torch
from torch.export import Dim

from yobx.torch.tracing import ConstraintViolationError, CustomTracer


class IfEqual(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] == 3:
            return x + 1
        return x - 1


class IfProduct(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] * 2 == 6:
            return x + 1
        return x - 1


class IfNotEqual(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] != 3:
            return x + 1
        return x - 1


class IntOfDimension(torch.nn.Module):
    def forward(self, x):
        # a real Python int (`int(...)` in the traced code stays symbolic)
        return x * operator.index(x.shape[0])


class KernelNeedsValue(torch.nn.Module):
    def forward(self, x):
        # reshape to a static shape: the kernel itself guards `batch == 3`
        return x.reshape(3, 2) * 2


class Broadcast(torch.nn.Module):
    def forward(self, x):
        return x + torch.ones(3, 2)


# (model, expected guard with {name} for the dimension, its value, expected constraint)
CASES = [
    (IfEqual, "{name} == 3", True, "{name} == 3"),
    (IfProduct, "2*{name} == 6", True, "{name} == 3"),
    (IfNotEqual, "{name} != 3", False, "{name} == 3"),
    (IntOfDimension, "{name} == 3", True, "{name} == 3"),
    (KernelNeedsValue, "{name} == 3", True, "{name} == 3"),
    (Broadcast, "{name} == 3", True, "{name} == 3"),
]

# how the dimension is declared -> (tracer options, its name in guards)
DECLARATIONS = {
    "specialize_undecidable": ({"specialize_undecidable": True}, Dim("batch"), "batch"),
    "Dim.AUTO": ({}, Dim.AUTO, "x_dim_0"),
}


@pytest.mark.parametrize("declaration", sorted(DECLARATIONS))
@pytest.mark.parametrize(
    ("model_class", "guard", "value", "constraint"), CASES, ids=[c[0].__name__ for c in CASES]
)
def test_specialization_guard_names_the_condition(
    model_class, guard, value, constraint, declaration
):
    options, dim, name = DECLARATIONS[declaration]
    model = model_class()
    x = torch.randn(3, 2)
    tracer = CustomTracer(**options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = tracer.trace(model, concrete_args={"x": x}, dynamic_shapes={"x": {0: dim}})
    adopted = [g for g in tracer.guards if g.reason == "adopted"]
    assert [(g.expression, g.value) for g in adopted] == [(guard.format(name=name), value)]
    assert adopted[0].location.startswith(__file__)
    # the old rendering, after the replacement, gave a condition without a dimension
    assert all(g.expression not in ("True", "False") for g in tracer.guards)
    assert [(c.expression, c.kind) for c in tracer.constraints] == [
        (constraint.format(name=name), "value")
    ]
    output = next(n for n in graph.nodes if n.op == "output")
    assert [str(g) for g in output.meta["guards"]] == [str(g) for g in tracer.guards]
    assert any("becomes static" in str(w.message) for w in caught)
    # the graph holds where the guard does, and refuses the other sizes
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    torch.testing.assert_close(gm(x), model(x))
    with pytest.raises(ConstraintViolationError, match=constraint.format(name=name)):
        gm(torch.randn(5, 2))


def test_relation_of_two_dimensions_is_rendered_before_adoption():
    """A Python int of ``a + b`` fixes the sum: the guard names both dimensions."""

    class Model(torch.nn.Module):
        def forward(self, x, y):
            return x.sum() + operator.index(x.shape[0] + y.shape[0])

    tracer = CustomTracer(specialize_undecidable=True)
    inputs = {"x": torch.randn(3, 2), "y": torch.randn(4, 2)}
    graph = tracer.trace(
        Model(), concrete_args=inputs, dynamic_shapes={"x": {0: Dim("a")}, "y": {0: Dim("b")}}
    )
    assert [(g.expression, g.value) for g in tracer.guards if g.reason == "adopted"] == [
        ("a + b == 7", True)
    ]
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    torch.testing.assert_close(gm(**inputs), Model()(**inputs))
    # another pair with the same sum is fine, another sum is refused
    other = (torch.randn(2, 2), torch.randn(5, 2))
    torch.testing.assert_close(gm(*other), Model()(*other))
    with pytest.raises(ConstraintViolationError, match="a \\+ b == 7"):
        gm(torch.randn(2, 2), torch.randn(2, 2))


def test_a_fact_checked_twice_by_a_kernel_is_reported_once():
    """``reshape(3, -1)`` checks a remainder then a product: one guard, one constraint."""

    class Model(torch.nn.Module):
        def forward(self, x):
            return x.reshape(3, -1)

    tracer = CustomTracer(specialize_undecidable=True)
    tracer.trace(
        Model(), concrete_args={"x": torch.randn(3, 2)}, dynamic_shapes={"x": {0: Dim("n")}}
    )
    assert [g.expression for g in tracer.guards] == ["(2*n) % 3 == 0"]
    assert [c.expression for c in tracer.constraints] == ["(2*n) % 3 == 0"]
