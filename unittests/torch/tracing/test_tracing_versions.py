"""Never narrow: an undecided decision on dynamic dimensions gets both sides captured
(versions), and the graph chooses between them from the input sizes."""

import itertools
import re

import pytest
import torch
from torch.export import Dim

from yobx.torch.tracing import (
    ConstraintViolationError,
    CustomTracer,
    SpecializationError,
    StrictDimensionError,
)
from yobx.torch.tracing.constraints import versions

from ._helpers import MaskOrToken, assert_same, trace_module


def _check_sizes(model, gm, make, sizes):
    """The graph matches eager at every size (eager accepts them all)."""
    for size in sizes:
        x = make(size)
        assert_same(model(x.clone()), gm(x.clone()))


class Long(torch.nn.Module):
    def forward(self, x):
        if x.shape[2] > 16:
            return x.sum(dim=2) * 2
        return x.mean(dim=2) + 1


def test_both_sides_of_a_range_decision_are_exact():
    model = Long()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attributes = set(vars(model))
    tracer, graph, gm = trace_module(model, {"x": torch.randn(2, 3, 8)}, {"x": {0: "b", 2: "seq"}})
    assert [v.when for v in tracer.versions] == ["(seq <= 16)", "(seq > 16)"]
    assert all(__file__ in c.location for v in tracer.versions for c in v.conditions)
    assert tracer.constraints == [] and tracer.version_notes == []
    assert "version 2: seq > 16" in str(tracer.versions[1])
    _check_sizes(model, gm, lambda s: torch.randn(3, 3, s), [2, 5, 16, 17, 18, 40])
    # each version's own graph is runnable on its side
    x = torch.randn(2, 3, 30)
    assert_same(model(x), tracer.versions[1].graph_module(x))
    # the user's module is not mutated by the versions
    assert set(vars(model)) == attributes
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


class SqueezeAndCompare(torch.nn.Module):
    def forward(self, x, y):
        if x.shape[0] > y.shape[1]:
            x = x + 1
        else:
            x = x * 3
        # one axis less where x.shape[0] == 1: no ONNX choice returns both ranks
        return x.squeeze(0)


def test_versions_returning_other_ranks_are_versions_of_the_traced_graph():
    # the traced graph chooses between versions of any rank (squeeze(0) at one row);
    # the ONNX export keeps that side a constraint (test_onnx_versions), not this graph
    model = SqueezeAndCompare()
    inputs = {"x": torch.randn(4, 3), "y": torch.randn(2, 5)}
    tracer, _, gm = trace_module(model, inputs, {"x": {0: "width"}, "y": {1: "heads"}})
    assert len(tracer.versions) == 4 and tracer.constraints == []
    for width, heads in ((1, 4), (4, 5), (7, 3), (1, 2)):
        x, y = torch.randn(width, 3), torch.randn(2, heads)
        assert_same(model(x, y), gm(x, y))


class Square(torch.nn.Module):
    def forward(self, x):
        if x.shape[2] == x.shape[3]:
            return x * 2
        return x.sum(dim=2, keepdim=True) + x


def test_both_sides_of_a_relation_are_exact():
    model = Square()
    tracer, _, gm = trace_module(
        model, {"x": torch.randn(2, 3, 5, 5)}, {"x": {0: "b", 2: "h", 3: "w"}}
    )
    assert [v.when for v in tracer.versions] == ["(h == w)", "(h != w)"]
    _check_sizes(
        model, gm, lambda s: torch.randn(2, 3, *s), [(4, 4), (6, 6), (4, 7), (9, 3), (5, 6)]
    )


class Quarters(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] % 4 == 0:
            return x.view(x.shape[0], -1, 4).sum(-1)
        return x * 3


def test_both_sides_of_a_divisibility_are_exact():
    model = Quarters()
    tracer, _, gm = trace_module(model, {"x": torch.randn(2, 8)}, {"x": {0: "b", 1: "n"}})
    assert [v.when for v in tracer.versions] == ["(n % 4 == 0)", "(n % 4 != 0)"]
    _check_sizes(model, gm, lambda s: torch.randn(3, s), [4, 12, 16, 5, 7, 10])


class Nested(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] > 8:
            if x.shape[1] > 16:
                return x * 3
            return x * 2
        return x + 1


def test_nested_decisions_give_nested_choices():
    model = Nested()
    tracer, graph, gm = trace_module(model, {"x": torch.randn(2, 4)}, {"x": {0: "b", 1: "n"}})
    assert [v.when for v in tracer.versions] == [
        "(n <= 8)",
        "(n > 8) and (n <= 16)",
        "(n > 8) and (n > 16)",
    ]
    _check_sizes(model, gm, lambda s: torch.randn(3, s), [2, 5, 8, 9, 12, 16, 17, 40])


class Table(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(32, 4))

    def forward(self, x):
        if x.shape[1] > 8:
            return x + self.table[: x.shape[1]] * 2
        return x + self.table[: x.shape[1]]


def test_a_side_where_eager_raises_stays_a_constraint():
    model = Table()
    tracer, _, gm = trace_module(model, {"x": torch.randn(2, 4, 4)}, {"x": {0: "b", 1: "n"}})
    assert [v.when for v in tracer.versions] == ["(n <= 8)", "(n > 8)"]
    # past the table, eager raises: no graph can do better, the limit is the model's
    assert [str(c).split("  [")[0] for c in tracer.constraints] == ["n <= 32 (range)"]
    assert tracer.constraints[0].when == "(n > 8)"
    assert any("eager raises for n=33" in note for note in tracer.version_notes)
    _check_sizes(model, gm, lambda s: torch.randn(3, s, 4), [2, 5, 8, 9, 12, 32])
    with pytest.raises(ConstraintViolationError, match="n <= 32"):
        gm(torch.randn(3, 33, 4))


def test_the_versions_are_the_same_on_a_slow_machine(monkeypatch):
    # the budget is a count: a clock running a thousand seconds per reading (a slow
    # machine, a loaded one) gives the versions a fast one gives
    inputs = {"x": torch.randn(2, 3, 4), "mask": torch.ones(2, 3)}
    dynamic = {"x": {0: "b", 1: "seq"}, "mask": {0: "b", 1: "total"}}
    fast, _, _ = trace_module(MaskOrToken(), inputs, dynamic)
    ticks = itertools.count(step=1000.0)
    monkeypatch.setattr(versions.time, "perf_counter", lambda: float(next(ticks)))
    slow, _, gm = trace_module(MaskOrToken(), inputs, dynamic)
    monkeypatch.undo()
    assert [v.when for v in slow.versions] == [v.when for v in fast.versions]
    assert [v.when for v in fast.versions] == [
        "(total <= seq) and (seq != 1)",
        "(seq == 1) and (total <= 1)",
        "(seq == 1) and (total > 1)",
        "(total > seq) and (seq != 1)",
        "(total > seq) and (seq == 1)",
    ]
    assert not any("time budget" in n for n in slow.version_notes)
    for seq, total in ((1, 1), (1, 5), (3, 3), (4, 7), (2, 2)):
        x, mask = torch.randn(2, seq, 4), torch.rand(2, total)
        assert_same(MaskOrToken()(x.clone(), mask), gm(x.clone(), mask))


def test_a_single_token_comes_before_a_relation_between_sizes():
    # with room for one more version, the side every decode step takes (one token) is
    # captured, not the one only an odd caller takes (a mask longer than the sequence),
    # although the trace met that one first; declared from 1, the single token is a
    # decision of the model's, not one the default range settled
    inputs = {"x": torch.randn(2, 3, 4), "mask": torch.ones(2, 3)}
    dynamic = {"x": {0: "b", 1: Dim.DYNAMIC(min=1)}, "mask": {0: "b", 1: Dim.DYNAMIC(min=1)}}
    tracer, _, gm = trace_module(MaskOrToken(), inputs, dynamic, tracer_kwargs={"max_versions": 2})
    assert [v.when for v in tracer.versions] == ["(x_dim_1 != 1)", "(x_dim_1 == 1)"]
    # each version keeps its side of the mask's decision
    assert [c.expression for c in tracer.constraints] == [
        "mask_dim_1 <= x_dim_1",
        "mask_dim_1 <= 1",
    ]
    assert any("beyond the budget of 2 versions" in n for n in tracer.version_notes)
    for seq, total in ((1, 1), (3, 3), (5, 2)):
        x, mask = torch.randn(3, seq, 4), torch.rand(3, total)
        assert_same(MaskOrToken()(x.clone(), mask), gm(x.clone(), mask))


def test_budgets_and_the_old_behaviour():
    x = {"x": torch.randn(2, 4)}
    dynamic = {"x": {0: "b", 1: "n"}}
    tracer, _, gm = trace_module(Nested(), x, dynamic, tracer_kwargs={"max_versions": 2})
    assert len(tracer.versions) == 2
    assert any("beyond the budget of 2 versions" in n for n in tracer.version_notes)
    # the other side was captured at the nearest size (n=9), which is not past 16
    assert [c.expression for c in tracer.constraints] == ["n <= 16"]
    assert tracer.constraints[0].when == "(n > 8)"
    with pytest.raises(ConstraintViolationError, match="n <= 16"):
        gm(torch.randn(3, 20))
    _check_sizes(Nested(), gm, lambda s: torch.randn(3, s), [2, 8, 9, 16])
    tracer, _, _ = trace_module(Nested(), x, dynamic, tracer_kwargs={"version_seconds": 0})
    assert tracer.versions == []
    assert any("time budget" in n for n in tracer.version_notes)
    # narrowing="constraints": the example's side only
    tracer, _, gm = trace_module(
        Long(),
        {"x": torch.randn(2, 3, 8)},
        {"x": {2: "seq"}},
        tracer_kwargs={"narrowing": "constraints"},
    )
    assert tracer.versions == []
    assert [c.expression for c in tracer.constraints] == ["seq <= 16"]
    with pytest.raises(ConstraintViolationError, match="seq <= 16"):
        gm(torch.randn(2, 3, 17))
    # a named Dim stays strict
    with pytest.raises(StrictDimensionError):
        trace_module(Long(), {"x": torch.randn(2, 3, 8)}, {"x": {2: Dim("seq")}})
    with pytest.raises(ValueError, match="narrowing must be one of"):
        CustomTracer(narrowing="both")


class SizeOutput(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] > 4:
            return x.sum(1), x.shape[1] * 2
        return x.mean(1), 8


def test_a_size_computed_on_one_side_and_constant_on_the_other():
    """The model returns a size on one side and a number on the other: one graph."""
    model = SizeOutput()
    tracer, _, gm = trace_module(model, {"x": torch.randn(2, 3)}, {"x": {1: "n"}})
    assert [v.when for v in tracer.versions] == ["(n <= 4)", "(n > 4)"]
    for n in (2, 4, 5, 9):
        x = torch.randn(2, n)
        expected, got = model(x), gm(x)
        assert_same(expected[0], got[0])
        assert got[1] == expected[1] and isinstance(got[1], int)


def test_a_check_implied_by_its_version_conditions_is_dropped():
    """``(h//8)**2 + 1 == 17`` where ``h == w`` and ``(h//8)*(w//8) == 16``: no size
    breaks it (validation could not exercise it), the version's choice checks it."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Max

    from yobx.torch.tracing.constraints.versions import implied_by

    h, w = sympy.symbols("h w", integer=True)
    patches = FloorDiv(h, 8) * FloorDiv(w, 8)
    square = sympy.And(sympy.Eq(patches, 16), sympy.Eq(h, w))
    assert implied_by(sympy.Eq(FloorDiv(h, 8) ** 2 + 1, 17), square)
    not_square = sympy.And(sympy.Eq(patches, 16), sympy.Ne(h, w))
    product = Max(1, FloorDiv(h, 8)) * Max(1, FloorDiv(w, 8))
    assert implied_by(sympy.Ne(product, 1), not_square)
    # not implied: another value, or factors that may be negative
    assert not implied_by(sympy.Eq(FloorDiv(h, 8) ** 2 + 1, 18), square)
    shifted = sympy.Eq((h - 10) * (w - 10), 16)
    assert not implied_by(sympy.Ne(Max(1, h - 10) * Max(1, w - 10), 1), shifted)
    # a decision as the model wrote it, linear in one size: solved for it
    assert implied_by(sympy.Le(h, 40), sympy.Eq(h + 2, 5))
    assert not implied_by(sympy.Le(h, 2), sympy.Eq(h + 2, 5))
    assert not implied_by(sympy.Le(h, 40), sympy.Eq(2 * h, 5))  # no integer solution


def test_position_interpolation_is_exact_on_every_side_without_constraints():
    """ViT interpolates its position table unless the image is square with the
    example's patch count: three versions, exact at the sizes torch.export's program
    refuses; the square version's table of 17 rows, which its conditions imply, is
    neither a constraint nor a note."""
    pytest.importorskip("transformers")
    from yobx.models.architectures import build

    case = build("vit")
    tracer, _, gm = trace_module(case.model, dict(case.kwargs), case.dynamic_shapes)
    assert len(tracer.versions) == 3
    assert not any("== 17" in c.expression for c in tracer.constraints), tracer.constraints
    assert not any("== 17" in note for note in tracer.version_notes), tracer.version_notes
    for sizes in [*case.stress_sizes, {"height": 40, "width": 24}]:
        inputs = case.inputs_at(sizes)
        with torch.no_grad():
            assert_same(case.model(**inputs), gm(**inputs), atol=1e-4, rtol=1e-4)


class Three(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] + 2 == 5:
            return x * 2
        elif x.shape[1] == 5:
            return x + 10
        return x - 1


def test_a_decision_fixing_the_example_size_gets_versions():
    """``d + 2 == 5`` holds at the example (d=3) and would make ``d`` a constant: the
    model is captured from another size, and d=3 and d=5 become versions where ``d``
    is a constant."""
    model = Three()
    tracer, _, gm = trace_module(model, {"x": torch.randn(2, 3)}, {"x": {0: "b", 1: "d"}})
    assert sorted(v.when for v in tracer.versions) == [
        "(d + 2 != 5) and (d != 5)",
        "(d + 2 != 5) and (d == 5)",
        "(d + 2 == 5)",
    ]
    assert tracer.constraints == []
    _check_sizes(model, gm, lambda s: torch.randn(2, s), [2, 3, 4, 5, 6, 11])
    # narrowing="constraints" keeps the error (the dimension would be a constant)
    with pytest.raises(SpecializationError, match="d == 3"):
        trace_module(
            model,
            {"x": torch.randn(2, 3)},
            {"x": {1: "d"}},
            tracer_kwargs={"narrowing": "constraints"},
        )


class Broadcast(torch.nn.Module):
    def forward(self, x, y):
        if x.shape[1] == 1:
            x = x.expand(-1, y.shape[1])
        return x + y


def test_a_size_one_example_of_a_broadcast_gets_the_other_side():
    """``if x.shape[1] == 1`` with the example at 1: eager refuses ``d=2`` next to
    ``e=4``, the search moves both sizes until eager runs (d == e)."""
    model = Broadcast()
    dynamic = {"x": {1: Dim.DYNAMIC(min=1)}, "y": {1: "e"}}
    tracer, _, gm = trace_module(model, {"x": torch.randn(2, 1), "y": torch.randn(2, 4)}, dynamic)
    assert sorted(v.when for v in tracer.versions) == ["(x_dim_1 != 1)", "(x_dim_1 == 1)"]
    for d, e in [(1, 4), (1, 7), (4, 4), (7, 7)]:
        x, y = torch.randn(2, d), torch.randn(2, e)
        assert_same(model(x, y), gm(x, y))
    with pytest.raises(ConstraintViolationError, match="x_dim_1 == e"):
        gm(torch.randn(2, 3), torch.randn(2, 4))


class Fixed(torch.nn.Module):
    def forward(self, x):
        return x + torch.ones(3)


def test_a_size_eager_needs_stays_a_specialization_error():
    """Eager itself fails at every other size: the dimension is a constant, and the
    error says so."""
    with pytest.raises(SpecializationError, match="always 3"):
        trace_module(Fixed(), {"x": torch.randn(2, 3)}, {"x": {1: "d"}})


class ContiguousWhenHuge(torch.nn.Module):
    """diffusers' upsampling: a copy past a number of elements (a kernel's limit)."""

    def forward(self, x):
        if x.shape[0] * x.shape[1] > 100_000:
            x = x.contiguous()
        return x * 2


def test_a_side_needing_gigabytes_of_inputs_stays_a_constraint():
    # the other side needs inputs of gigabytes: not allocated, the decision stays a
    # constraint (it used to allocate them, 25 GB for AutoencoderKLFlux2)
    model = ContiguousWhenHuge()
    tracer, _, gm = trace_module(model, {"x": torch.randn(2, 8, 1024)}, {"x": {0: "b", 1: "h"}})
    assert any("more than the 256 MB" in note for note in tracer.version_notes), (
        tracer.version_notes
    )
    assert len(tracer.constraints) == 1
    _check_sizes(model, gm, lambda s: torch.randn(s, s + 1, 1024), [1, 3, 17])


class EmptyOrNot(torch.nn.Module):
    """A branch on a dynamic size (two versions), then one on an empty tensor: every
    version adopts that ``x`` is not empty (``batch >= 1``, ``past >= 1``)."""

    def forward(self, x, y):
        z = y.sum(dim=0) * 2 if y.shape[0] > 4 else y.sum(dim=0) - 1
        if x.numel() == 0:
            return z + 1
        return z + x.shape[2]


def test_a_check_on_an_empty_size_shared_by_every_version_is_kept():
    # `batch >= 1` folded to True on the joined graph's symbols (sizes are positive
    # for sympy), so the joined graph dropped the check, then computed the non-empty
    # branch on empty inputs: silently wrong at batch=0 or past=0. With a budget of two
    # versions, some empty sides stay checks: every input is refused by a check or
    # exact, never wrong
    model = EmptyOrNot()
    tracer, _, gm = trace_module(
        model,
        {"x": torch.randn(2, 4, 3), "y": torch.randn(5, 3)},
        {"x": {0: "batch", 2: "past"}, "y": {0: "n"}},
        tracer_kwargs={"max_versions": 2},
    )
    assert len(tracer.versions) == 2
    # the check one version needs, kept in the joined graph with its version's condition
    assert any(re.match(r"(batch|past) >= 1 when", c.expression) for c in tracer.checks)
    refused = 0
    for batch, past, n in itertools.product((0, 1, 2), (0, 1, 3), (3, 5)):
        x, y = torch.randn(batch, 4, past), torch.randn(n, 3)
        try:
            got = gm(x, y)
        except ConstraintViolationError as e:
            assert ">= 1" in str(e) or "n >= 5" in str(e), str(e)
            refused += 1
            continue
        assert_same(model(x, y), got)
    assert refused > 0


def test_empty_sides_are_versions_of_their_own():
    # without a budget, each empty side is captured (at size 0) on each side of the
    # branch on `n`: the graph is exact on empty inputs instead of refusing them
    model = EmptyOrNot()
    tracer, _, gm = trace_module(
        model,
        {"x": torch.randn(2, 4, 3), "y": torch.randn(5, 3)},
        {"x": {0: "batch", 2: "past"}, "y": {0: "n"}},
    )
    assert tracer.constraints == [] and tracer.version_notes == []
    for batch, past, n in ((2, 3, 5), (0, 3, 5), (2, 0, 3), (0, 0, 7), (1, 1, 1), (3, 0, 0)):
        x, y = torch.randn(batch, 4, past), torch.randn(n, 3)
        assert_same(model(x, y), gm(x, y))


class PinnedAtTwo(torch.nn.Module):
    """The side ``batch < bound`` of a decision. With ``bound=3`` it is captured at
    batch 2: with the default range (from 2), batch is the constant 2 there, while 1
    and 0 take that side too. With ``bound=2`` it is captured at batch 1, the constant
    1, while 0 takes that side too (``y[:batch]`` kept one row at 0, silently)."""

    def __init__(self, bound: int = 3):
        super().__init__()
        self.bound = bound

    def forward(self, x, y):
        t = y[: x.shape[0]]
        if x.shape[0] < self.bound:
            return t * 2, x * 2
        return t - 1, x - 1


def test_a_version_pinning_a_dimension_to_two_has_versions_below_it():
    # the version computed batch 1 as batch 2 (y's 2 rows instead of 1), silently;
    # then it refused 1 and 0 with a check; the sizes below are versions of their own
    model = PinnedAtTwo()
    y = torch.randn(2, 3)
    tracer, _, gm = trace_module(
        model, {"x": torch.randn(8, 3), "y": y}, {"x": {0: "batch"}, "y": None}
    )
    assert [v.when for v in tracer.versions] == [
        "(batch >= 3)",
        "(batch < 3) and (batch >= 2)",
        "(batch < 3) and (batch < 2) and (batch >= 1)",
        "(batch < 3) and (batch < 2) and (batch < 1)",
    ]
    assert not any("when" in c.expression and ">= 2" in c.expression for c in tracer.checks)
    for batch in (8, 3, 2, 1, 0):
        x = torch.randn(batch, 3)
        assert_same(model(x, y), gm(x, y))


def test_a_version_pinning_a_dimension_checks_it_beyond_the_budget():
    # no budget left for the sizes below: the version refuses them, naming the check
    model = PinnedAtTwo()
    y = torch.randn(2, 3)
    tracer, _, gm = trace_module(
        model,
        {"x": torch.randn(8, 3), "y": y},
        {"x": {0: "batch"}, "y": None},
        tracer_kwargs={"max_versions": 2},
    )
    assert len(tracer.versions) == 2
    assert any(c.expression == "batch >= 2 when (batch < 3)" for c in tracer.checks)
    assert any("batch >= 2 when" in note for note in tracer.version_notes)
    for batch in (8, 3, 2):
        x = torch.randn(batch, 3)
        assert_same(model(x, y), gm(x, y))
    for batch in (1, 0):
        with pytest.raises(ConstraintViolationError, match="batch >= 2 when"):
            gm(torch.randn(batch, 3), y)


def test_a_version_captured_at_one_has_a_version_at_zero():
    model = PinnedAtTwo(bound=2)
    y = torch.randn(3, 3)
    tracer, _, gm = trace_module(
        model, {"x": torch.randn(8, 3), "y": y}, {"x": {0: "batch"}, "y": None}
    )
    assert [v.when for v in tracer.versions][-1] == "(batch < 2) and (batch < 1)"
    for batch in (8, 3, 2, 1, 0):
        x = torch.randn(batch, 3)
        assert_same(model(x, y), gm(x, y))


class ChunkCount(torch.nn.Module):
    """The number of pieces of ``chunk`` is ``ceil(n / ceil(n / 3))``, which torch
    computes dividing by ``ceil(n / 3)`` after deciding, from the default range, that it
    is not 0; at ``n = 0`` it is 0 and torch returns 3 empty pieces instead."""

    def forward(self, x):
        pieces = x.chunk(3, 0)
        return x * len(pieces), x.new_ones(len(pieces)), pieces[-1] + 1


def test_a_quotient_torch_decides_is_not_zero_gets_a_version_at_zero():
    # the choice between the counts divided by zero at n = 0 (ZeroDivisionError)
    model = ChunkCount()
    tracer, _, gm = trace_module(model, {"x": torch.randn(5, 3)}, {"x": {0: "n"}})
    assert any(c.expression == "n < 1" for v in tracer.versions for c in v.conditions)
    for n in (5, 0, 1, 2, 3, 4, 7, 9):
        x = torch.randn(n, 3)
        assert_same(model(x), gm(x))


class Wide(torch.nn.Module):
    """A decision on the batch whose other side starts at 4097 rows of 1024 floats
    (16 MB, 2048 times the example's 8 KB)."""

    def forward(self, x):
        if x.shape[0] > 4096:
            return x * 2
        return x + 1


def test_a_witness_much_bigger_than_the_example_is_checked_by_its_capture(monkeypatch):
    # a model's intermediate tensors grow with its inputs: diffusers' CogVideoX decoder,
    # run eagerly on its 141 MB witness, allocated 22 GB; such a side is captured on
    # fake tensors without the eager run
    from yobx.torch.tracing.constraints import witness_inputs

    rows = []
    original = witness_inputs.run_eagerly

    def counted(root, inputs, leaves):
        rows.append(leaves[0].shape[0])
        return original(root, inputs, leaves)

    monkeypatch.setattr(versions, "run_eagerly", counted)
    model = Wide()
    tracer, _, gm = trace_module(model, {"x": torch.randn(2, 1024)}, {"x": {0: "batch"}})
    assert [v.when for v in tracer.versions] == ["(batch <= 4096)", "(batch > 4096)"]
    assert rows == [], rows
    _check_sizes(model, gm, lambda n: torch.randn(n, 1024), [1, 3, 4096, 4097, 4100])
    # a witness as small as the example's inputs allow is still run eagerly (4097 rows
    # are past EAGER_SIZE too: that bound raised for this part)
    monkeypatch.setattr(witness_inputs, "EAGER_BYTES", 64 * 2**20)
    monkeypatch.setattr(witness_inputs, "EAGER_SIZE", 8192)
    tracer, _, gm = trace_module(model, {"x": torch.randn(2, 1024)}, {"x": {0: "batch"}})
    assert rows == [4097], rows
    _check_sizes(model, gm, lambda n: torch.randn(n, 1024), [3, 4097])


class _WritesIntoItsInputInOneVersion(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] % 2 != 0:
            x[: x.shape[0] // 2] += 1
        return x * 2


def test_a_version_writing_into_an_input_writes_into_it_once_after_the_choice():
    """The branches write into copies and return them; the graph writes the chosen
    value back into the caller's tensor, as eager does, at every size."""
    from yobx.torch.tracing import CustomTracer

    model = _WritesIntoItsInputInOneVersion()
    tracer = CustomTracer()
    graph = tracer.trace(
        model, concrete_args={"x": torch.randn(4, 6)}, dynamic_shapes={"x": {0: "r", 1: "c"}}
    )
    assert len(tracer.versions) == 2
    # the joined graph writes into the input; the versions write into their copies only
    assert any(n.op == "call_method" and n.target == "copy_" for n in graph.nodes)
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    for name in ("version_1", "version_2"):
        branch = getattr(gm, name).graph
        (placeholder,) = [n for n in branch.nodes if n.op == "placeholder"]
        assert [u.target for u in placeholder.users] == ["clone"], name
    for shape in [(4, 6), (5, 7), (2, 3), (3, 4)]:
        x = torch.randn(*shape)
        mine, theirs = x.clone(), x.clone()
        expected = model(theirs)
        got = gm(mine)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(mine, theirs)


class _AccumulatesThenBranches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(16))

    def forward(self, x):
        self.acc[: x.shape[0]] += x.sum(1)
        if x.shape[0] % 2:
            return x + 1
        return x * 2


def test_a_version_writing_into_a_buffer_writes_into_it_once_after_the_choice():
    """The joined graph reads the buffer and passes it to the choice; the branches
    write into a copy; the graph writes the chosen value back into the model's buffer,
    as eager does, call after call, at every size."""
    import copy

    from yobx.torch.tracing import CustomTracer

    model = _AccumulatesThenBranches()
    eager = copy.deepcopy(model)
    tracer = CustomTracer()
    graph = tracer.trace(
        model, concrete_args={"x": torch.randn(4, 3)}, dynamic_shapes={"x": {0: "n"}}
    )
    assert len(tracer.versions) == 2
    (read,) = graph.find_nodes(op="get_attr", target="acc")
    assert [u.target for u in read.users if u.op == "call_method"] == ["copy_"]
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    for name in ("version_1", "version_2"):
        branch = getattr(gm, name).graph
        assert not branch.find_nodes(op="get_attr", target="acc"), name
    for rows in [4, 5, 2, 1, 7, 16]:
        x = torch.randn(rows, 3)
        torch.testing.assert_close(gm(x), eager(x))
        torch.testing.assert_close(model.acc, eager.acc)
    assert model.acc.abs().sum() > 0


class _WritesThenReadsAView(torch.nn.Module):
    def forward(self, x, y):
        x += 1
        if x.shape[1] % 2:
            return x + y
        return x * y


def test_versions_writing_into_an_input_another_views_are_not_joined():
    """Called as ``f(x, x[1])``, eager's ``y`` sees the write into ``x``; a version
    would write into a copy of ``x``: the capture keeps the example's version, exact
    on aliased inputs, refusing the other side, and says why. Inputs sharing no memory
    get both versions."""
    from yobx.torch.tracing import ConstraintViolationError, CustomTracer

    model = _WritesThenReadsAView()
    dims = {"x": {0: "r", 1: "c"}, "y": {0: "c"}}

    def aliased(rows, cols):
        x = torch.randn(rows, cols)
        return x, x[1]

    tracer = CustomTracer()
    graph = tracer.trace(model, concrete_args=dict(zip("xy", aliased(4, 6))), dynamic_shapes=dims)
    assert tracer.versions == []
    assert any("shares memory with 'y'" in note for note in tracer.version_notes)
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    for rows in (4, 2):
        mine = aliased(rows, 6)
        x = mine[0].clone()
        torch.testing.assert_close(gm(*mine), model(x, x[1]))
        torch.testing.assert_close(mine[0], x)
    with pytest.raises(ConstraintViolationError, match="c % 2"):
        gm(*aliased(4, 7))

    tracer = CustomTracer()
    x = torch.randn(4, 6)
    graph = tracer.trace(model, concrete_args={"x": x, "y": x[1].clone()}, dynamic_shapes=dims)
    assert len(tracer.versions) == 2


class _TiedBuffersWritesIntoItsInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        weight = torch.randn(6)
        self.register_buffer("w", weight)
        self.register_buffer("tied", weight.view(2, 3))

    def forward(self, x):
        if x.shape[0] % 2:
            x[: x.shape[0] // 2] += 1
        return x * self.w + self.tied.sum()


def test_tensors_sharing_memory_that_no_version_writes_into_keep_the_versions():
    """Tied weights (two attributes on one storage) are read only: the versions
    writing into the input are joined, exact at every size."""
    from yobx.torch.tracing import CustomTracer

    model = _TiedBuffersWritesIntoItsInput()
    tracer = CustomTracer()
    graph = tracer.trace(
        model, concrete_args={"x": torch.randn(4, 6)}, dynamic_shapes={"x": {0: "r"}}
    )
    assert len(tracer.versions) == 2, tracer.version_notes
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    for rows in (4, 5, 2):
        x = torch.randn(rows, 6)
        mine, theirs = x.clone(), x.clone()
        torch.testing.assert_close(gm(mine), model(theirs))
        torch.testing.assert_close(mine, theirs)


class _ReturnsTheBufferItWrites(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.linspace(-1, 1, 6))

    def forward(self, x):
        torch.relu_(self.acc)
        self.acc.add_(0.5)
        return x.chunk(2, 0)[0] * 2, self.acc


@pytest.mark.parametrize("remove_inplace", [False, True])
def test_versions_returning_the_buffer_they_write_into(remove_inplace):
    """``return self.acc`` after writing into it: every branch returns the buffer's new
    value (read from the branch's input standing for it), call after call; also when
    the writes stay in place (the branch's output read the attribute, then removed)."""
    import copy

    from yobx.torch.tracing import CustomTracer

    model = _ReturnsTheBufferItWrites()
    eager = copy.deepcopy(model)
    tracer = CustomTracer()
    graph = tracer.trace(
        model,
        concrete_args={"x": torch.randn(5, 6)},
        dynamic_shapes={"x": {0: "n"}},
        remove_inplace=remove_inplace,
    )
    assert len(tracer.versions) >= 2
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    for rows in [5, 4, 1, 7]:
        x = torch.randn(rows, 6)
        got, expected = gm(x), eager(x)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(model.acc, eager.acc)


class _SliceAndItsSize(torch.nn.Module):
    def forward(self, x):
        first = x[0:2]
        return first * 2, first.shape[0] + 0


def test_a_slice_clamped_below_the_default_range_and_its_size():
    """``x[0:2]`` has 2 rows from n = 2 on, 1 at n = 1: torch decides it from the
    default range, the decision gets a version; the number of rows, a constant in each
    version, is each version's own (it was 2 everywhere)."""
    model = _SliceAndItsSize()
    tracer, _, gm = trace_module(model, {"x": torch.randn(8, 3)}, {"x": {0: "n"}})
    assert len(tracer.versions) >= 2
    for rows in (8, 3, 2, 1, 0):
        x = torch.randn(rows, 3)
        got, expected = gm(x), model(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1], rows


class _OnePiece(torch.nn.Module):
    def forward(self, x):
        return x.split(2)[1] + x.unbind(0)[-1]


def test_one_piece_of_a_split_is_computed_alone():
    """``x.split(2)[1]`` and ``x.unbind(0)[-1]`` are computed alone (the number of
    pieces is not fixed to the example's: the size was refused as a specialization),
    exact where eager runs, refused where eager raises (the piece does not exist)."""
    from yobx.torch.tracing import ConstraintViolationError

    model = _OnePiece()
    tracer, _, gm = trace_module(model, {"x": torch.randn(8, 3)}, {"x": {0: "n"}})
    for rows in (8, 5, 4, 3):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(gm(x), model(x))
    for rows in (2, 1):
        with pytest.raises(IndexError):
            model(torch.randn(rows, 3))
        with pytest.raises(ConstraintViolationError):
            gm(torch.randn(rows, 3))


class _PieceAfterTheFirst(torch.nn.Module):
    def forward(self, x):
        return x.flatten().split(2, -1)[1:][1] * 2


def test_a_piece_of_the_tail_of_a_split_is_computed_alone():
    """``pieces[1:][1]`` (fuzz_passes seed 70193) is piece 2 computed alone: slicing
    the pieces made them for real, and their number refused the dynamic rows as a
    specialization, where torch.export captures the model."""
    from yobx.torch.tracing import ConstraintViolationError

    model = _PieceAfterTheFirst()
    tracer, _, gm = trace_module(model, {"x": torch.randn(5, 3)}, {"x": {0: "rows"}})
    for rows in (5, 2, 9):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(gm(x), model(x))
    with pytest.raises(IndexError):
        model(torch.randn(1, 3))
    with pytest.raises(ConstraintViolationError):
        gm(torch.randn(1, 3))


class NestedLargeSides(torch.nn.Module):
    """Two decisions on the batch: the second is met inside the version of the first,
    whose example (3001 rows of 4 KB) is already 1500 times the user's."""

    def forward(self, x):
        if x.shape[0] > 3000:
            if x.shape[0] > 10000:
                return x * 3
            return x * 2
        return x - 1


def test_nested_versions_budget_eager_runs_on_the_users_example(monkeypatch):
    # the eager budget is a multiple of the user's example: multiplied from a version's
    # example instead, it let diffusers' KVAE video VAE run 3-D convolutions eagerly on
    # a batch of 24576 (40 s per run)
    from yobx.torch.tracing.constraints import witness_inputs

    ran = []
    run_eagerly = versions.run_eagerly

    def recorded(root, inputs, leaves_):
        ran.append(sum(t.numel() * t.element_size() for t in leaves_ if hasattr(t, "numel")))
        return run_eagerly(root, inputs, leaves_)

    monkeypatch.setattr(versions, "run_eagerly", recorded)
    model = NestedLargeSides()
    tracer, _, gm = trace_module(model, {"x": torch.randn(2, 1024)}, {"x": {0: "batch"}})
    assert len(tracer.versions) == 3, [v.when for v in tracer.versions]
    assert ran and max(ran) <= witness_inputs.EAGER_BYTES, ran
    for batch in (2, 3001, 10001):
        x = torch.randn(batch, 1024)
        assert_same(model(x), gm(x))


class PositionTable(torch.nn.Module):
    """Learned positions for 128 tokens (OpenAI GPT): eager raises past them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("positions", torch.randn(1, 128, 4))

    def forward(self, x):
        return x + self.positions[:, : x.shape[1]]


def test_a_witness_far_longer_than_the_example_is_not_run_eagerly(monkeypatch):
    # the other side of `seq <= 128` was tried eagerly at 129, then at 16384 and 16385:
    # small token ids, but OpenAI GPT's attention allocated 8 GB of scores there (70 s
    # of its export); the capture on fake tensors refuses those sizes as well
    ran = []
    run_eagerly = versions.run_eagerly

    def recorded(root, inputs, leaves_):
        ran.append(max(t.shape[1] for t in leaves_ if isinstance(t, torch.Tensor)))
        return run_eagerly(root, inputs, leaves_)

    monkeypatch.setattr(versions, "run_eagerly", recorded)
    model = PositionTable()
    tracer, _, gm = trace_module(model, {"x": torch.randn(2, 5, 4)}, {"x": {1: "seq"}})
    assert ran and max(ran) <= 4096, ran
    assert any("seq <= 128" in note for note in tracer.version_notes), tracer.version_notes
    for seq in (5, 1, 128):
        x = torch.randn(2, seq, 4)
        assert_same(model(x), gm(x))
    with pytest.raises(ConstraintViolationError, match="seq <= 128"):
        gm(torch.randn(2, 129, 4))


def test_an_example_pinned_by_its_decisions_is_captured_from_another_size_first():
    # the example batch 2 takes `batch < 3`, which with the default range holds batch
    # at 2 in its whole capture: the joined graph's inputs had a constant batch (the
    # ONNX model declared it static, to_onnx refused). The first capture comes from
    # another size, as for `if batch == 2`; the example's side is a version
    model = PinnedAtTwo()
    y = torch.randn(2, 3)
    tracer, graph, gm = trace_module(
        model, {"x": torch.randn(2, 3), "y": y}, {"x": {0: "batch"}, "y": None}
    )
    assert len(tracer.versions) == 4, [v.when for v in tracer.versions]
    placeholder = next(n for n in graph.nodes if n.op == "placeholder")
    batch_size = placeholder.meta["val"].shape[0]
    assert isinstance(batch_size, torch.SymInt) and batch_size.node.maybe_as_int() is None
    for batch in (2, 8, 3, 1, 0):
        x = torch.randn(batch, 3)
        assert_same(model(x, y), gm(x, y))


class PinnedWhereEagerRuns(torch.nn.Module):
    """``batch < 3`` at the example 2, and eager raises for every other size."""

    def forward(self, x):
        if x.shape[0] < 3:
            return x * 2
        raise ValueError("at most two rows")


def test_an_example_pinned_with_no_other_size_keeps_its_capture():
    model = PinnedWhereEagerRuns()
    tracer, graph, gm = trace_module(model, {"x": torch.randn(2, 3)}, {"x": {0: "batch"}})
    for batch in (2, 1, 0):
        x = torch.randn(batch, 3)
        assert_same(model(x), gm(x))
    with pytest.raises(ConstraintViolationError):
        gm(torch.randn(4, 3))


class CapturedAtOneOnly(torch.nn.Module):
    """``min(dim, 2)`` gives versions for dim >= 3, 2 and below 2; the last one is
    captured at 1 (a constant there), then at 0 (fuzz_tracing seed 3048)."""

    def forward(self, x):
        t1 = x.narrow(2, 0, min(x.shape[2], 2))
        torch.nn.functional.scaled_dot_product_attention(t1, t1, t1, is_causal=True)
        t1.narrow(1, 0, min(t1.shape[1], 3)).flatten()
        return t1 @ t1.transpose(-1, -2), t1.shape[-1] * 2 + t1.shape[0]


_CAPTURED_AT_ONE_SIZES = ((3, 4), (5, 2), (11, 8), (3, 1), (1, 1))


def test_a_version_captured_at_one_has_its_version_at_zero():
    # the capture at 0 failed (a flatten of an empty fake tensor asked whether it was
    # contiguous) and `dim >= 1` stayed a check, where eager runs
    model = CapturedAtOneOnly()
    tracer, graph, gm = trace_module(
        model, {"x": torch.randn(3, 3, 4)}, {"x": {1: "length", 2: "dim"}}
    )
    assert not any("capture for" in note for note in tracer.version_notes), tracer.version_notes
    sizes = (*_CAPTURED_AT_ONE_SIZES, (0, 0), (3, 0))
    _check_sizes(model, gm, lambda s: torch.randn(3, *s), sizes)


def test_a_version_captured_at_one_checks_it_where_no_version_takes_zero(monkeypatch):
    # the check `dim >= 1 when dim < 2` was built on the ShapeEnv's positive symbols,
    # for which sympy folds it to True: the version of dim = 1 ran at dim = 0 and
    # returned 5 (its constant) instead of 3. The capture at 0 is made to fail, as
    # that of an operator the tracer cannot run on an empty tensor would
    from yobx.torch.tracing.constraints import versions

    capture = versions.Versioning._capture

    def failing_at_zero(self, version, witness, path, fact):
        if 0 in witness.values():
            self._note(fact, "the capture for dim=0 fails (made to fail by the test)")
            return None
        return capture(self, version, witness, path, fact)

    monkeypatch.setattr(versions.Versioning, "_capture", failing_at_zero)
    model = CapturedAtOneOnly()
    tracer, graph, gm = trace_module(
        model, {"x": torch.randn(3, 3, 4)}, {"x": {1: "length", 2: "dim"}}
    )
    assert any("dim >= 1" in note for note in tracer.version_notes), tracer.version_notes
    _check_sizes(model, gm, lambda s: torch.randn(3, *s), _CAPTURED_AT_ONE_SIZES)
    for length in (0, 3):
        with pytest.raises(ConstraintViolationError, match="dim >= 1"):
            gm(torch.randn(3, length, 0))


class TwoChunks(torch.nn.Module):
    """``len(x.chunk(2))``: 2 pieces from 2 rows on, which torch decides from the
    default range without a guard, 1 piece for one row."""

    def forward(self, x):
        pieces = x.chunk(2, 0)
        return x * len(pieces), pieces[0] + 1


def test_the_number_of_chunks_decided_by_the_default_range_gets_a_version():
    # the graph returned 2 pieces at one row (x * 2 where eager gives x * 1, and a
    # first piece of one row taken for a half), silently (fuzz_tracing seed 5108)
    model = TwoChunks()
    tracer, graph, gm = trace_module(model, {"x": torch.randn(7, 3)}, {"x": {0: "rows"}})
    _check_sizes(model, gm, lambda rows: torch.randn(rows, 3), (7, 2, 13, 1, 0))
    assert any("rows < 2" in v.when for v in tracer.versions), [v.when for v in tracer.versions]


class HalfFromTheEnd(torch.nn.Module):
    """``y[-(n // 2):]``: the last half, counted from the end where ``n // 2 > 0``,
    which torch decides from the default range; at ``n = 1`` the start is 0 and the
    slice is the whole tensor."""

    def forward(self, y):
        half = y[-(y.shape[0] // 2) :]
        if y.shape[0] > half.shape[0]:
            return y + 1
        return y * 3


def test_a_slice_whose_symbolic_start_stops_being_negative_gets_a_version():
    # the graph kept n // 2 rows at n = 1 and returned y + 1 where eager returns y * 3
    # (fuzz_tracing seed 6180)
    model = HalfFromTheEnd()
    _, _, gm = trace_module(model, {"y": torch.randn(6, 3)}, {"y": {0: "length"}})
    _check_sizes(model, gm, lambda length: torch.randn(length, 3), (6, 2, 7, 1, 0))


class FirstColumns(torch.nn.Module):
    """Slices of length ``min(1, width)``, which sympy folds to 1 on the ShapeEnv's
    positive symbols without a guard: 0 for an empty ``width``."""

    def __init__(self, index: str):
        super().__init__()
        self.index = index

    def forward(self, x):
        picked = {
            "x[:, :1]": lambda: x[:, :1],
            "x[..., -1:]": lambda: x[..., -1:],
            "x[:, 0:1, None]": lambda: x[:, 0:1, None],
            "x[:, width - 1:]": lambda: x[:, x.shape[1] - 1 :],
            "x.split(1, 1)[0]": lambda: x.split(1, 1)[0],
        }[self.index]()
        return picked.new_zeros(*picked.shape, 2) + picked.sum()


@pytest.mark.parametrize(
    "index", ["x[:, :1]", "x[..., -1:]", "x[:, 0:1, None]", "x[:, width - 1:]", "x.split(1, 1)[0]"]
)
def test_a_slice_of_length_one_over_an_empty_dimension_gets_a_version(index):
    # the graph kept a length of 1 at width 0 (new_zeros of 1 column where eager makes
    # 0), silently, and split's first piece raised there (fuzz_tracing seed 5028)
    model = FirstColumns(index)
    tracer, _, gm = trace_module(model, {"x": torch.randn(3, 8)}, {"x": {1: "width"}})
    _check_sizes(model, gm, lambda width: torch.randn(3, width), (8, 2, 1, 0))
    assert any("width < 1" in v.when for v in tracer.versions), [v.when for v in tracer.versions]


class FoldedOnPositiveSizes(torch.nn.Module):
    """Python on a size that sympy settles from 1 on, without a guard: ``bool(n)``,
    ``len(range(n - 1))``, ``range(1, n)``, ``max(n, 1)``."""

    def __init__(self, case: str):
        super().__init__()
        self.case = case

    def forward(self, x):
        n = x.shape[1]
        if self.case == "bool":
            return x.sum() + (1 if n else 2)
        if self.case == "len(range(n - 1))":
            return x.sum() + len(range(n - 1))
        if self.case == "range(1, n)":
            acc = x.new_zeros(x.shape[0])
            for i in range(1, n):
                acc = acc * 0.5 + x[:, i]
            return acc
        return x.sum() + n // max(n, 1)


@pytest.mark.parametrize("case", ["bool", "len(range(n - 1))", "range(1, n)", "n // max(n, 1)"])
def test_python_on_a_size_folded_from_one_on_gets_a_version(case):
    # each returned the value of width >= 1 at width 0 (`if n:` taken, -1 steps, ...)
    model = FoldedOnPositiveSizes(case)
    tracer, _, gm = trace_module(model, {"x": torch.randn(3, 8)}, {"x": {1: "width"}})
    _check_sizes(model, gm, lambda width: torch.randn(3, width), (8, 2, 1, 0))
    assert any("width < 1" in v.when for v in tracer.versions), [v.when for v in tracer.versions]


class FirstOfTheInner(torch.nn.Module):
    """``x[:, 1:-1][:, :1]`` has ``min(1, width - 2)`` columns, which sympy leaves open:
    ``expand`` then needs to know whether it is 1."""

    def forward(self, x):
        inner = x[:, 1:-1] + 1
        return inner[:, :1].expand(*inner.shape) * 2


def test_an_expand_of_a_slice_length_left_open_decides_it_with_a_version():
    # expand failed on fake tensors ("non-broadcasting semantics require
    # Min(1, s0 - 2) == s0 - 2"), where eager runs at every width (fuzz_tracing 9172)
    model = FirstOfTheInner()
    tracer, _, gm = trace_module(model, {"x": torch.randn(3, 8)}, {"x": {1: "width"}})
    _check_sizes(model, gm, lambda width: torch.randn(3, width), (8, 3, 5, 2, 1, 0))


class OddColumnsPadded(torch.nn.Module):
    """In the version of an even ``dim`` (``dim = 2*k``), ``x[:, 1::2][:, :1]`` has
    ``min(1, k)`` columns, which sympy folds to 1 on ``k``, a symbol of its own."""

    def forward(self, y):
        if y.shape[-1] % 2 != 0:
            y = torch.nn.functional.pad(y, (0, 1))
        first = y[..., 1::2][..., :1]
        return first.shape[-1] * 2 + first.sum()


def test_a_slice_of_length_one_in_a_version_of_even_sizes_gets_a_version_at_zero():
    # the even version returned 2 at dim 0 (a column of the empty tensor), silently
    # (fuzz_tracing seed 9266)
    model = OddColumnsPadded()
    _, _, gm = trace_module(model, {"y": torch.randn(6, 6)}, {"y": {0: "dim", 1: "dim"}})
    _check_sizes(model, gm, lambda dim: torch.randn(dim, dim), (6, 5, 2, 1, 0))


class SameLineTwice(torch.nn.Module):
    """One decision line met twice; its other side reads tensor values in Python,
    which no capture takes (eager runs there)."""

    def scaled(self, x, k):
        if x.shape[0] * k > 100 and x.sum() > 0:
            return x * k
        return x + k

    def forward(self, x):
        return self.scaled(x, 1) + self.scaled(x, 2)


def test_a_line_whose_other_side_no_capture_takes_gets_one_try_next(monkeypatch):
    from yobx.torch.tracing import CustomTracer

    sizes = []
    trace = CustomTracer.trace

    def counted(self, root, concrete_args=None, **kwargs):
        sizes.append(concrete_args["x"].shape[0])
        return trace(self, root, concrete_args=concrete_args, **kwargs)

    monkeypatch.setattr(CustomTracer, "trace", counted)
    model = SameLineTwice()
    tracer, _, gm = trace_module(model, {"x": torch.randn(4, 3)}, {"x": {0: "batch"}})
    # the example, three sizes for `batch > 100`, one for `2*batch > 100`
    assert len(sizes) == 5 and sizes[0] == 4, sizes
    assert sum(1 for note in tracer.version_notes if "capture for" in note) == 4
    for batch in (4, 50, 1):
        x = torch.randn(batch, 3)
        assert_same(model(x), gm(x))


class ChunksThenReshape(torch.nn.Module):
    """The number of chunks of ``dim`` gets a version at ``dim = 0``, which reshapes the
    empty ``(seq, 0)`` sum of two halves to ``(seq, -1)``."""

    def forward(self, x):
        t1 = x * len(x.chunk(4, 1))
        p2, q3 = t1.split([t1.shape[1] // 2, t1.shape[1] - t1.shape[1] // 2], 1)
        t4 = p2.sum(1, keepdim=True) + q3
        return t4.reshape(int(t4.shape[0]), -1)


def test_a_version_at_zero_reshaping_an_empty_tensor_is_captured():
    # the reshape asked whether the empty tensor was exactly contiguous, which the
    # shape rules leave to torch for an empty one: the version's capture failed and
    # `dim >= 1` stayed a constraint (fuzz_tracing 9435)
    model = ChunksThenReshape()
    tracer, _, gm = trace_module(model, {"x": torch.randn(7, 8)}, {"x": {0: "seq", 1: "dim"}})
    assert not any("capture for" in note for note in tracer.version_notes), tracer.version_notes
    assert any("dim < 1" in v.when for v in tracer.versions), [v.when for v in tracer.versions]
    _check_sizes(model, gm, lambda d: torch.randn(7, d), [8, 0, 1, 13])
    _check_sizes(model, gm, lambda s: torch.randn(s, 0), [3, 1])


class ChunksOfAnEmptyBatch(torch.nn.Module):
    """fuzz_tracing seed 10005: the version of an empty batch chooses on the number of
    ``chunk(4, 2)`` pieces of ``dim``, ``(dim + ceil(dim/4) - 1) // ceil(dim/4)``,
    which divides by 0 at ``dim = 0``."""

    def forward(self, x, y):
        t2 = x[:, :1] * 0
        for i in range((x.shape[1] + 1) // 2):
            t2 = t2 + x.narrow(1, i, 1)
        p3, q4 = t2.chunk(2, 2)
        t6 = torch.cat([q4, p3], 2).chunk(4, 2)[0]
        if t6.shape[-1] % 2 != 0:
            t6 = torch.nn.functional.pad(t6, (0, 1))
        return t6 + y.sum()


def test_a_choice_dividing_by_a_size_that_is_zero_names_the_division():
    # the choice raised ZeroDivisionError at dim = batch = 0 (no version was captured
    # there): it is a ConstraintViolationError naming the divisor and the user's line
    model = ChunksOfAnEmptyBatch()
    dims = {"x": {0: "dim", 1: "batch", 2: "dim"}, "y": {2: "width", 3: "dim"}}
    tracer, _, gm = trace_module(
        model, {"x": torch.randn(8, 8, 8), "y": torch.randn(3, 4, 8, 8)}, dims
    )
    for dim, batch in ((8, 8), (14, 12), (13, 5), (0, 3)):
        x, y = torch.randn(dim, batch, dim), torch.randn(3, 4, 5, dim)
        assert_same(model(x, y), gm(x, y))
    with pytest.raises(
        ConstraintViolationError, match=r"\(\(dim \+ 3\)//4\) != 0.*versions.py:\d+\): dim=0"
    ):
        gm(torch.randn(0, 0, 0), torch.randn(3, 4, 5, 0))


class OddPaddedAndWrittenThroughAView(torch.nn.Module):
    """A parity decision (``n % 2``: torch writes ``n = 2*q + 1``), then a write through
    two ``contiguous()`` calls that are views of ``x`` where ``n == 1`` (fuzz_tracing
    seed 12525)."""

    def forward(self, x):
        t1 = x
        if x.shape[-1] % 2 != 0:
            t1 = torch.nn.functional.pad(x, (0, 1))
        t7 = x.transpose(2, 1).contiguous()
        w8 = t7[::2].transpose(0, 2).contiguous()
        w8.mul_(2)
        return t1 * 2


def test_a_quotient_of_a_dimension_is_judged_below_the_default_range():
    # the quotient of `n = 2*q + 1` took q >= 1 from n >= 2 and was positive for sympy:
    # `(n + 1)//2 == 1` (q == 0, the write through a view at n = 1) folded to False
    # with no trace of the default range, and at n = 1 the graph left `x` as it was
    # where eager doubles it (silently wrong). It is now a decision, n = 1 a version.
    model = OddPaddedAndWrittenThroughAView()
    dims = {"x": {0: "n", 1: "seq", 2: "n"}}
    _, _, gm = trace_module(model, {"x": torch.randn(5, 8, 5)}, dims)
    for n, seq in ((5, 8), (1, 1), (1, 2), (3, 2), (7, 3)):
        x = torch.randn(n, seq, n)
        eager_x, graph_x = x.clone(), x.clone()
        assert_same(model(eager_x), gm(graph_x))
        assert_same(eager_x, graph_x)


class OddPaddedThenCompared(torch.nn.Module):
    """A parity decision (``n % 2``: torch writes ``n = 2*q + 1``), then a decision on
    the padded size ``2*q + 2`` (fuzz_tracing seed 12712)."""

    def forward(self, x):
        t1 = x
        if x.shape[-1] % 2 != 0:
            t1 = torch.nn.functional.pad(x, (0, 1))
        t2 = t1 + torch.zeros(t1.shape[-1])
        if t2.shape[0] < 4:
            return t2 * 2
        return t2 - 1


def test_a_quotient_of_a_dimension_of_example_one_may_be_zero():
    # traced at n = 1 (n >= 1, so q >= 0), the quotient of `n = 2*q + 1` was positive
    # for sympy: `2*q + 2 < 4` folded to False, and the version of n = 1 (and a trace
    # at n = 1 alone) computed `t2 - 1` where eager computes `t2 * 2` (silently wrong)
    model = OddPaddedThenCompared()
    for example in (1, 3):
        _, _, gm = trace_module(model, {"x": torch.randn(example)}, {"x": {0: "n"}})
        for n in (1, 2, 3, 4, 5, 6, 12):
            x = torch.randn(n)
            assert_same(model(x), gm(x))


class LastColumnPaddedWhenOdd(torch.nn.Module):
    """``y[:, -1:]`` has ``min(1, n)`` columns: a decision on it holds from 1 on, not
    at 0 (fuzz_tracing seed 14377)."""

    def forward(self, y):
        last = y[:, -1:]
        if last.shape[1] % 2 != 0:
            return torch.nn.functional.pad(last, (0, 1))
        return last - 1


def test_a_dimension_of_example_one_keeps_its_decisions_right_at_zero():
    # traced at n = 1, the range of n started at 1 and decisions were made from it
    # without a check: at n = 0, the graph padded an empty column into one (its output
    # had 1 column where eager's has 0, silently); from n = 3 it had versions
    model = LastColumnPaddedWhenOdd()
    for example in (1, 3):
        _, _, gm = trace_module(model, {"y": torch.randn(2, example)}, {"y": {1: "n"}})
        for n in (0, 1, 2, 5):
            y = torch.randn(2, n)
            assert_same(model(y), gm(y))
