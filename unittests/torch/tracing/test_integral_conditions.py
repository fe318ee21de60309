"""Conditions on sizes with fractions (``q = height/4 - 1/2`` after a divisibility)
become conditions with integer coefficients only, true for the same sizes: the choice
between versions is lowered again on symbolic integers (ONNX), which refuse
``Fraction * SymInt``."""

import itertools

import pytest
import sympy
from torch.utils._sympy.functions import FloorDiv, Max, Min, PythonMod

from yobx.torch.tracing.symbolic.integral_conditions import integral_condition

H, W = sympy.symbols("h w", integer=True)
HALF, QUARTER = sympy.Rational(1, 2), sympy.Rational(1, 4)

CONDITIONS = [
    sympy.Gt(Min(H * QUARTER + HALF, FloorDiv(W * HALF + 1, 2)), 4),
    sympy.Eq(PythonMod(H * QUARTER - HALF, 4), 1),
    sympy.Ne(FloorDiv(H * HALF, 3) * (W * HALF - HALF), 12),
    sympy.Le(Max(H * HALF, W * QUARTER + HALF) + PythonMod(W * HALF, 2) * HALF, 7),
    sympy.And(sympy.Ge(H * HALF, W), sympy.Not(sympy.Lt(H * QUARTER, 3))),
]


@pytest.mark.parametrize("condition", CONDITIONS, ids=str)
def test_same_truth_with_integers_only(condition):
    integral = integral_condition(condition)
    assert not any(not r.is_Integer for r in integral.atoms(sympy.Rational)), integral
    for h, w in itertools.product(range(0, 64, 2), range(0, 48, 2)):
        values = {H: h, W: w}
        assert bool(condition.subs(values)) == bool(integral.subs(values)), (h, w, integral)


def test_condition_without_fractions_is_kept():
    condition = sympy.Gt(FloorDiv(H, 2), W)
    assert integral_condition(condition) == condition
