"""Other sizes to validate an export with, inside the capture's constraints.

The dynamic dimensions of a capture are ShapeEnv symbols. What the capture adopted
from the example is already in the ShapeEnv: ranges narrowed (``seq <= 128``), equal
or related dimensions replaced by one another (``total == cache + seq``), divisible
ones written ``2*q`` (``dim % 2 == 0``). Choosing values for the remaining free
symbols and computing every input size from them therefore respects those
constraints; the others (``h * w != 1``) are checked on each candidate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree

from yobx.torch.tracing.constraints.size_search import tensor_like
from yobx.torch.tracing.inputs import bind_arguments, call_arguments

#: steps tried, in order, to move a dimension away from its example size
_STEPS = (3, 1, 2, 5, -1, 7, -2, 11)
#: when none of them is admissible (``side * side == n``: only squares), sizes up to
#: this many times the example's (and at least up to ``_WIDER_MINIMUM``) are tried,
#: nearest first, until two are admissible
_WIDER_FACTOR = 4
_WIDER_MINIMUM = 64


def free_symbols(placeholder_values: Sequence[Any], shape_env: Any) -> list[sympy.Symbol]:
    """The independent symbols the inputs' sizes are written with, sorted by name."""
    symbols: set[sympy.Symbol] = set()
    for value in placeholder_values:
        sizes = value.shape if isinstance(value, torch.Tensor) else [value]
        for dim in sizes:
            if isinstance(dim, torch.SymInt):
                symbols |= shape_env.replace(dim.node.expr).free_symbols
    return sorted(symbols, key=lambda s: s.name)


def _hints(shape_env: Any, symbols: Sequence[sympy.Symbol]) -> dict:
    hints = getattr(shape_env, "backed_var_to_val", None)
    if hints is None:
        hints = shape_env.var_to_val
    return {s: int(hints[s]) for s in symbols if s in hints}


def example_assignment(placeholder_values: Sequence[Any], shape_env: Any) -> dict:
    """The example's size of every independent symbol of the inputs."""
    return _hints(shape_env, free_symbols(placeholder_values, shape_env))


def _in_range(shape_env: Any, symbol: sympy.Symbol, value: int) -> bool:
    ranges = getattr(shape_env, "var_to_range", {}).get(symbol)
    if value < 0:
        return False
    if ranges is None:
        return True
    return bool(ranges.lower <= value <= ranges.upper)


def _admissible(shape_env: Any, conditions: Sequence[sympy.Basic], assignment: dict) -> bool:
    # conditions may be written with symbols of the same names without sympy's
    # positivity (see SymbolicDimensions.twin): they are matched by name
    symbols = {s.name: s for s in shape_env.var_to_range}
    for condition in conditions:
        condition = condition.xreplace(
            {s: symbols[s.name] for s in condition.free_symbols if s.name in symbols}
        )
        if shape_env.replace(condition).xreplace(assignment) not in (sympy.true, True):
            return False
    return True


def size_variants(
    placeholder_values: Sequence[Any],
    shape_env: Any,
    dimension_names: Mapping[str, str],
    conditions: Sequence[sympy.Basic] = (),
    named: Mapping[str, sympy.Expr] | None = None,
) -> list[tuple[str, dict]]:
    """Symbol assignments to validate with: each dynamic dimension changed alone, then
    all of them together, every assignment inside the ranges and ``conditions``.

    :param placeholder_values: the fake values of the graph's inputs
    :param shape_env: their ShapeEnv
    :param dimension_names: ShapeEnv symbol name -> user name (for labels)
    :param conditions: the adopted constraints, on ShapeEnv symbols
    :param named: the user's dimensions, name -> expression, for the labels; by default
        the symbols themselves
    :return: ``(label, {symbol: size})`` pairs; the label gives the dimensions' sizes
    """
    symbols = free_symbols(placeholder_values, shape_env)
    base = _hints(shape_env, symbols)
    # a relation the conditions state (total == past + seq) moves its dimensions
    # together: one of them follows the others instead of being moved alone
    dependents = _dependents(shape_env, conditions, base)
    ordered = [s for s in symbols if s in base and s not in dependents]

    def label(assignment: dict) -> str:
        if named:
            values = {
                name: shape_env.replace(expr).xreplace(assignment) for name, expr in named.items()
            }
            changed = {
                name: v
                for name, v in values.items()
                if v != shape_env.replace(named[name]).xreplace(base)
            }
        else:
            changed = {
                dimension_names.get(s.name, s.name): v
                for s, v in assignment.items()
                if v != base[s]
            }
        return ",".join(f"{name}={int(v)}" for name, v in changed.items())

    def candidate(symbol_steps: dict) -> dict | None:
        assignment = dict(base)
        for symbol, step in symbol_steps.items():
            value = base[symbol] + step
            if not _in_range(shape_env, symbol, value):
                return None
            assignment[symbol] = value
        for symbol, expression in dependents.items():
            # an expression that is one symbol gives the assigned number itself (a Python
            # int); one the conditions pin is a number (`past` 0 on an empty cache)
            value = sympy.sympify(sympy.sympify(expression).xreplace(assignment))
            if not value.is_Integer or not _in_range(shape_env, symbol, int(value)):
                return None
            assignment[symbol] = int(value)
        return assignment if _admissible(shape_env, conditions, assignment) else None

    variants = []
    alone: dict[sympy.Symbol, list[int]] = {}
    for symbol in ordered:
        alone[symbol] = [step for step in _STEPS if candidate({symbol: step}) is not None]
        if not alone[symbol]:
            alone[symbol] = _wider_steps(
                base[symbol], lambda step, symbol=symbol: candidate({symbol: step})
            )
        if alone[symbol]:
            step = alone[symbol][0]
            variants.append((label(candidate({symbol: step})), candidate({symbol: step})))
    # all together, also for one dimension: each gets two sizes besides the example's
    seen = [assignment for _, assignment in variants]
    for steps in _together(ordered, alone):
        assignment = candidate(steps)
        if assignment is not None and assignment not in seen:
            variants.append((label(assignment), assignment))
            break
    return variants


def _dependents(
    shape_env: Any, conditions: Sequence[sympy.Basic], base: Mapping[sympy.Symbol, int]
) -> dict[sympy.Symbol, sympy.Expr]:
    """Symbols the conditions fix from the others: each equality (``Eq(a, b)``, or the
    pair ``a >= b`` and ``a <= b`` that versions write) linear in the symbols, solved
    for a symbol of coefficient 1 or -1 (the one of largest example size: the sum of a
    relation such as ``total == past + seq``), as long as the example satisfies it."""
    symbols = {s.name: s for s in base}
    bounds: dict[sympy.Expr, set[str]] = {}
    for condition in conditions:
        condition = shape_env.replace(
            condition.xreplace(
                {x: symbols[x.name] for x in condition.free_symbols if x.name in symbols}
            )
        )
        parts = condition.args if isinstance(condition, sympy.And) else (condition,)
        for part in parts:
            if isinstance(part, (sympy.Eq, sympy.Ge, sympy.Le, sympy.Gt, sympy.Lt)):
                difference = sympy.expand(part.lhs - part.rhs)
                kind = {sympy.Eq: "eq", sympy.Ge: "ge", sympy.Le: "le"}.get(type(part))
                if kind is None:
                    continue
                if kind != "eq" and (-difference) in bounds:
                    difference, kind = -difference, {"ge": "le", "le": "ge"}[kind]
                bounds.setdefault(difference, set()).add(kind)
    dependents: dict[sympy.Symbol, sympy.Expr] = {}
    for difference, kinds in bounds.items():
        if "eq" not in kinds and kinds != {"ge", "le"}:
            continue
        difference = difference.xreplace(dependents)
        free = [x for x in difference.free_symbols if x in base and x not in dependents]
        if not free or not difference.is_polynomial(*free):
            continue
        if difference.xreplace(base) != 0:
            continue
        choices = [
            x
            for x in free
            if sympy.Poly(difference, *free).degree(x) == 1
            and abs(difference.coeff(x)) == 1
            and not difference.coeff(x).free_symbols
        ]
        if not choices:
            continue
        chosen = max(choices, key=lambda x: (base[x], x.name))
        solved = sympy.expand(chosen - difference / difference.coeff(chosen))
        dependents = {k: v.xreplace({chosen: solved}) for k, v in dependents.items()}
        dependents[chosen] = solved
    return dependents


def _wider_steps(size: int, candidate) -> list[int]:
    """The first two admissible steps (``candidate(step)`` not None) from ``size`` to
    the sizes up to ``max(_WIDER_FACTOR * size, _WIDER_MINIMUM)``, nearest first."""
    bound = max(_WIDER_FACTOR * size, _WIDER_MINIMUM)
    steps = sorted((s - size for s in range(bound + 1) if s - size not in _STEPS), key=abs)
    found = []
    for step in steps:
        if step != 0 and candidate(step) is not None:
            found.append(step)
            if len(found) == 2:
                break
    return found


def _together(symbols: Sequence[sympy.Symbol], alone: Mapping[Any, list[int]]):
    """Steps moving every symbol at once: the same step for all first, then
    combinations of the steps each symbol accepted alone (a bounded number)."""
    if not symbols:
        return
    for step in (1, 2, -1, 4, 6):
        yield {s: step for s in symbols}
    choices = [alone[s] or [0] for s in symbols]
    for k in range(max(len(c) for c in choices)):
        yield {s: c[min(k, len(c) - 1)] for s, c in zip(symbols, choices)}
    for k in range(1, 16):
        # the steps each symbol accepts, shifted per symbol: varied combinations
        yield {s: c[(k + i) % len(c)] for i, (s, c) in enumerate(zip(symbols, choices))}


def inputs_for_sizes(
    model: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any],
    placeholder_values: Sequence[Any],
    shape_env: Any,
    assignment: Mapping[Any, int],
    seed: int = 0,
) -> tuple[tuple, dict]:
    """Builds inputs like the example ones with the dynamic dimensions set to
    ``assignment`` (symbol -> size); ints declared dynamic take their new value."""
    sizes = sizes_for_assignment(placeholder_values, shape_env, assignment)
    return inputs_with_sizes(model, args, kwargs, placeholder_values, sizes, seed)


def sizes_for_assignment(
    placeholder_values: Sequence[Any], shape_env: Any, assignment: Mapping[Any, int]
) -> dict[tuple[int, int | None], int]:
    """Every size of every input, ``(input index, axis) -> size`` (axis None: the value
    of an int declared dynamic), for the dynamic dimensions set to ``assignment``."""

    def size(dim: Any) -> int:
        if isinstance(dim, torch.SymInt):
            return int(shape_env.replace(dim.node.expr).xreplace(dict(assignment)))
        return int(dim)

    sizes: dict[tuple[int, int | None], int] = {}
    for index, fake in enumerate(placeholder_values):
        if isinstance(fake, torch.Tensor):
            for axis, dim in enumerate(fake.shape):
                sizes[index, axis] = size(dim)
        elif isinstance(fake, torch.SymInt):
            sizes[index, None] = size(fake)
    return sizes


def inputs_with_sizes(
    model: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any],
    placeholder_values: Sequence[Any],
    sizes: Mapping[tuple[int, int | None], int],
    seed: int = 0,
) -> tuple[tuple, dict]:
    """Builds inputs like the example ones with the sizes ``sizes`` gives:
    ``(input index, axis) -> size`` (axis None: the value of an int declared dynamic);
    sizes it does not give are the example's.

    The sizes need not be consistent with one another: inputs outside the constraints
    of a model (which it must refuse) are built the same way.
    """
    bound = bind_arguments(model.forward, tuple(args), dict(kwargs))
    leaves, spec = pytree.tree_flatten(list(bound.values()))
    if len(placeholder_values) != len(leaves):
        raise ValueError(
            f"{len(leaves)} flat inputs but the graph has {len(placeholder_values)} placeholders"
        )
    generator = torch.Generator().manual_seed(seed)
    new_leaves = list(leaves)
    for index, (leaf, fake) in enumerate(zip(leaves, placeholder_values)):
        if isinstance(leaf, torch.Tensor) and isinstance(fake, torch.Tensor):
            shape = [sizes.get((index, axis), int(d)) for axis, d in enumerate(leaf.shape)]
            new_leaves[index] = tensor_like(leaf, shape, generator)
        elif isinstance(fake, torch.SymInt):
            new_leaves[index] = sizes.get((index, None), leaf)
    values = pytree.tree_unflatten(new_leaves, spec)
    return call_arguments(model.forward, dict(zip(bound.keys(), values)))
