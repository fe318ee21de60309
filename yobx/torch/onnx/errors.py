"""Exceptions raised by the ONNX exporter."""

from __future__ import annotations

import re

import torch


def _user_source_line(node: torch.fx.Node | None) -> str:
    """Returns the last line of the user's stack recorded on ``node``, if any."""
    if node is None:
        return ""
    stack = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in stack.strip().splitlines() if line.strip()]
    # The stack trace ends with the 'File ..., line N' header followed by the source
    # line; the header is the part users can click on, the source line tells what.
    headers = [line for line in lines if line.startswith("File ")]
    if not headers:
        return lines[-1] if lines else ""
    last = headers[-1]
    index = lines.index(last)
    code = lines[index + 1] if index + 1 < len(lines) else ""
    return f"{last} {code}".strip()


def node_location(node: torch.fx.Node | None) -> str:
    """The user's ``file:line`` recorded on ``node``, or an empty string."""
    if node is None:
        return ""
    stack = node.meta.get("stack_trace") or ""
    found = re.findall(r'File "([^"]+)", line (\d+)', stack)
    return f"{found[-1][0]}:{found[-1][1]}" if found else ""


class OnnxExportError(RuntimeError):
    """Raised when a graph cannot be exported to ONNX.

    The message names the operator, the FX node and the user's source line when they
    are known, so the user can find what to rewrite.
    """

    def __init__(
        self,
        message: str,
        node: torch.fx.Node | None = None,
        target: str | None = None,
    ):
        self.node_name = node.name if node is not None else None
        self.target = target
        self.source = _user_source_line(node)
        parts = [message]
        if node is not None:
            parts.append(f"node '{node.name}' ({node.op} {target or node.target})")
        if self.source:
            parts.append(f"at {self.source}")
        super().__init__(", ".join(parts))


class UnsupportedOperatorError(OnnxExportError):
    """Raised when an operator has no ONNX translation."""
