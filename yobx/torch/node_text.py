"""Text about torch.fx nodes for messages: where a node comes from in the user's code,
what it calls, a one-line description. One place for every layer (passes, tracing,
onnx), so that errors read the same everywhere."""

from __future__ import annotations

import re

import torch
from torch.fx import Node


def source_line(node: Node | None, missing: str = "") -> str:
    """The user's source line a node comes from, as recorded by the tracer
    (``node.meta["stack_trace"]``): ``File "model.py", line 12, in forward x = ...``.

    :param node: the node (None gives ``missing``)
    :param missing: the text when no stack trace was recorded
    """
    trace = node.meta.get("stack_trace") if node is not None else None
    if not trace:
        return missing
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    # the trace ends with the 'File ..., line N' header followed by the source line:
    # the header is what users click on, the source line says what
    files = [i for i, line in enumerate(lines) if line.startswith("File ")]
    if not files:
        return lines[-1]
    last = files[-1]
    return " ".join(lines[last : last + 2])


def target_name(node: Node) -> str:
    """Returns a readable name for the target of a node."""
    target = node.target
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    return f"{module}.{name}" if module else name


def node_location(node: Node | None) -> str:
    """The user's ``file:line`` recorded on ``node``, or an empty string."""
    if node is None:
        return ""
    stack = node.meta.get("stack_trace") or ""
    found = re.findall(r'File "([^"]+)", line (\d+)', stack)
    return f"{found[-1][0]}:{found[-1][1]}" if found else ""


def operation_name(node: Node) -> str:
    """What a node runs, for messages: ``method 'add_'``, ``module 'layers.0'`` or the
    qualified name of the function."""
    if node.op == "call_method":
        return f"method {node.target!r}"
    if node.op == "call_module":
        return f"module {node.target!r}"
    return target_name(node)


def describe(node: Node) -> str:
    """A one-line description of a node for error messages."""
    where = source_line(node, "unknown source line (the tracer did not record a stack trace)")
    return f"node {node.name!r} ({node.op} {target_name(node)}) at {where}"
