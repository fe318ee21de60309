"""Memoized arithmetic on symbolic sizes while tracing.

Every fake tensor with symbolic sizes makes ATen compute strides, element counts,
storage sizes and contiguity with ``SymInt`` arithmetic, and each operation calls
back into Python (``SymNode.mul``, ``SymNode.eq``...) to build a sympy expression:
about 15 of them per tensor, repeated over and over with the same operands
(``1 * s0``, ``Max(s1, 1)``, ``s1 >= 0``...). On a small transformer, 3,270 calls
have 211 distinct operand pairs.

:func:`memoized_symbolic_arithmetic` caches the result node per (operation,
operands) for the duration of a trace. A ``SymNode`` is an immutable value (its
expression is re-normalized by the ShapeEnv on every read), so sharing one between
equal computations changes nothing but the time.

The memo hands out a *copy* of the cached node, never the node itself: ``make_fx``
tracks which graph value computes each ``SymNode`` object, and a shared object could
make a size read from an unrelated tensor's stride (a valid but untranslatable
``sym_stride`` in the lowered graph). A copy is as new as a recomputed node, for a
fraction of the cost. Operations made while a proxy mode is active (symbolic
arithmetic ``make_fx`` records) always go through unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch.fx.experimental.proxy_tensor import get_proxy_mode
from torch.fx.experimental.sym_node import SymNode

from .patch_window import patch_window, register_undo
from .patches import memoized_replacements, patched_attributes

#: binary operations of ``SymNode`` (its ``_<name>`` implementations)
_BINARY = (
    "add",
    "sub",
    "mul",
    "mod",
    "int_floordiv",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "sym_min",
    "sym_max",
    "and_",
    "or_",
)


#: the memo of each open block, innermost last (the replacements read the last one)
_MEMOS: list[dict] = []


def _memoized(name: str, original):
    def binary(self: SymNode, other: SymNode) -> SymNode:
        if (
            not _MEMOS
            or type(other) is not SymNode
            or self.shape_env is None
            or other.shape_env is not self.shape_env
            or get_proxy_mode() is not None
        ):
            return original(self, other)
        memo = _MEMOS[-1]
        key = (name, id(self.shape_env), self.pytype, other.pytype, self.expr, other.expr)
        result = memo.get(key)
        if result is None:
            result = memo[key] = original(self, other)
        return SymNode(
            result._expr,
            result.shape_env,
            result.pytype,
            result._hint,
            result.constant,
            result.fx_node,
            optimized_summation=result._optimized_summation,
        )

    return binary


@memoized_replacements
def _replacements() -> list:
    # built once: the memo is not in the functions (they read _MEMOS), so the same
    # replacements and their thread gates serve every trace
    return [
        (SymNode, f"_{name}", _memoized(name, SymNode.__dict__[f"_{name}"]))
        for name in _BINARY
        if f"_{name}" in SymNode.__dict__
    ]


@contextlib.contextmanager
def memoized_symbolic_arithmetic() -> Iterator[None]:
    """Caches ``SymNode`` binary operations inside the block (restored on exit).

    Keys include the ShapeEnv: expressions of two traces never meet (the SymNodes in
    the memo keep their ShapeEnv alive, so its id cannot be reused meanwhile).
    """
    memo: dict = {}
    with patch_window():
        # journaled first: an interrupt right after the append still removes it
        undo = register_undo(lambda: _discard(memo))
        _MEMOS.append(memo)
        try:
            with patched_attributes(_replacements()):
                yield
        finally:
            undo()


def _discard(memo: dict) -> None:
    for index, open_memo in enumerate(_MEMOS):
        if open_memo is memo:
            del _MEMOS[index]
            return
