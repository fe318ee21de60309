"""Decisions of the passes on symbolic sizes, true at every size the graph may take.

``statically_known_true`` answers from the ShapeEnv's ranges, and a dimension declared
without a minimum has torch.export's range ``[2, inf]`` there. The tracer's graphs still
run at sizes 1 and 0 (a decode step's one new token, an empty cache): its decisions are
proved again from 0 (see
:meth:`~yobx.torch.tracing.symbolic.symbolic.SymbolicDimensions.lowest_bound`) or checked
when the graph runs. A pass deciding from the ShapeEnv's ranges alone would remove
``y[: x.shape[0]]`` on a ``y`` of 2 rows as a full slice (``batch >= 2``), and the graph
would return 2 rows at batch 1. The passes decide with every lower bound of 2
lowered to 0, on symbols without sympy's positivity (which folds ``s >= 1`` by itself).
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._sympy.value_ranges import ValueRanges

#: torch.export's lower bound of a dynamic dimension, which the graph does not check
_DEFAULT_MIN = 2


def true_at_every_size(claim: Any) -> bool:
    """Whether ``claim`` (a bool or a SymBool) holds for every size, the dimensions
    whose lower bound is the default one taken from 0. False means "not shown"."""
    if not isinstance(claim, torch.SymBool):
        return bool(claim)
    if not statically_known_true(claim):
        return False
    node = claim.node
    shape_env = node.shape_env
    expr = node.expr
    relaxed = {
        s: ValueRanges(0, shape_env.var_to_range[s].upper)
        for s in expr.free_symbols
        if s in shape_env.var_to_range and shape_env.var_to_range[s].lower == _DEFAULT_MIN
    }
    if not relaxed:
        return True
    plain = {s: sympy.Symbol(f"{s.name}_from0", integer=True, nonnegative=True) for s in relaxed}
    ranges = {plain[s]: r for s, r in relaxed.items()}
    for s in expr.free_symbols - set(relaxed):
        if s in shape_env.var_to_range:
            ranges[s] = shape_env.var_to_range[s]
    try:
        answer = shape_env._maybe_evaluate_static(
            expr.xreplace(plain), var_to_range=tuple(ranges.items())
        )
    except AssertionError:
        # torch looks some symbols up in the ShapeEnv's own ranges (a replacement
        # reached through another symbol): not shown, the pass keeps the node
        return False
    return answer is not None and bool(answer)
