"""The copies an in-place decomposition leaves in a lowered graph, made functional.

The decompositions of in-place operators write their result back: ``add_`` becomes
``prims.add`` then ``aten.copy_(destination, result)`` (``nn.RMSNorm`` adds its
epsilon in place). torch.onnx functionalizes its programs; the lowering's make_fx does
not, and ONNX has no ``copy_``. Where the destination is a tensor the graph made itself
(no input, no weight, not a view of another tensor, so that nothing else sees the
write) and the result has its shape and dtype, the copy is the result: every later use
of the destination reads the result instead.
"""

from __future__ import annotations

import torch
import torch.fx

from yobx.torch.fx_code import recompile_alone

_COPY = torch.ops.aten.copy_.default


def functional_copies(graph_module: torch.fx.GraphModule) -> int:
    """Replaces the ``copy_`` nodes described above, in every graph; returns how many."""
    count = 0
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        changed = 0
        order = {node: i for i, node in enumerate(module.graph.nodes)}
        for node in list(module.graph.nodes):
            if node.op == "call_function" and node.target is _COPY and _replaceable(node):
                destination, source = node.args[:2]
                for user in list(destination.users):
                    if user is not node and order[user] > order[node]:
                        user.replace_input_with(destination, source)
                node.replace_all_uses_with(source)
                module.graph.erase_node(node)
                changed += 1
        if changed:
            recompile_alone(module)
        count += changed
    return count


def _replaceable(node: torch.fx.Node) -> bool:
    destination, source = node.args[:2]
    if len(node.args) > 2 or node.kwargs:
        return False  # non_blocking and the like: not a decomposition's write-back
    if not isinstance(destination, torch.fx.Node) or not isinstance(source, torch.fx.Node):
        return False
    if destination.op != "call_function" or not isinstance(
        destination.target, torch._ops.OpOverload
    ):
        return False  # an input, a weight, or a value of unknown origin
    if _is_view(destination):
        return False  # a view: the write would reach its base
    if any(_is_view(user) for user in destination.users if user is not node):
        return False  # a view of it would see the write
    kept, written = destination.meta.get("val"), source.meta.get("val")
    return (
        isinstance(kept, torch.Tensor)
        and isinstance(written, torch.Tensor)
        and kept.dtype == written.dtype
        and kept.shape == written.shape
    )


def _is_view(node: torch.fx.Node) -> bool:
    """Whether ``node`` returns a view of an argument, or may (an unknown operation)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return node.op != "output"
    return any(r.alias_info is not None for r in node.target._schema.returns)


__all__ = ["functional_copies"]
