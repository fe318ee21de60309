"""The prover never claims what is false: random claims checked against every size.

Every decision the tracer takes without the example (and every question torch's
kernels ask the ShapeEnv, which the prover answers too) rests on
:meth:`SymbolicDimensions.prove`. Random relations between expressions built from
sums, products, floor divisions, remainders, minima and maxima of bounded dimensions
are proved, and each proof is checked by evaluating the claim at every size in the
ranges.
"""

import itertools
import random

import pytest
import sympy
from torch.utils._sympy.functions import FloorDiv, Max, Min, PythonMod

from yobx.torch.tracing.symbolic.residues import is_identity
from yobx.torch.tracing.symbolic.symbolic import SymbolicDimensions

RANGES = {"a": (2, 9), "b": (2, 7), "c": (3, 6)}


def _expression(rng: random.Random, symbols: list, depth: int) -> sympy.Expr:
    if depth == 0 or rng.random() < 0.25:
        return rng.choice([*symbols, *map(sympy.Integer, (1, 2, 3, 4))])
    kind = rng.choice(["add", "sub", "mul", "floordiv", "floordiv", "mod", "mod", "min", "max"])
    left = _expression(rng, symbols, depth - 1)
    if kind in ("floordiv", "mod"):
        divisor = (
            sympy.Integer(rng.choice([2, 3, 4])) if rng.random() < 0.8 else rng.choice(symbols)
        )
        return FloorDiv(left, divisor) if kind == "floordiv" else PythonMod(left, divisor)
    right = _expression(rng, symbols, depth - 1)
    return {
        "add": lambda: left + right,
        "sub": lambda: left - right,
        "mul": lambda: left * right,
        "min": lambda: Min(left, right),
        "max": lambda: Max(left, right),
    }[kind]()


def _evaluate(claim: sympy.Basic, values: dict) -> bool | None:
    result = claim.xreplace({s: sympy.Integer(v) for s, v in values.items()})
    if result in (sympy.true, sympy.false):
        return bool(result)
    return None


@pytest.mark.parametrize("batch", range(6))
def test_proofs_hold_at_every_size(batch):
    rng = random.Random(batch)
    dims = SymbolicDimensions()
    symbols = {
        name: dims.dimension(name, low, low, high).node.expr for name, (low, high) in RANGES.items()
    }
    grid = [
        dict(zip(symbols.values(), point))
        for point in itertools.product(*(range(lo, hi + 1) for lo, hi in RANGES.values()))
    ]
    relations = [sympy.Eq, sympy.Ne, sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge]
    proved = 0
    for _ in range(150):
        used = rng.sample(list(symbols.values()), rng.choice([1, 2]))
        lhs = _expression(rng, used, 3)
        # comparisons with a constant are the most common questions
        rhs = _expression(rng, used, 2) if rng.random() < 0.5 else sympy.Integer(rng.randint(0, 5))
        claim = rng.choice(relations)(lhs, rhs)
        if claim in (sympy.true, sympy.false):
            continue
        verdict = dims.prove(claim)
        if verdict is None:
            continue
        proved += 1
        for values in grid:
            actual = _evaluate(claim, values)
            assert actual is None or actual == verdict, (claim, verdict, values)
    assert proved > 5, "the prover decides nothing: the test checks nothing"


@pytest.mark.parametrize("seed", range(4))
def test_identities_hold_at_every_size(seed):
    rng = random.Random(100 + seed)
    a, b = sympy.symbols("a b", integer=True, positive=True)
    found = 0
    for _ in range(80):
        lhs = _expression(rng, [a, b], 3)
        rhs = _expression(rng, [a, b], 2)
        if not is_identity(lhs - rhs):
            continue
        found += 1
        for x, y in itertools.product(range(0, 13), repeat=2):
            values = {a: sympy.Integer(x), b: sympy.Integer(y)}
            try:
                left, right = lhs.xreplace(values), rhs.xreplace(values)
            except ZeroDivisionError:
                continue
            if left.is_number and right.is_number:
                assert left == right, (lhs, rhs, x, y)
    assert found > 0


@pytest.mark.parametrize("seed", range(2))
def test_padding_as_ceiling_keeps_the_value(seed):
    # random expressions holding paddings to a multiple (`(c - e % c) % c`, `-e % c`)
    # keep their value once the paddings are written as ceilings, negative values of
    # `e` included (Python's remainder of a negative number is the padding too)
    from torch.utils._sympy.functions import Mod

    from yobx.torch.tracing.symbolic.residues import padding_as_ceiling

    rng = random.Random(seed)
    symbols = [sympy.Symbol(name, integer=True) for name in RANGES]
    rewritten = 0
    for _ in range(40):
        inner = _expression(rng, symbols, 2)
        c = sympy.Integer(rng.choice([2, 3, 4, 64]))
        k = rng.choice([1, 2])
        kind = rng.choice(["python", "negated", "mod"] if inner.free_symbols else ["python"])
        if kind == "python":
            padding = PythonMod(k * c - PythonMod(inner, c), c)
        elif kind == "negated":
            padding = PythonMod(-inner, c)
        else:  # torch's Mod refuses a negative number: only built on an expression
            padding = Mod(c - Mod(inner, c), c)
        expr = rng.choice([inner + padding, padding, FloorDiv(inner + padding, c), padding * 2])
        ceiling = padding_as_ceiling(expr)
        rewritten += ceiling != expr
        for values in itertools.product(range(-2, 7), repeat=len(symbols)):
            at = dict(zip(symbols, values))
            try:
                if isinstance(padding, Mod) and inner.xreplace(at) < 0:
                    continue  # torch's Mod is only defined on non-negative numbers
                expected = expr.xreplace(at)
            except ZeroDivisionError:
                continue
            try:
                got = ceiling.xreplace(at)
            except ZeroDivisionError as e:
                raise AssertionError((expr, ceiling, at)) from e
            assert got == expected, (expr, ceiling, at)
    assert rewritten >= 20  # the others simplified away (`(2*a) % 2` is 0)
