"""Searching sizes: integer assignments of dimensions that satisfy conditions.

Two tools need sizes the example does not give: a trace looking for a *witness* where an
undecided decision goes the other way (:mod:`.versions`), and the validation of an
exported model looking for inputs that break one of its runtime checks
(:mod:`yobx.torch.onnx.check_validation`). Both evaluate conditions written with
ShapeEnv functions (``FloorDiv``, ``Mod``, ``Min``, exact fractions) thousands of times:
:func:`compile_condition` turns one into a Python function once.

The candidates come from the example's sizes: a dimension moved first to the values the
conditions' constants suggest (``seq <= 16`` breaks at 17, ``(h//8) * (w//8) != 16`` at
multiples of 8 and 16), to small sizes and around the example's size, then to every size
up to a bound; then two dimensions moved together.
"""

from __future__ import annotations

import fractions
import functools
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import sympy
import torch
from torch.utils._sympy.printers import PythonPrinter

#: every size up to this bound (or four times the example's) is tried for one dimension
SCAN_BOUND = 300
#: the suggested values of the first dimension of a pair
PAIR_VALUES = 40


def compile_condition(condition: sympy.Basic, symbols: Sequence[sympy.Symbol]) -> Callable:
    """A Python function computing ``condition`` (or any expression) from the values of
    ``symbols``, as a traced graph's checks compute it: integers, exact fractions for
    the rational constants, Python's ``//``, ``%``, ``min`` and ``max``.

    A division by zero raises ``ZeroDivisionError``, as Python does, except inside a
    disjunction or a conjunction: an ``Or`` holds where one of its disjuncts is defined
    and true, so that ``body when guard`` (``Or(Not(guard), body)``) holds where the
    guard does not, even if the body divides by zero there; an ``And`` is false where
    one of its conjuncts is defined and false, so that a guard dividing by a size that
    is 0 where another of its conditions fails does not hold there (the choice between
    versions stops at that condition), and raises where none is false and one divides
    by zero. The ONNX checks and the traced graph's compute them so.

    Compiled once per condition and symbols (the function is pure): the versions ask
    for the same sizes at every witness they try (776 calls for 19 conditions in the
    ``export_for_generation`` of a tiny Llama), and printing and compiling one costs
    1.6 ms, five hundred times a call.
    """
    return _compiled(condition, tuple(symbols))


@functools.lru_cache(maxsize=4096)
def _compiled(condition: sympy.Basic, symbols: tuple[sympy.Symbol, ...]) -> Callable:
    rationals = {
        r: sympy.Symbol(f"_fraction_{i}")
        for i, r in enumerate(sorted(condition.atoms(sympy.Rational), key=str))
        if not r.is_Integer
    }
    names = {s: sympy.Symbol(f"_size_{i}") for i, s in enumerate(symbols)}
    text = _Printer().doprint(condition.xreplace({**rationals, **names}))
    arguments = ", ".join(str(names[s]) for s in symbols)
    # `int(n * 0.5)` prints as `math.trunc(0.5*torch.sym_float(n))`
    scope: dict[str, Any] = {"math": math, "min": min, "max": max, "torch": torch}
    scope["_any_defined"], scope["_all_defined"] = _any_defined, _all_defined
    scope.update({str(v): fractions.Fraction(int(r.p), int(r.q)) for r, v in rationals.items()})
    # the text is printed from a sympy expression of ours: no user string reaches it
    return eval(f"lambda {arguments}: {text}", scope)


class _Printer(PythonPrinter):
    """Python's printer, with each operand of an ``Or`` and an ``And`` evaluated on its
    own."""

    def _print_Or(self, expr: sympy.Or) -> str:
        disjuncts = ", ".join(f"lambda: {self._print(a)}" for a in expr.args)
        return f"_any_defined({disjuncts})"

    def _print_And(self, expr: sympy.And) -> str:
        conjuncts = ", ".join(f"lambda: {self._print(a)}" for a in expr.args)
        return f"_all_defined({conjuncts})"


def _any_defined(*disjuncts: Callable[[], Any]) -> bool:
    """Whether one of the disjuncts is defined (does not divide by zero) and true."""
    for disjunct in disjuncts:
        try:
            if disjunct():
                return True
        except (ZeroDivisionError, ValueError, OverflowError):
            continue
    return False


def _all_defined(*conjuncts: Callable[[], Any]) -> bool:
    """False where a conjunct is defined and false, whatever the others; True where
    every conjunct is defined and true; otherwise the first conjunct's failure is
    raised (the choice between versions would divide by zero there too)."""
    failure = None
    for conjunct in conjuncts:
        try:
            if not conjunct():
                return False
        except (ZeroDivisionError, ValueError, OverflowError) as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    return True


def holds(function: Callable, values: Sequence[int]) -> bool:
    """``function(*values)`` as a bool; False where it divides by zero (the model's
    computation of the condition fails there)."""
    try:
        return bool(function(*values))
    except (ZeroDivisionError, ValueError, OverflowError):
        return False


def constants_of(*conditions: sympy.Basic) -> list[int]:
    """The integers written in conditions, small ones first (0 left out)."""
    numbers: set[int] = set()
    for condition in conditions:
        numbers |= {abs(int(a)) for a in condition.atoms(sympy.Integer) if abs(int(a)) < 10**6}
    return sorted(numbers - {0})


def suggested_sizes(base: int, constants: Sequence[int]) -> list[int]:
    """Sizes the constants of a condition suggest, then small sizes and sizes around
    the example's ``base``, each once and never ``base``."""
    candidates: list[int] = []
    for constant in constants:
        candidates += [constant + 1, constant - 1, constant]
    for first, second in itertools.combinations_with_replacement(constants, 2):
        product = first * second
        candidates += [product, product + 1, product - 1]
    candidates += list(range(18))
    candidates += [base + 1, base - 1, base + 2, base - 2, 2 * base, 2 * base + 1]
    candidates += [64, 129, 1025]
    return _unique(candidates, base)


def scanned_sizes(base: int, constants: Sequence[int]) -> tuple[int, ...]:
    """:func:`suggested_sizes`, then every other size up to a bound."""
    return _scanned_sizes(base, tuple(constants))


@functools.lru_cache(maxsize=1024)
def _scanned_sizes(base: int, constants: tuple[int, ...]) -> tuple[int, ...]:
    # asked again for every block of every search (1162 times in the export of a
    # decoder for generation, each listing hundreds of sizes): kept
    suggested = suggested_sizes(base, constants)
    bound = max(SCAN_BOUND, 4 * base + 1)
    return tuple(suggested + _unique(range(bound), base, set(suggested)))


def _unique(values, base: int, seen: set[int] | None = None) -> list[int]:
    seen = set() if seen is None else set(seen)
    result = []
    for value in values:
        if value >= 0 and value != base and value not in seen:
            seen.add(value)
            result.append(value)
    return result


def moves(
    base: Mapping[Any, int], focus: Sequence[Any], constants: Sequence[int]
) -> Iterator[dict[Any, int]]:
    """Changes of the assignment ``base``: one variable of ``focus`` moved, then one of
    ``focus`` with any other variable (``k == max(0, m - 4)`` kept while ``m - 4 != 1``
    breaks), then two others."""
    for fixed, variable, values in move_blocks(base, focus, constants):
        for value in values:
            yield {**fixed, variable: value}


def move_blocks(
    base: Mapping[Any, int], focus: Sequence[Any], constants: Sequence[int]
) -> Iterator[tuple[dict[Any, int], Any, Sequence[int]]]:
    """:func:`moves` by blocks ``(fixed, variable, values)``: the changes
    ``{**fixed, variable: value}`` for each value in turn, in the same order. A search
    evaluates once per block what does not read ``variable``."""
    for variable in focus:
        yield {}, variable, scanned_sizes(base[variable], constants)
    others = [v for v in base if v not in focus]
    pairs = [*itertools.permutations(focus, 2), *itertools.product(focus, others)]
    for first, second in pairs:
        for a in suggested_sizes(base[first], constants)[:PAIR_VALUES]:
            yield {first: a}, second, scanned_sizes(base[second], constants)


def satisfying_moves(
    base: Mapping[sympy.Symbol, int],
    conditions: Sequence[sympy.Basic],
    focus: Sequence[sympy.Symbol],
    constants: Sequence[int],
    budget: int,
) -> Iterator[dict[sympy.Symbol, int]]:
    """The assignments ``{**base, **changes}`` where every condition holds, for the
    first ``budget`` changes :func:`moves` gives, in its order.

    The conditions compile once (:func:`compile_condition`); within a block of
    :func:`move_blocks`, those that do not read the moving variable are evaluated once
    for the block: a search whose conditions cannot hold together (a side below a
    declared minimum) rejects a block of 300 candidates in one evaluation instead of
    300 (it spent the whole budget candidate by candidate, 20 ms a search)."""
    symbols = list(base)
    functions = [compile_condition(c, symbols) for c in conditions]
    reads = [c.free_symbols for c in conditions]
    for fixed, variable, values in move_blocks(base, focus, constants):
        if budget <= 0:
            break
        values = values[:budget]
        budget -= len(values)
        assignment = {**base, **fixed}
        constant = [f for f, read in zip(functions, reads) if variable not in read]
        at_block = [assignment[s] for s in symbols]
        if not all(holds(f, at_block) for f in constant):
            continue
        moving = [f for f, read in zip(functions, reads) if variable in read]
        for value in values:
            assignment[variable] = value
            candidate = [assignment[s] for s in symbols]
            if all(holds(f, candidate) for f in moving):
                yield dict(assignment)


def co_moved(base: Mapping[str, int], changes: Mapping[str, int]) -> dict[str, int] | None:
    """``base`` with ``changes``, and every other size that is the sum of two sizes
    of ``base`` (one of them changed) moved with them: ``total`` (6) of ``past`` (5)
    and ``seq`` (1) becomes 7 when ``seq`` becomes 2. A model relates its inputs'
    sizes so (a mask over the cache and the new tokens) before its code says so: an
    example at other sizes must keep the relation for eager to run. None when no
    other size moves. A coincidence (``batch`` 2 of ``seq + seq``) costs one eager
    run that fails."""
    changed = {name for name, value in changes.items() if value != base[name]}
    moved = {**base, **changes}
    for name, value in base.items():
        if name in changed:
            continue
        for a, b in itertools.combinations_with_replacement(sorted(base), 2):
            if name not in (a, b) and {a, b} & changed and base[a] + base[b] == value:
                moved[name] = moved[a] + moved[b]
                break
    return moved if any(moved[n] != base[n] for n in base if n not in changed) else None


def co_moved_inside(dims: Any, base: Mapping[str, int], changes: Mapping[str, int]) -> Any:
    """:func:`co_moved` when it stays inside the declared ranges of ``dims`` (a
    tracer's :class:`~.symbolic.SymbolicDimensions`), else None."""
    moved = co_moved(base, changes)
    if moved is None:
        return None
    for name, size in moved.items():
        low, high = dims.declared.get(dims.by_name[name].node._expr, (0, None))
        if size < low or (high is not None and size > high):
            return None
    return moved


def tensor_like(example: torch.Tensor, shape: Sequence[int], generator) -> torch.Tensor:
    """A tensor of ``shape`` whose values look like ``example``'s."""
    if example.numel() == 0:
        return torch.zeros(shape, dtype=example.dtype)
    if example.dtype == torch.bool:
        if bool(example.all()) or not bool(example.any()):
            return torch.full(shape, bool(example.flatten()[0]), dtype=torch.bool)
        return torch.randint(0, 2, tuple(shape), generator=generator).to(torch.bool)
    low, high = example.min(), example.max()
    if bool(low == high):
        return torch.full(shape, low.item(), dtype=example.dtype)
    if not example.dtype.is_floating_point:
        # Integer inputs are often indices (token ids): stay in the example's range.
        return torch.randint(
            int(low), int(high) + 1, tuple(shape), generator=generator, dtype=example.dtype
        )
    mean = example.float().mean()
    std = example.float().std()
    values = torch.randn(tuple(shape), generator=generator) * std + mean
    return values.to(example.dtype)


__all__ = [
    "compile_condition",
    "constants_of",
    "holds",
    "move_blocks",
    "moves",
    "satisfying_moves",
    "scanned_sizes",
    "suggested_sizes",
    "tensor_like",
]
