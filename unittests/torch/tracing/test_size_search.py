"""The search for sizes where a decision goes the other way evaluates conditions as
the graph computes them, ``int()`` of a product of a size and a float included
(printed ``math.trunc(0.5*torch.sym_float(n))``)."""

import sympy
import torch
from torch.utils._sympy.functions import ToFloat, TruncToInt

from yobx.torch.tracing import CustomTracer
from yobx.torch.tracing.constraints.size_search import (
    compile_condition,
    holds,
    moves,
    satisfying_moves,
)

from ._helpers import assert_same


def test_condition_with_int_of_a_float_compiles():
    n = sympy.Symbol("n", integer=True)
    condition = sympy.Eq(TruncToInt(ToFloat(n) * 0.5) + 1, 8)
    function = compile_condition(condition, [n])
    assert [v for v in range(30) if function(v)] == [14, 15]


class HalfThenBranch(torch.nn.Module):
    def forward(self, z):
        flat = z.flatten()[: int(z.numel() * 0.5) + 1]
        if flat.shape[0] == 8:
            return flat * 2
        return flat - 1


def test_branch_on_int_of_a_float_gets_its_other_side():
    model = HalfThenBranch()
    tracer = CustomTracer()
    graph = tracer.trace(model, (torch.randn(2, 7),), dynamic_shapes=({0: "a", 1: "b"},))
    assert len(tracer.versions) == 2, tracer.version_notes
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    for a, b in [(2, 7), (3, 5), (1, 9), (2, 3)]:
        z = torch.randn(a, b)
        assert_same(model(z), gm(z))


def test_a_disjunct_dividing_by_zero_leaves_the_other_one_deciding():
    from torch.utils._sympy.functions import FloorDiv, PythonMod

    from yobx.torch.tracing.constraints.size_search import holds

    n, m = sympy.Symbol("n", integer=True), sympy.Symbol("m", integer=True)
    windows = FloorDiv(n, 128)
    # `m % windows == 0 when windows > 0`, its disjuncts in both orders
    for condition in (
        sympy.Or(sympy.Le(windows, 0), sympy.Eq(PythonMod(m, windows), 0)),
        sympy.Or(sympy.Eq(PythonMod(m, windows), 0), sympy.Le(windows, 0), evaluate=False),
    ):
        function = compile_condition(condition, [n, m])
        assert holds(function, [11, 3])  # no window: the guard decides
        assert holds(function, [256, 4])
        assert not holds(function, [256, 3])
    # outside a disjunction, a division by zero still breaks the condition
    alone = compile_condition(sympy.Eq(PythonMod(m, windows), 0), [n, m])
    assert not holds(alone, [11, 3])


def test_co_moved_keeps_a_sum_of_the_example_sizes():
    from yobx.torch.tracing.constraints.size_search import co_moved

    base = {"past": 5, "seq": 1, "total": 6, "heads": 3}
    # total is past + seq in the example: it follows seq
    assert co_moved(base, {"seq": 2}) == {"past": 5, "seq": 2, "total": 7, "heads": 3}
    # with a coincidence (past == heads + seq), every relation of the example holds
    moved = co_moved({**base, "heads": 4}, {"seq": 2})
    assert moved["seq"] == 2 and moved["total"] == moved["past"] + moved["seq"]
    assert moved["past"] == moved["heads"] + moved["seq"]
    # nothing is a sum of the moved size with another: no other example
    assert co_moved({"a": 3, "b": 10}, {"a": 4}) is None


def test_satisfying_moves_finds_what_moves_checked_one_by_one_finds():
    # by blocks, the conditions not reading the moving size evaluated once a block:
    # the same assignments in the same order, within the same budget
    a, b, c = sympy.symbols("a b c", integer=True)
    base = {a: 5, b: 3, c: 7}
    conditions = [
        sympy.Ge(a, 2),
        sympy.Ge(b, 1),
        sympy.Eq(sympy.Mod(a + c, 4), 1),
        sympy.Or(sympy.Lt(b, 2), sympy.Gt(c, 9)),
    ]
    functions = [compile_condition(x, list(base)) for x in conditions]
    for budget in (0, 1, 299, 5000):
        expected = [
            {**base, **changes}
            for changes in list(moves(base, [b], [2, 4, 9]))[:budget]
            if all(holds(f, [{**base, **changes}[s] for s in base]) for f in functions)
        ]
        got = list(satisfying_moves(base, conditions, [b], [2, 4, 9], budget))
        assert got == expected
    assert got, "the case finds some"


def test_a_condition_compiles_once_for_its_symbols():
    """The versions ask for the same sizes at every witness: compiled once, reused."""
    a, b = sympy.symbols("a b", integer=True)
    condition = sympy.Ge(2 * a + b, 5)
    function = compile_condition(condition, [a, b])
    assert compile_condition(condition, [a, b]) is function
    assert function(1, 3) and not function(1, 2)
    # other symbols in another order: another function
    swapped = compile_condition(condition, [b, a])
    assert swapped is not function and swapped(3, 1) and not swapped(2, 1)
