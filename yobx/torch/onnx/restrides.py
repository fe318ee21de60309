"""Restrides that leave every value where it is, removed from a lowered graph.

torch's decompositions restore a memory format with ``aten.as_strided_`` on a tensor
they just computed (``adaptive_avg_pool2d`` of a transposed input gives
``as_strided_(mean, [b, c, 1, 1], [c, 1, c, c])``). ONNX has no strides and torch_lib
has no translation for it. When the sizes stay the same, the offset is 0 and every
dimension of more than one element keeps its stride, each element keeps its place:
the node is its input.
"""

from __future__ import annotations

from typing import Any

import torch

from yobx.torch.fx_code import recompile_alone

_RESTRIDES = (torch.ops.aten.as_strided_.default, torch.ops.aten.as_strided.default)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        ea = a.node.expr if isinstance(a, torch.SymInt) else a
        eb = b.node.expr if isinstance(b, torch.SymInt) else b
        return bool(ea == eb)
    return a == b


def _keeps_values(node: torch.fx.Node) -> bool:
    source = node.args[0]
    offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset", 0)
    if not isinstance(source, torch.fx.Node) or offset not in (0, None):
        return False
    before, after = source.meta.get("val"), node.meta.get("val")
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return False
    if before.dim() != after.dim() or before.storage_offset() != 0:
        return False
    for size, other, stride, kept in zip(
        before.shape, after.shape, before.stride(), after.stride()
    ):
        if not _same(size, other):
            return False
        if not _same(size, 1) and not _same(stride, kept):
            return False
    return True


def drop_restrides(graph_module: torch.fx.GraphModule) -> int:
    """Replaces each ``as_strided(_)`` keeping every value in place by its input;
    returns how many were removed."""
    removed = 0
    for node in list(graph_module.graph.nodes):
        if node.op == "call_function" and node.target in _RESTRIDES and _keeps_values(node):
            node.replace_all_uses_with(node.args[0])
            graph_module.graph.erase_node(node)
            removed += 1
    if removed:
        recompile_alone(graph_module)
    return removed
