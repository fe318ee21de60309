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

The results outlive the trace: the next trace of the same model asks for the same
operations on the same symbols (a ShapeEnv names its symbols after their sources) and
the same example sizes. An operation's result is a function of the operands'
expressions (after the ShapeEnv's replacements), their hints, Python types and
summation flags only, which the process-wide key holds; ``mod``, which also reads the
ranges of the symbols, stays memoized per ShapeEnv.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch.fx.experimental.proxy_tensor import get_proxy_mode
from torch.fx.experimental.sym_node import SymNode

from yobx.torch.bounded_cache import BoundedCache

from ..isolation.patch_window import patch_window, register_undo
from ..isolation.patching import memoized_replacements, patched_attributes

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
    per_shape_env = name == "mod"

    def binary(self: SymNode, other: SymNode) -> SymNode:
        shape_env = self.shape_env
        if (
            not _MEMOS
            or type(other) is not SymNode
            or shape_env is None
            or other.shape_env is not shape_env
            or get_proxy_mode() is not None
            # the results then carry the ShapeEnv's own FX nodes
            or shape_env._translation_validation_enabled
        ):
            return original(self, other)
        if per_shape_env:
            memo = _MEMOS[-1]
            key: tuple = (name, id(shape_env), self.pytype, other.pytype, self.expr, other.expr)
        else:
            memo = _RESULTS
            key = (
                name,
                self.pytype,
                other.pytype,
                self.expr,
                other.expr,
                self._hint,
                other._hint,
                self._optimized_summation,
                other._optimized_summation,
            )
        result = memo.get(key)
        if result is None:
            computed = original(self, other)
            result = memo[key] = (
                computed._expr,
                computed.pytype,
                computed._hint,
                computed.constant,
                computed._optimized_summation,
            )
        return SymNode(
            result[0],
            shape_env,
            result[1],
            result[2],
            result[3],
            None,
            optimized_summation=result[4],
        )

    return binary


#: results of the operations of every trace, by operation, operands and hints; a few
#: large models' worth of distinct operations
_RESULTS: dict[tuple, tuple] = BoundedCache(100_000)


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
