"""``x.squeeze(d)`` of a dynamic dimension decided to be 1, recorded as
``x.select(d, 0)``.

The tracer decides whether each dynamic dimension a ``squeeze`` is asked to remove is
1 (the rank of the output depends on it). When it is, torch's fake kernel still answers
"not 1" for a size it cannot prove to be 1 (``(batch//2)//2`` in the version where it
is): the node's value kept its rank while eager drops the dimension, and every step
reading the node's value (the ONNX lowering, which writes the output's rank from it)
was wrong. ``select(d, 0)`` of a dimension of size 1 is the squeezed tensor: the same
values, the same view, a value of the right rank whatever torch can prove.
"""

from __future__ import annotations

import torch
from torch.fx import Node


def squeeze_as_select(node: Node, args: tuple, kwargs: dict, decided_one: list[int]) -> tuple:
    """Rewrites ``node`` (a ``squeeze`` of one dimension, decided to be 1 and not a
    static 1) into ``select(dim, 0)``; returns the fake arguments to compute it with
    (``args, kwargs`` unchanged when the node is no such squeeze)."""
    if kwargs or len(args) != 2 or type(args[1]) is not int or len(decided_one) != 1:
        return args, kwargs
    if node.op == "call_method" and node.target == "squeeze":
        target: object = "select"
    elif node.op == "call_function" and node.target in (torch.squeeze, torch.Tensor.squeeze):
        target = torch.select
    else:
        # an in-place squeeze_ has no in-place select
        return args, kwargs
    (dim,) = decided_one
    node.target = target  # type: ignore[assignment]
    node.args = (node.args[0], dim, 0)
    return (args[0], dim, 0), {}


__all__ = ["squeeze_as_select"]
