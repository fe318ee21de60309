"""What sympy settles for an empty dimension without asking.

ShapeEnv symbols are positive for sympy, which folds expressions on them when they are
built: no guard, no decision, and the graph keeps, at size 0, what holds from 1 on.

* The length of ``x[:, :1]`` over a dimension ``s`` is ``min(1, s)``, folded to ``1``:
  the graph keeps a length of 1 where eager's slice of an empty dimension has length 0
  (``x[:, :1].new_zeros(...)``, a reshape by that length...). The same holds for
  ``x[:, -1:]`` and ``x[..., 0:1]``. Decisions torch does take there (``x[:, :2]``:
  ``2 <= s``) are watched elsewhere
  (``FakeExecutionMixin._watch_default_bound_decisions``); the folded lengths are found
  by recomputing each sliced length at ``s = 0`` with Python's own slicing (which
  clamps as torch does) and comparing it with the traced length there.
* ``max(s, 1)`` is ``s``: the node computes the right value when the graph runs, but
  what the trace derived from it (``s // max(s, 1)`` folded to 1) holds from 1 on only.
  (``min(s, 1)`` is the constant 1, judged as every number a trace folds.)

Each gives the condition ``s >= 1`` it rests on, which the tracer judges as a decision
the default range took: a version captures the empty dimension.
"""

from __future__ import annotations

import operator
from typing import Any

import sympy
import torch
from torch.fx.node import Node


def _expr(value: Any) -> sympy.Basic | None:
    """The sympy expression of a size or bound (an int's Integer), None otherwise."""
    if isinstance(value, torch.SymInt):
        return value.node.expr
    if type(value) is int:
        return sympy.Integer(value)
    return None


def _sliced_axes(index: Any, ndim: int) -> list[tuple[int, int, slice]] | None:
    """``(input axis, output axis, slice)`` for each slice of a basic index (slices,
    integers, None, Ellipsis); None for any other index (tensors, lists, booleans)."""
    items = index if isinstance(index, tuple) else (index,)
    consuming = sum(1 for item in items if type(item) is slice or _is_integer(item))
    if consuming > ndim or sum(item is Ellipsis for item in items) > 1:
        return None
    found, axis, out = [], 0, 0
    for item in items:
        if item is Ellipsis:
            skipped = ndim - consuming
            axis, out = axis + skipped, out + skipped
        elif item is None:
            out += 1
        elif type(item) is slice:
            found.append((axis, out, item))
            axis, out = axis + 1, out + 1
        elif _is_integer(item):
            axis += 1
        else:
            return None
    return found


def _is_integer(item: Any) -> bool:
    return type(item) is int or isinstance(item, torch.SymInt)


def _value_at(expr: sympy.Basic, values: dict) -> int | None:
    """``expr`` at the sizes ``values``, None where it is no integer (a division by
    a size that is 0 there, where eager raises too)."""
    try:
        value = expr.xreplace(values)
    except (ZeroDivisionError, TypeError, ValueError):
        return None
    return int(value) if value.is_Integer else None


def _length_at(
    length: sympy.Basic, bounds: slice, values: dict[sympy.Symbol, sympy.Integer]
) -> int | None:
    """The length eager's slice ``bounds`` has over a dimension of size ``length`` at
    the sizes ``values`` (None when one of them is not a number there)."""
    size = _value_at(length, values)
    if size is None or size < 0:
        return None
    parts = []
    for bound in (bounds.start, bounds.stop, bounds.step):
        expr = _expr(bound) if bound is not None else None
        value = _value_at(expr, values) if expr is not None else None
        if bound is not None and value is None:
            return None
        parts.append(value)
    if parts[2] is not None and parts[2] <= 0:
        return None
    return len(range(size)[slice(*parts)])


def _roots(default_min: set, replacements: dict) -> dict[sympy.Symbol, sympy.Symbol]:
    """The symbols standing for a dimension declared without a minimum, each with that
    dimension's symbol: itself, or the ``k`` of ``dim = 2*k`` once a version assumed
    ``dim % 2 == 0`` (``k`` is 0 where ``dim`` is)."""
    roots = {symbol: symbol for symbol in default_min}
    for symbol, replacement in replacements.items():
        if symbol not in default_min:
            continue
        coefficient, rest = replacement.as_coeff_Mul()
        if coefficient.is_Integer and coefficient != 0 and rest.is_Symbol:
            roots.setdefault(rest, symbol)
    return roots


def empty_slice_conditions(
    node: Node,
    args: tuple,
    val: Any,
    default_min: set,
    hint_of: Any,
    replacements: dict | None = None,
) -> list[sympy.Basic]:
    """The conditions ``s >= 1`` (unevaluated: sympy would fold them) that the lengths
    of the slices ``node`` takes rest on, for each dimension ``s`` declared without a
    minimum whose size 0 gives another length than the traced one (``x[:, :1]``: 1
    traced, 0 at ``s = 0``); none for any other node.

    :param args: the node's arguments as fake values
    :param val: the node's fake value
    :param default_min: the symbols of the dimensions declared without a minimum
    :param hint_of: the example's size of a symbol
    :param replacements: the ShapeEnv's replacements (``dim -> 2*k``)
    """
    if node.op != "call_function" or node.target is not operator.getitem or len(args) != 2:
        return []
    tensor, index = args
    if not isinstance(tensor, torch.Tensor) or not isinstance(val, torch.Tensor):
        return []
    axes = _sliced_axes(index, tensor.dim())
    if not axes:
        return []
    roots = _roots(default_min, replacements or {})
    conditions: list[sympy.Basic] = []
    for axis, out, bounds in axes:
        length, traced = _expr(tensor.shape[axis]), _expr(val.shape[out])
        if length is None or traced is None:
            continue
        symbols = set(length.free_symbols)
        for bound in (bounds.start, bounds.stop):
            expr = _expr(bound) if bound is not None else None
            symbols |= expr.free_symbols if expr is not None else set()
        for symbol in sorted(symbols & roots.keys(), key=str):
            try:
                values = {s: sympy.Integer(hint_of(s)) for s in symbols if s is not symbol}
            except KeyError:
                # a size computed from data or by an operator torch left unbacked
                # (`interpolate(scale_factor=2)`): no example value to compare at 0, so
                # the slice's length is not proved to hold there
                differs = True
            else:
                values[symbol] = sympy.Integer(0)
                eager, ours = _length_at(length, bounds, values), _value_at(traced, values)
                differs = eager is not None and ours is not None and ours != eager
            if differs:
                condition = sympy.Ge(roots[symbol], 1, evaluate=False)
                if condition not in conditions:
                    conditions.append(condition)
    return conditions


#: the extrema of sizes, as the traced code computes them
_EXTREMA = {torch.sym_max: sympy.Max, torch.sym_min: sympy.Min, max: sympy.Max, min: sympy.Min}


def folded_extremum_conditions(node: Node, args: tuple, val: Any) -> list[sympy.Basic]:
    """The condition (unevaluated) that a ``max``/``min`` of two sizes is the operand
    sympy folded it to on its positive symbols (``max(s, 1)`` is ``s``: ``s >= 1``);
    none when the extremum is not one of its operands or when nothing was folded."""
    if node.op != "call_function" or node.target not in _EXTREMA or len(args) != 2:
        return []
    result, operands = _expr(val), [_expr(a) for a in args]
    if result is None or result.is_number or None in operands:
        return []  # a constant extremum is judged as any folded value
    first, second = operands
    if result == first:
        kept, other = first, second
    elif result == second:
        kept, other = second, first
    else:
        return []
    larger = _EXTREMA[node.target] is sympy.Max
    return [
        sympy.Ge(kept, other, evaluate=False) if larger else sympy.Le(kept, other, evaluate=False)
    ]
