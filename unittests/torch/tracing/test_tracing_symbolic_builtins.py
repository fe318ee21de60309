"""Never narrow, item 2: integers made from dimensions stay symbolic where torch takes
symbolic sizes (``int()``, ``float()``, ``round()``, ``math.ceil`` in the traced code),
and a Python int that must be real adopts the expression's value, not the dimension."""

import builtins
import math
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

from yobx.torch.tracing import ConstraintViolationError
from yobx.torch.tracing.core.symbolic_builtins import traced_float, traced_int

from ._helpers import assert_same, trace_module


def _exact(model, gm, shapes):
    for shape in shapes:
        x = torch.randn(*shape)
        assert_same(model(x), gm(x))


class Interpolate(torch.nn.Module):
    def forward(self, x):
        h, w = x.shape[-2:]
        return F.interpolate(x, size=(int(h // 2), int(w * 1.5)), mode="nearest")


class PadToMultiple(torch.nn.Module):
    def forward(self, x):
        n = x.shape[1]
        m = math.ceil(n / 4) * 4
        return F.pad(x, (0, 0, 0, m - n)).reshape(x.shape[0], m // 4, 4, x.shape[2])


class ViewAndNewZeros(torch.nn.Module):
    def forward(self, x):
        b, s = int(x.shape[0]), int(x.shape[1])
        return x.view(b * s, -1).sum() + x.new_zeros(int(s // 2) + 1, 3)


class SplitNarrow(torch.nn.Module):
    def forward(self, x):
        n = int(x.shape[1] // 2)
        a, b = x.split([n, x.shape[1] - n], dim=1)
        return a.sum(1) + b.narrow(1, 0, 1).sum(1)


class Round(torch.nn.Module):
    def forward(self, x):
        return F.interpolate(x, size=round(x.shape[-1] * 0.75), mode="linear")


class FloatScale(torch.nn.Module):
    def forward(self, x):
        return x / float(x.shape[-1]) + torch.full((1,), float(x.shape[0]) / 2)


@pytest.mark.parametrize(
    ("model", "example", "dims", "others"),
    [
        (Interpolate(), (2, 3, 8, 6), {0: "b", 2: "h", 3: "w"}, [(2, 3, 10, 8), (1, 3, 13, 5)]),
        (PadToMultiple(), (2, 7, 3), {0: "b", 1: "n"}, [(2, 8, 3), (3, 13, 3), (1, 2, 3)]),
        (ViewAndNewZeros(), (2, 6, 4), {0: "b", 1: "s"}, [(3, 9, 4), (1, 4, 4)]),
        (SplitNarrow(), (2, 6, 4), {0: "b", 1: "s"}, [(3, 9, 4), (1, 4, 4)]),
        (Round(), (2, 3, 8), {0: "b", 2: "h"}, [(2, 3, 12), (1, 3, 6), (1, 3, 2)]),
        (FloatScale(), (2, 6), {0: "b", 1: "s"}, [(3, 9), (5, 4)]),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, torch.nn.Module) else "",
)
def test_numbers_from_dimensions_stay_symbolic(model, example, dims, others):
    tracer, graph, gm = trace_module(model, {"x": torch.randn(*example)}, {"x": dims})
    # nothing adopted, one version: the graph computes the numbers from the sizes
    assert tracer.constraints == [] and tracer.versions == []
    _exact(model, gm, [example, *others])


class Blocks(torch.nn.Module):
    def forward(self, x):
        blocks = (x.shape[1] + 3) // 4
        return torch.stack([x[:, i * 4 : (i + 1) * 4].sum(1) for i in range(blocks)], 1)


def test_a_python_int_adopts_the_expression_value_not_the_dimension():
    """``range((n + 3) // 4)`` needs a real int: with one capture, the graph holds for
    every n with the same number of blocks (n in 5..8), not only for n == 7."""
    model = Blocks()
    tracer, _, gm = trace_module(
        model,
        {"x": torch.randn(2, 7, 3)},
        {"x": {0: "b", 1: "n"}},
        tracer_kwargs={"narrowing": "constraints"},
    )
    assert [(c.expression, c.kind) for c in tracer.constraints] == [("(n + 3)//4 == 2", "other")]
    _exact(model, gm, [(2, 5, 3), (1, 8, 3)])
    with pytest.raises(ConstraintViolationError, match=r"\(n \+ 3\)//4 == 2"):
        gm(torch.randn(2, 9, 3))


def test_each_value_of_a_python_int_is_a_version():
    """With versions, each other number of blocks is captured too, up to the budget."""
    model = Blocks()
    tracer, _, gm = trace_module(
        model,
        {"x": torch.randn(2, 7, 3)},
        {"x": {0: "b", 1: "n"}},
        tracer_kwargs={"max_versions": 3},
    )
    assert len(tracer.versions) == 3
    _exact(model, gm, [(2, 5, 3), (1, 8, 3), (2, 2, 3), (2, 3, 3), (2, 9, 3), (2, 12, 3)])
    # beyond the budget, the last version's value stays a constraint, checked
    assert any("beyond the budget" in note for note in tracer.version_notes)
    with pytest.raises(ConstraintViolationError):
        gm(torch.randn(2, 30, 3))


class UsesIntAsType(torch.nn.Module):
    def forward(self, x):
        n = x.shape[0]
        assert isinstance(3, int) and isinstance(2.5, float) and not isinstance(2.5, int)
        assert issubclass(bool, int) and int.from_bytes(b"\x01", "big") == 1
        assert type(4) == int  # noqa: E721, UP003 (the replacement compares equal to the builtin)
        assert int("12") == 12 and int(3.7) == 3 and float("0.5") == 0.5 and int(True) == 1
        constant = torch.zeros(2, dtype=int) + torch.arange(2, dtype=float).to(int)
        return x.to(int) * int(n) + constant.sum()


def test_int_and_float_still_work_as_types_in_the_traced_code():
    model = UsesIntAsType()
    x = torch.randint(0, 5, (3, 2))
    tracer, graph, gm = trace_module(model, {"x": x}, {"x": {0: "n"}})
    assert tracer.constraints == []
    for case in [x, torch.randint(0, 5, (6, 2))]:
        assert torch.equal(model(case), gm(case))
    # the graph records the dtype torch maps int to
    dtypes = [n.args[1] for n in graph.nodes if n.op == "call_method" and n.target == "to"]
    assert dtypes == [torch.int64]


def test_the_names_are_restored_after_the_trace():
    module_globals = sys.modules[__name__].__dict__
    trace_module(Interpolate(), {"x": torch.randn(2, 3, 8, 6)}, {"x": {2: "h", 3: "w"}})
    assert "int" not in module_globals and "float" not in module_globals
    assert int is builtins.int and float is builtins.float


def test_another_thread_gets_the_builtins_answers():
    """Calls from another thread while a trace runs are the builtins' (the replacement
    answers for the tracing thread only)."""
    seen = []

    class Model(torch.nn.Module):
        def forward(self, x):
            thread = threading.Thread(target=lambda: seen.append(traced_int(7.9)))
            thread.start()
            thread.join()
            return x * int(x.shape[0])

    x = torch.randn(3, 2)
    _, _, gm = trace_module(Model(), {"x": x}, {"x": {0: "n"}})
    assert seen == [7] and type(seen[0]) is int
    assert_same(Model()(torch.randn(5, 2) * 0 + 1), gm(torch.ones(5, 2)))
    # outside a trace, the replacements are the builtins
    assert traced_int(2.5) == 2 and traced_float(3) == 3.0 and isinstance(5, traced_int)


def test_traced_builtins_outside_a_trace_are_the_builtins():
    assert traced_int("7") == 7 and type(traced_int(7.2)) is int
    assert traced_int == int  # noqa: E721 (dict keys and == comparisons see the builtin)
    assert hash(traced_int) == hash(int) and repr(traced_int) == "<class 'int'>"
    assert issubclass(traced_int, int) and isinstance(True, traced_int)
