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

from yobx.torch.tracing.inputs import bind_arguments, call_arguments

#: steps tried, in order, to move a dimension away from its example size
_STEPS = (3, 1, 2, 5, -1, 7, -2, 11)


def free_symbols(placeholder_values: Sequence[Any], shape_env: Any) -> list[sympy.Symbol]:
    """The independent symbols the inputs' sizes are written with, sorted by name."""
    symbols: set[sympy.Symbol] = set()
    for value in placeholder_values:
        if isinstance(value, torch.Tensor):
            for dim in value.shape:
                if isinstance(dim, torch.SymInt):
                    symbols |= shape_env.replace(dim.node.expr).free_symbols
    return sorted(symbols, key=lambda s: s.name)


def _hints(shape_env: Any, symbols: Sequence[sympy.Symbol]) -> dict:
    hints = getattr(shape_env, "backed_var_to_val", None)
    if hints is None:
        hints = shape_env.var_to_val
    return {s: int(hints[s]) for s in symbols if s in hints}


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
    ordered = [s for s in symbols if s in base]

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
        return assignment if _admissible(shape_env, conditions, assignment) else None

    variants = []
    for symbol in ordered:
        for step in _STEPS:
            assignment = candidate({symbol: step})
            if assignment is not None:
                variants.append((label(assignment), assignment))
                break
    # all together, also for one dimension: each gets two sizes besides the example's
    seen = [assignment for _, assignment in variants]
    for step in (1, 2, -1, 4, 6):
        assignment = candidate({s: step for s in ordered}) if ordered else None
        if assignment is not None and assignment not in seen:
            variants.append((label(assignment), assignment))
            break
    return variants


def _new_tensor(example: torch.Tensor, shape: Sequence[int], generator) -> torch.Tensor:
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
    ``assignment`` (symbol -> size)."""
    bound = bind_arguments(model.forward, tuple(args), dict(kwargs))
    leaves, spec = pytree.tree_flatten(list(bound.values()))
    fakes = [v for v in placeholder_values if isinstance(v, torch.Tensor)]
    tensors = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    if len(fakes) != len(tensors):
        raise ValueError(
            f"{len(tensors)} tensor inputs but the graph has {len(fakes)} tensor placeholders"
        )
    generator = torch.Generator().manual_seed(seed)
    new_leaves = list(leaves)
    for index, fake in zip(tensors, fakes):
        shape = []
        for dim in fake.shape:
            if isinstance(dim, torch.SymInt):
                expr = shape_env.replace(dim.node.expr)
                shape.append(int(expr.xreplace(dict(assignment))))
            else:
                shape.append(int(dim))
        new_leaves[index] = _new_tensor(leaves[index], shape, generator)
    values = pytree.tree_unflatten(new_leaves, spec)
    return call_arguments(model.forward, dict(zip(bound.keys(), values)))
