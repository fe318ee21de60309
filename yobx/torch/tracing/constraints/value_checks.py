"""Checks on tensor values: ``assert`` and ``torch._check`` kept as graph nodes.

A model may check what its inputs hold (``assert lengths.max() <= x.shape[1]``,
``torch._check(n.item() >= 0)``). The tracer cannot decide such a condition from the
example: it depends on values, not sizes. torch.export keeps it as a runtime assertion
in the graph; so does the tracer: the condition becomes a :func:`check_value` node,
which raises ``AssertionError`` when the graph runs on values breaking it (as eager
does), and the trace goes on as on the side where it holds. The ONNX export checks it
too (:mod:`yobx.torch.onnx.value_checks`).

Only these two forms are checks: an ``if`` on tensor values still has two sides and
stays refused (``torch.cond`` writes it).
"""

from __future__ import annotations

import dis
import types
from typing import Any

import torch
import torch.fx
from torch.fx.proxy import Proxy

from ...passes import register_untouched_functions

#: per code object: the offsets of the instructions deciding an ``assert`` statement
_ASSERT_OFFSETS: dict[types.CodeType, frozenset[int]] = {}
#: instructions that may sit between the one converting the condition to a bool and the
#: jump over the ``raise AssertionError`` (Python 3.13 adds TO_BOOL)
_BETWEEN = {"TO_BOOL", "CACHE", "NOT_TAKEN"}


def asserting(frame: types.FrameType | None) -> bool:
    """Whether ``frame`` is converting the condition of an ``assert`` statement to a
    bool (its current instruction leads to the jump over ``LOAD_ASSERTION_ERROR``)."""
    if frame is None:
        return False
    code = frame.f_code
    offsets = _ASSERT_OFFSETS.get(code)
    if offsets is None:
        offsets = _ASSERT_OFFSETS.setdefault(code, _assert_offsets(code))
    return frame.f_lasti in offsets


def _assert_offsets(code: types.CodeType) -> frozenset[int]:
    """The offsets of the instructions converting an ``assert``'s condition: the jump
    ``POP_JUMP_*IF_TRUE`` followed by ``LOAD_ASSERTION_ERROR``, and what precedes the
    jump in :data:`_BETWEEN`."""
    instructions = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    offsets: set[int] = set()
    for position, instruction in enumerate(instructions[:-1]):
        if "IF_TRUE" not in instruction.opname:
            continue
        if instructions[position + 1].opname != "LOAD_ASSERTION_ERROR":
            continue
        offsets.add(instruction.offset)
        before = position - 1
        while before >= 0 and instructions[before].opname in _BETWEEN:
            offsets.add(instructions[before].offset)
            before -= 1
    return frozenset(offsets)


@torch.fx.node.has_side_effect
def check_value(condition: Any, expression: str, location: str) -> None:
    """Raises ``AssertionError`` when ``condition`` (a tensor, every element of it, or
    a bool) is false: a check on values the model makes (``assert``, ``torch._check``).

    :param condition: a boolean tensor or a Python bool
    :param expression: the source of the check (``assert lengths.max() <= n``)
    :param location: the user's ``file:line``
    """
    if isinstance(condition, Proxy):
        # the graph is traced again (torch.fx.symbolic_trace of the GraphModule)
        condition.tracer.create_proxy(
            "call_function", check_value, (condition, expression, location), {}
        )
        return
    if isinstance(condition, (torch._subclasses.FakeTensor, torch.SymBool)):
        return  # fake values (a lowering re-running the graph): decided when it runs
    holds = bool(condition.all()) if isinstance(condition, torch.Tensor) else bool(condition)
    if not holds:
        where = f"{location}: " if location else ""
        raise AssertionError(f"{where}the check `{expression}` of the model fails")


# a check reads values and raises: nothing for the graph passes to rewrite
register_untouched_functions(check_value)


__all__ = ["asserting", "check_value"]
