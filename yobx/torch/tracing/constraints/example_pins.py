"""A dimension declared dynamic that the example's capture holds at one size.

``if n < 3:`` traced with ``n`` at 2 decides nothing equal, but the default range of
``n`` starts at 2: torch's ShapeEnv narrows ``n`` to ``[2, 2]`` and makes it the constant
2 in the whole capture. Versions then join graphs whose inputs have a constant size:
the ONNX model declares that axis static (``to_onnx`` refused: "'batch' is 2 in the
ONNX model") although the joined graph chooses right at every size.

As for ``if n == 2``, the tracer then captures the model from sizes where the
dimension is free first (see ``CustomTracer._trace_from_other_size``), and the
example's side becomes one of its versions (with the sizes below it, see
``versions.pinned_sizes``).
"""

from __future__ import annotations

from typing import Any

import sympy

from ..dynamic_shapes import DYNAMIC
from ..errors import SpecializationError


def example_pin(tracer: Any) -> SpecializationError | None:
    """The error standing for the first dimension declared dynamic (not ``Dim.AUTO``)
    that the last capture holds at one size through inequalities, with the equality as
    its ``fact`` and the line of the first decision on it as its location; None when
    there is none."""
    dims = tracer.dims
    if dims is None or tracer.refinements is None:
        return None
    for name, symint in dims.by_name.items():
        symbol = symint.node._expr
        if not isinstance(symbol, sympy.Symbol) or dims.policy_of(symbol) != DYNAMIC:
            continue
        bounds = dims.shape_env.var_to_range.get(symbol)
        if bounds is None or bounds.lower != bounds.upper:
            continue
        size = int(bounds.lower)
        decisions = [
            f.constraint for f in tracer.refinements.adopted if name in f.constraint.dimensions
        ]
        if not decisions:
            continue  # declared so (a range of one size): nothing the example decided
        first = decisions[0]
        error = SpecializationError.at(
            first.location,
            f"`{first.expression}` holds dimension {name!r} at {size} (its size in the "
            f"example) with its range, but it is declared dynamic",
            expression=f"{name} == {size}",
            dimensions=(name,),
        )
        error.fact = sympy.Eq(sympy.Symbol(name, integer=True), size)
        error.pinned_by_ranges = True
        return error
    return None
