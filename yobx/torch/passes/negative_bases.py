"""A negative number raised to a traced power, written so that the generated code
computes it.

torch.fx prints ``operator.pow(-1, x)`` as ``pow_1 = -1 ** x``, which Python reads
``-(1 ** x)``: always ``-1``, silently (``(-1) ** arange`` alternates the signs of a
patch embedding in diffusers' Cosmos autoencoder). The base becomes a node of its own,
``neg = -1``, and the power ``pow_1 = neg ** x``. Interpreting the graph
(``torch.fx.Interpreter``, the ONNX lowering) was right; only the generated ``forward``
was wrong.
"""

from __future__ import annotations

import operator

import torch.fx


def negative_bases_as_nodes(graph: torch.fx.Graph) -> int:
    """Replaces each negative number that is the base of an ``operator.pow`` node by a
    node computing it; returns how many."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not operator.pow or not node.args:
            continue
        base = node.args[0]
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not base < 0:
            continue
        with graph.inserting_before(node):
            negated = graph.call_function(operator.neg, (-base,))
        negated.meta["val"] = base
        node.args = (negated, *node.args[1:])
        count += 1
    return count


__all__ = ["negative_bases_as_nodes"]
