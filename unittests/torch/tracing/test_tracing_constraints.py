"""Refine, don't refuse: facts adopted as constraints, reported, and checked at run time.

Each kind of constraint is traced with string names (adopted), with a named
``torch.export.Dim`` (refused with a paste-able fix) and checked when the graph runs:
exact inside the constraints, a ConstraintViolationError outside.
"""

import pickle
import re
import warnings

import pytest
import torch
from torch.export import Dim

from yobx.torch.tracing import (
    ConstraintViolationError,
    CustomTracer,
    DataDependentError,
    SpecializationError,
    StrictDimensionError,
)
from yobx.torch.tracing.constraints.runtime_checks import check_constraint

from ._helpers import check_trace, trace_module

#: for the tests looking at the constraints themselves: the other side of a decision is
#: not captured (test_tracing_versions.py does)
CONSTRAINTS = {"narrowing": "constraints"}


def _kinds(tracer):
    return [(c.expression, c.kind) for c in tracer.constraints]


# range: a position table of 128 entries sliced by the sequence length


class Positions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(128 * 4, dtype=torch.float32).reshape(128, 4))

    def forward(self, x):
        return x + self.table[: x.shape[1]]


def test_range_is_adopted_reported_and_checked():
    tracer, graph, gm = check_trace(
        Positions(),
        {"x": torch.randn(2, 7, 4)},
        {"x": {0: "batch", 1: "seq"}},
        [{"x": torch.randn(3, 128, 4)}, {"x": torch.randn(1, 2, 4)}],
    )
    assert _kinds(tracer) == [("seq <= 128", "range")]
    (constraint,) = tracer.constraints
    assert constraint.location.startswith(__file__) and constraint.dimensions == ("seq",)
    assert tracer.range_constraints == {"batch": (2, float("inf")), "seq": (2, 128)}
    output = next(n for n in graph.nodes if n.op == "output")
    assert output.meta["constraints"] == tracer.constraints
    with pytest.raises(ConstraintViolationError, match=r"seq <= 128.*seq=129") as info:
        gm(torch.randn(2, 129, 4))
    assert info.value.values == {"seq": 129} and info.value.location == constraint.location


def test_range_with_a_named_dim_gives_the_fix():
    with pytest.raises(StrictDimensionError) as info:
        trace_module(Positions(), {"x": torch.randn(2, 7, 4)}, {"x": {1: Dim("seq")}})
    ((constraint, fix),) = info.value.needed
    assert (constraint.expression, constraint.kind) == ("seq <= 128", "range")
    assert fix == 'seq = torch.export.Dim("seq", max=128)'
    # the fix, pasted, traces
    check_trace(
        Positions(),
        {"x": torch.randn(2, 7, 4)},
        {"x": {1: Dim("seq", max=128)}},
        [{"x": torch.randn(2, 128, 4)}],
    )


# relation: an attention mask covering the cache and the new tokens


class MaskedStep(torch.nn.Module):
    def forward(self, x, cache, mask):
        keys = torch.cat([cache, x], dim=1)
        return keys * mask[:, :, None]


def _step_inputs(batch, seq, past):
    return {
        "x": torch.randn(batch, seq, 4),
        "cache": torch.randn(batch, past, 4),
        "mask": torch.rand(batch, past + seq),
    }


_STEP_SHAPES = {
    "x": {0: "batch", 1: "seq"},
    "cache": {0: "batch", 1: "past"},
    "mask": {0: "batch", 1: "total"},
}


def test_relation_is_adopted_and_checked():
    tracer, _, gm = check_trace(
        MaskedStep(), _step_inputs(2, 3, 5), _STEP_SHAPES, [_step_inputs(3, 1, 9)]
    )
    assert _kinds(tracer) == [("total == past + seq", "relation")]
    assert tracer.range_constraints["total"] == (4, float("inf"))
    with pytest.raises(ConstraintViolationError, match="total == past"):
        gm(**{**_step_inputs(2, 3, 5), "mask": torch.rand(2, 9)})


def test_relation_with_named_dims_suggests_a_check():
    batch, seq, past, total = Dim("batch"), Dim("seq"), Dim("past"), Dim("total")
    shapes = {"x": {0: batch, 1: seq}, "cache": {0: batch, 1: past}, "mask": {0: batch, 1: total}}
    with pytest.raises(StrictDimensionError) as info:
        trace_module(MaskedStep(), _step_inputs(2, 3, 5), shapes)
    ((constraint, fix),) = info.value.needed
    assert constraint.kind == "relation"
    # a Dim derives from one root only: the relation is asserted in the code instead
    assert fix.startswith("torch._check(total == past + seq)")

    class Checked(MaskedStep):
        def forward(self, x, cache, mask):
            torch._check(mask.shape[1] == cache.shape[1] + x.shape[1])
            return super().forward(x, cache, mask)

    tracer, _, gm = check_trace(Checked(), _step_inputs(2, 3, 5), shapes, [_step_inputs(3, 2, 7)])
    assert tracer.constraints == []
    with pytest.raises(ConstraintViolationError, match="torch._check"):
        gm(**{**_step_inputs(2, 3, 5), "mask": torch.rand(2, 9)})


def test_relation_to_one_named_dim_suggests_a_derived_dim():
    class Shift(torch.nn.Module):
        def forward(self, x, y):
            return x[1:] + y

    with pytest.raises(StrictDimensionError) as info:
        trace_module(
            Shift(),
            {"x": torch.randn(5, 2), "y": torch.randn(4, 2)},
            {"x": {0: Dim("n")}, "y": {0: Dim("m")}},
        )
    ((constraint, fix),) = info.value.needed
    assert constraint.kind == "relation"
    assert fix.startswith(("n = m + 1", "m = n - 1")), fix


# divisibility: a reshape into halves


class Halves(torch.nn.Module):
    def forward(self, x):
        b, d = x.shape
        pairs = x.reshape(b, d // 2, 2).sum(-1)
        # provable once d == 2 * q: no second constraint
        return pairs.repeat_interleave(2, dim=1) * (d // 2 * 2 == d)


def test_divisibility_is_adopted_and_the_dimension_becomes_a_multiple():
    tracer, graph, gm = check_trace(
        Halves(), {"x": torch.randn(3, 6)}, {"x": {0: "b", 1: "d"}}, [{"x": torch.randn(2, 10)}]
    )
    assert _kinds(tracer) == [("d % 2 == 0", "divisibility")]
    # later decisions use d == 2 * d_div2
    assert tracer.range_constraints["d"] == (2, float("inf"))
    with pytest.raises(ConstraintViolationError, match=r"d % 2 == 0.*d=7"):
        gm(torch.randn(3, 7))


def test_divisibility_with_a_named_dim_gives_the_fix():
    with pytest.raises(StrictDimensionError) as info:
        trace_module(Halves(), {"x": torch.randn(3, 6)}, {"x": {1: Dim("d")}})
    ((_, fix),) = info.value.needed
    assert fix == 'd = 2 * torch.export.Dim("d_div2")'
    half = Dim("half")
    check_trace(
        Halves(), {"x": torch.randn(3, 6)}, {"x": {1: 2 * half}}, [{"x": torch.randn(3, 8)}]
    )


class OddPadding(torch.nn.Module):
    """A UNet-style branch: pad odd sizes to even ones."""

    def forward(self, x):
        if x.shape[-1] % 2 != 0:
            x = torch.nn.functional.pad(x, (0, 1))
        return torch.nn.functional.avg_pool1d(x, 2)


def test_branch_on_parity_is_a_divisibility():
    tracer, _, gm = check_trace(
        OddPadding(),
        {"x": torch.randn(2, 3, 8)},
        {"x": {2: "w"}},
        [{"x": torch.randn(2, 3, 4)}],
        tracer_kwargs=CONSTRAINTS,
    )
    assert _kinds(tracer) == [("w % 2 == 0", "divisibility")]
    with pytest.raises(ConstraintViolationError):
        gm(torch.randn(2, 3, 9))
    # traced on an odd example, the graph takes the padding branch and checks oddness
    tracer, _, gm = check_trace(
        OddPadding(),
        {"x": torch.randn(2, 3, 7)},
        {"x": {2: "w"}},
        [{"x": torch.randn(2, 3, 11)}],
        tracer_kwargs=CONSTRAINTS,
    )
    assert _kinds(tracer) == [("w % 2 == 1", "divisibility")]


# value: a Python int needed from a dimension


class Unrolled(torch.nn.Module):
    def forward(self, x):
        # the last of a list: no value a scan gives, the loop unrolls
        return [x[:, i] * 2 for i in range(x.shape[1])][-1]


def test_value_on_a_dynamic_dimension_is_an_error_naming_the_line():
    with pytest.raises(SpecializationError) as info:
        trace_module(Unrolled(), {"x": torch.randn(2, 3)}, {"x": {1: "n"}})
    assert info.value.location.startswith(__file__)
    assert info.value.dimensions == ("n",)
    assert "Dim.STATIC" in str(info.value) and "n == 3" in str(info.value)


def test_value_on_an_auto_dimension_makes_it_static_with_a_warning():
    with pytest.warns(UserWarning, match="x_dim_1.*becomes static"):
        tracer, _, gm = check_trace(
            Unrolled(),
            {"x": torch.randn(2, 3)},
            {"x": {0: Dim.AUTO, 1: Dim.AUTO}},
            [{"x": torch.randn(5, 3)}],
        )
    assert _kinds(tracer) == [("x_dim_1 == 3", "value")]
    with pytest.raises(ConstraintViolationError):
        gm(torch.randn(2, 4))


def test_value_on_a_named_dim_says_to_declare_it_static():
    with pytest.raises(StrictDimensionError, match="Dim.STATIC"):
        trace_module(Unrolled(), {"x": torch.randn(2, 3)}, {"x": {1: Dim("n")}})


# other: any other formula


class Pooled(torch.nn.Module):
    def forward(self, x):
        if x.shape[2] * x.shape[3] == 1:
            return x.flatten(1)
        return x.mean((2, 3))


def test_other_formula_is_kept_as_written():
    tracer, _, gm = check_trace(
        Pooled(),
        {"x": torch.randn(2, 3, 4, 5)},
        {"x": {2: "h", 3: "w"}},
        [{"x": torch.randn(2, 3, 1, 7)}],
        tracer_kwargs={"narrowing": "constraints"},
    )
    # decided from the default ranges (h, w >= 2), but wrong for h == w == 1: checked
    assert _kinds(tracer) == [("h*w != 1", "other")]
    with pytest.raises(ConstraintViolationError, match=r"h\*w != 1"):
        gm(torch.randn(2, 3, 1, 1))
    assert gm(torch.randn(2, 3, 1, 3)).shape == (2, 3)
    # by default, the side h == w == 1 is a version of its own
    tracer, _, gm = check_trace(
        Pooled(),
        {"x": torch.randn(2, 3, 4, 5)},
        {"x": {2: "h", 3: "w"}},
        [{"x": torch.randn(2, 3, *size)} for size in [(1, 1), (1, 7), (3, 1), (0, 4)]],
    )
    assert tracer.constraints == [] and len(tracer.versions) == 2


def test_every_needed_constraint_is_listed_once():
    class Two(torch.nn.Module):
        def forward(self, x, y):
            z = x + y  # a == b
            if z.shape[1] > 8:
                return z
            return -z

    with pytest.raises(StrictDimensionError) as info:
        trace_module(
            Two(),
            {"x": torch.randn(3, 4), "y": torch.randn(3, 4)},
            {"x": {0: Dim("a"), 1: Dim("n")}, "y": {0: Dim("b"), 1: Dim("n")}},
        )
    kinds = sorted(c.kind for c, _ in info.value.needed)
    assert kinds == ["range", "relation"]
    text = str(info.value)
    assert "2 found" in text and text.count("fix:") == 2


def test_specialize_undecidable_adopts_for_named_dims():
    tracer, _, _ = trace_module(
        Positions(),
        {"x": torch.randn(2, 7, 4)},
        {"x": {1: Dim("seq")}},
        tracer_kwargs={"specialize_undecidable": True},
    )
    assert _kinds(tracer) == [("seq <= 128", "range")]


# default lower bounds: checked only where a decision relies on them


class EmptyOrOne(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] == 0:
            return x
        if x.shape[1] > 1:
            return x * 2
        return x


def test_default_lower_bound_is_checked_only_where_needed():
    tracer, _, gm = check_trace(
        EmptyOrOne(),
        {"x": torch.randn(3, 5)},
        {
            "x": {
                0: "batch",
                1: "seq",
            }
        },
        [{"x": torch.randn(1, 4)}],
        tracer_kwargs={"narrowing": "constraints"},
    )
    assert _kinds(tracer) == [("batch >= 1", "range"), ("seq >= 2", "range")]
    with pytest.raises(ConstraintViolationError, match="batch >= 1"):
        gm(torch.randn(0, 5))
    with pytest.raises(ConstraintViolationError, match="seq >= 2"):
        gm(torch.randn(3, 1))

    class Plain(torch.nn.Module):
        def forward(self, x):
            return x * 2

    tracer, _, gm = check_trace(
        Plain(), {"x": torch.randn(3, 5)}, {"x": {0: "batch"}}, [{"x": torch.randn(1, 5)}]
    )
    assert tracer.constraints == []
    assert gm(torch.randn(0, 5)).shape == (0, 5)


def test_sides_below_the_default_minimum_become_versions():
    # a decision the default range [2, inf] settles (`x.shape[0] == 0 -> False`,
    # `x.shape[1] > 1 -> True`) has its other side at 0 or 1: captured as versions,
    # no constraint refuses an empty batch or a single token
    x = torch.randn(3, 5)
    sizes = [(0, 5), (3, 1), (1, 1), (0, 0), (1, 0), (0, 1), (2, 2)]
    tracer, _, gm = check_trace(
        EmptyOrOne(),
        {"x": x},
        {"x": {0: "batch", 1: "seq"}},
        [{"x": torch.randn(*size)} for size in sizes],
    )
    assert tracer.constraints == [] and tracer.version_notes == []
    assert [re.sub(r"\s+\[[^]]*\]", "", str(v)) for v in tracer.versions] == [
        "version 1: batch >= 1 and seq >= 2",
        "version 2: batch >= 1 and seq < 2",
        "version 3: batch < 1",
    ]


def test_declared_bounds_and_shared_dimensions_are_checked():
    class Add(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    shapes = {"x": {0: Dim("batch", min=2, max=8)}, "y": {0: Dim("batch", min=2, max=8)}}
    _, _, gm = check_trace(
        Add(),
        {"x": torch.randn(3, 2), "y": torch.randn(3, 2)},
        shapes,
        [{"x": torch.randn(8, 2), "y": torch.randn(8, 2)}],
    )
    with pytest.raises(ConstraintViolationError, match="batch <= 8"):
        gm(torch.randn(9, 2), torch.randn(9, 2))
    with pytest.raises(ConstraintViolationError, match=r"y.size\(0\) == batch"):
        gm(torch.randn(4, 2), torch.randn(5, 2))


def test_a_declared_minimum_of_one_is_checked():
    # `batch >= 1` was built on the ShapeEnv's positive symbol, which sympy folds to
    # True: the graph, whose decision `batch != 0` the declared range settled, ran at
    # batch 0 and returned zeros where eager returns 5
    class EmptyBatch(torch.nn.Module):
        def forward(self, x):
            if x.shape[0] != 0:
                return x.sum(0) * 2
            return x.sum(0) + 5

    _, _, gm = check_trace(
        EmptyBatch(),
        {"x": torch.randn(3, 2)},
        {"x": {0: Dim("batch", min=1)}},
        [{"x": torch.randn(1, 2)}, {"x": torch.randn(6, 2)}],
    )
    with pytest.raises(ConstraintViolationError, match="batch >= 1"):
        gm(torch.randn(0, 2))


def test_derived_dimension_is_checked():
    class Shifted(torch.nn.Module):
        def forward(self, x, y):
            return x[1:] + y

    n = Dim("n")
    _, _, gm = check_trace(
        Shifted(),
        {"x": torch.randn(5, 2), "y": torch.randn(4, 2)},
        {"x": {0: n + 1}, "y": {0: n}},
        [{"x": torch.randn(9, 2), "y": torch.randn(8, 2)}],
    )
    with pytest.raises(ConstraintViolationError):
        gm(torch.randn(9, 2), torch.randn(4, 2))


def test_torch_check_is_checked_when_the_graph_runs():
    class Checked(torch.nn.Module):
        def forward(self, x, y):
            torch._check(x.shape[0] >= y.shape[0])
            return x[: y.shape[0]] + y

    _, _, gm = check_trace(
        Checked(), {"x": torch.randn(5, 2), "y": torch.randn(3, 2)}, {"x": {0: "n"}, "y": {0: "m"}}
    )
    with pytest.raises(ConstraintViolationError, match=r"torch._check\(n >= m\)"):
        gm(torch.randn(2, 2), torch.randn(3, 2))


# the checks in the graph


def test_checks_survive_recompile_printing_and_pickling():
    _, graph, gm = check_trace(MaskedStep(), _step_inputs(2, 3, 5), _STEP_SHAPES)
    assert "check_constraint" in gm.code and "total == past + seq" in str(graph)
    gm.recompile()
    clone = pickle.loads(pickle.dumps(gm))
    with pytest.raises(ConstraintViolationError):
        clone(**{**_step_inputs(2, 3, 5), "mask": torch.rand(2, 9)})
    # dead-code elimination keeps them: they have a side effect
    graph.eliminate_dead_code()
    assert any(n.target is check_constraint for n in graph.nodes)


def test_runtime_checks_can_be_turned_off():
    tracer = CustomTracer(runtime_checks=False)
    graph = tracer.trace(
        Positions(), concrete_args={"x": torch.randn(2, 7, 4)}, dynamic_shapes={"x": {1: "seq"}}
    )
    assert [c.expression for c in tracer.constraints] == ["seq <= 128"]
    assert not any(n.target is check_constraint for n in graph.nodes)


def test_checks_retrace_with_symbolic_trace():
    _, _, gm = check_trace(MaskedStep(), _step_inputs(2, 3, 5), _STEP_SHAPES)
    again = torch.fx.symbolic_trace(gm)
    assert sum(n.target is check_constraint for n in again.graph.nodes) >= 1
    with pytest.raises(ConstraintViolationError):
        again(**{**_step_inputs(2, 3, 5), "mask": torch.rand(2, 9)})


# errors


class ValueBranch(torch.nn.Module):
    def forward(self, x):
        if x.sum().item() > 0:
            return x
        return -x


def test_branch_on_a_tensor_value_names_the_line_and_suggests_cond():
    with pytest.raises(DataDependentError) as info:
        trace_module(ValueBranch(), {"x": torch.randn(3, 2)}, {"x": {0: "batch"}})
    message = str(info.value)
    assert info.value.location.startswith(__file__)
    assert "depends on tensor values" in message
    assert "torch.cond" in message and "torch.where" in message


class Lengths(torch.nn.Module):
    def forward(self, x):
        n = len(x)
        return x.reshape(n, -1) / n


def test_len_stays_symbolic():
    tracer, graph, _ = check_trace(
        Lengths(), {"x": torch.randn(4, 3, 2)}, {"x": {0: "n"}}, [{"x": torch.randn(7, 3, 2)}]
    )
    assert tracer.constraints == []
    assert len is __builtins__["len"] if isinstance(__builtins__, dict) else len is __builtins__.len


def test_no_warning_for_a_clean_trace():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_trace(Lengths(), {"x": torch.randn(4, 3, 2)}, {"x": {0: "n"}})


def test_graph_checks_the_static_sizes_it_was_traced_with():
    # a static dimension is baked into the graph (x[:, :4] for x[:, : x.shape[1] - 1]):
    # another size would give another result than eager, so the graph refuses it
    class Trim(torch.nn.Module):
        def forward(self, x):
            return x[:, : x.shape[1] - 1] * 2

    tracer = CustomTracer()
    graph = tracer.trace(
        Trim(), concrete_args={"x": torch.randn(3, 5)}, dynamic_shapes={"x": {0: "b"}}
    )
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    for batch in (2, 7):
        x = torch.randn(batch, 5)
        torch.testing.assert_close(gm(x), Trim()(x))
    with pytest.raises(ConstraintViolationError, match=r"x.size\(1\) == 5 \(static\)"):
        gm(torch.randn(2, 7))
    # another rank: x.shape[-1] is another dimension (eager would slice the last one)
    with pytest.raises(ConstraintViolationError, match=r"x.dim\(\) == 2 \(static\)"):
        gm(torch.randn(2, 5, 3))


# the same decision in every layer: proved once, relied on in each


class RepeatedDecision(torch.nn.Module):
    """Each block asks ``seq > 1`` (an attention choosing its causal path), then a
    ``torch._check`` narrows the range between two blocks."""

    def forward(self, x):
        for block in range(4):
            if x.shape[1] > 1:
                x = x * 2
            else:
                x = x + 1
            if block == 1:
                torch._check(x.shape[1] <= 64)
        return x


def test_a_decision_repeated_in_every_layer_is_relied_on_once_and_checked():
    tracer, _, gm = check_trace(
        RepeatedDecision(),
        {"x": torch.randn(2, 7, 4)},
        {"x": {0: "batch", 1: "seq"}},
        [{"x": torch.randn(3, 2, 4)}, {"x": torch.randn(1, 64, 4)}],
        tracer_kwargs={"narrowing": "constraints"},
    )
    # each decision is recorded where it is made; the constraint it needs, once
    decisions = [g for g in tracer.guards if g.expression == "seq > 1"]
    assert len(decisions) == 4 and all(g.value is True for g in decisions)
    assert ("seq >= 2", "range") in _kinds(tracer)
    assert len([c for c in tracer.constraints if c.expression == "seq >= 2"]) == 1
    with pytest.raises(ConstraintViolationError, match="seq >= 2"):
        gm(torch.randn(2, 1, 4))
    with pytest.raises(ConstraintViolationError, match="seq <= 64"):
        gm(torch.randn(2, 65, 4))
    # by default, the side seq == 1 is a version: one, however many layers ask
    tracer, _, gm = check_trace(
        RepeatedDecision(),
        {"x": torch.randn(2, 7, 4)},
        {"x": {0: "batch", 1: "seq"}},
        [{"x": torch.randn(3, 1, 4)}, {"x": torch.randn(1, 64, 4)}, {"x": torch.randn(2, 0, 4)}],
    )
    # and the side seq == 0 below the version captured at 1
    assert [v.when for v in tracer.versions] == [
        "(seq >= 2)",
        "(seq < 2) and (seq >= 1)",
        "(seq < 2) and (seq < 1)",
    ]
    with pytest.raises(ConstraintViolationError, match="seq <= 64"):
        gm(torch.randn(2, 65, 4))


# a constraint whose expression has exact fractions under a min (found by fuzz_tracing)


class HalfOfAHalf(torch.nn.Module):
    def forward(self, y):
        half = y[..., : min(y.shape[1] // 2, 7)]
        if half.shape[-1] % 2 != 0:
            half = torch.nn.functional.pad(half, (0, 1))
        return half[..., : half.shape[1] // 2] * 2


def test_a_check_with_fractions_under_a_min_runs():
    # `min(7, length/2 - (length % 2)/2) % 2 == 0`: the runtime check computed
    # the fractions exactly, then torch.sym_min refused them (an AssertionError for
    # every input, the example included)
    tracer, _, gm = check_trace(
        HalfOfAHalf(),
        {"y": torch.randn(2, 8)},
        {"y": {1: "length"}},
        [{"y": torch.randn(2, 12)}, {"y": torch.randn(2, 4)}],
        tracer_kwargs=CONSTRAINTS,
    )
    assert any("min(" in c.expression and "/2" in c.expression for c in tracer.constraints)
    with pytest.raises(ConstraintViolationError, match="% 2 == 0"):
        gm(torch.randn(2, 10))


class ChunkCounts(torch.nn.Module):
    """Numbers of chunks of dynamic lengths (fuzz_tracing seed 9435): torch's guard on
    the pieces of ``x.chunk(4, 1)`` is ``(dim + ceil(dim/4) - 1) // ceil(dim/4) == 4``,
    a division by 0 at ``dim = 0``."""

    def forward(self, x):
        t1 = x * len(x.chunk(4, 1))
        p2, q3 = t1.split([t1.shape[1] // 2, t1.shape[1] - t1.shape[1] // 2], 1)
        t4 = p2.sum(1, keepdim=True) + q3
        t5 = t1 * len(t1.chunk(2, 0))
        t6 = t4.reshape(int(t4.shape[0]), -1)
        t9 = torch.cat(t1.split(2, 1), 1)
        return torch.cat([t9, t9[:1]], 0), t5 + x, t6


def test_a_check_whose_guard_divides_by_zero_where_it_does_not_hold_passes():
    # the graph checked `seq >= 1 when (dim >= 2) and (seq < 2) and (... // ((dim + 3)//4)
    # == 4)` computing every part: ZeroDivisionError at dim = 0, where eager runs and
    # Python's short circuit stops at `dim >= 2`
    tracer, _, gm = check_trace(
        ChunkCounts(),
        {"x": torch.randn(7, 8)},
        {"x": {0: "seq", 1: "dim"}},
        [{"x": torch.randn(7, 0)}, {"x": torch.randn(1, 0)}, {"x": torch.randn(7, 13)}],
    )
    assert any("//4" in c.when for c in tracer.constraints), tracer.constraints


def test_a_condition_computed_in_python_counts_an_undefined_conjunct_as_false():
    # what the versions' witness search and the ONNX model's checks compute, in Python
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    from yobx.torch.tracing.constraints.size_search import compile_condition, holds

    n, m = sympy.Symbol("n", integer=True), sympy.Symbol("m", integer=True)
    guard = sympy.And(sympy.Ge(n, 2), sympy.Eq(FloorDiv(m, FloorDiv(n + 3, 4)), 4))
    check = compile_condition(sympy.Or(sympy.Ge(n, 6), sympy.Not(guard)), (n, m))
    assert holds(check, (0, 8))  # (n + 3) // 4 is 0, where n >= 2 does not hold
    assert not holds(check, (5, 8))  # the guard holds, the body does not
    assert holds(check, (5, 10)) and holds(check, (6, 8))
    # whatever the order of the conjuncts (sympy prints a division's last, where
    # Python's own `and` stops first): false where one is false, undefined where none is
    from yobx.torch.tracing.constraints import size_search

    assert size_search._all_defined(lambda: 1 // 0 == 4, lambda: False) is False
    with pytest.raises(ZeroDivisionError):
        size_search._all_defined(lambda: 1 // 0 == 4, lambda: True)
    # outside any `and`/`or`, a division by zero still fails the check
    assert not holds(
        compile_condition(sympy.Eq(FloorDiv(m, FloorDiv(n + 3, 4)), 0), (n, m)), (0, 1)
    )
