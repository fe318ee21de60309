"""Exceptions raised by the ONNX exporter."""

from __future__ import annotations

import torch

from ..node_text import source_line


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
        self.source = source_line(node)
        parts = [message]
        if node is not None:
            parts.append(f"node '{node.name}' ({node.op} {target or node.target})")
        if self.source:
            parts.append(f"at {self.source}")
        super().__init__(", ".join(parts))


class UnsupportedOperatorError(OnnxExportError):
    """Raised when an operator has no ONNX translation."""
