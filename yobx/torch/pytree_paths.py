"""Key paths of a pytree, for containers registered without key paths too.

``torch.utils._pytree.tree_flatten_with_path`` needs each container type registered
with a ``flatten_with_keys_fn``. Some libraries register their output classes without
one (diffusers' ``BaseOutput``: ``Transformer2DModelOutput``, ``UNet2DConditionOutput``,
``DecoderOutput``...), and the path of their tensors is then unknown to torch: the ONNX
export names outputs and inputs after those paths.
"""

from __future__ import annotations

from typing import Any

import torch.utils._pytree as pytree


def flatten_with_paths(tree: Any) -> list[tuple[tuple, Any]]:
    """``(key path, leaf)`` for every leaf of ``tree``, as
    ``pytree.tree_flatten_with_path`` returns them; the children of a container
    registered without ``flatten_with_keys_fn`` are keyed by the names its context
    lists, one per child (``MappingKey``), or by their position (``SequenceKey``)."""
    try:
        return pytree.tree_flatten_with_path(tree)[0]
    except ValueError:
        pass
    result: list[tuple[tuple, Any]] = []
    _walk(tree, (), result)
    return result


def _walk(node: Any, path: tuple, result: list[tuple[tuple, Any]]) -> None:
    handler = pytree.SUPPORTED_NODES.get(pytree._get_node_type(node))
    if handler is None or pytree.tree_is_leaf(node):
        result.append((path, node))
        return
    if handler.flatten_with_keys_fn is not None:
        entries, _ = handler.flatten_with_keys_fn(node)
        for key, child in entries:
            _walk(child, (*path, key), result)
        return
    children, context = handler.flatten_fn(node)
    names = context if _names_of(context, len(children)) else None
    for index, child in enumerate(children):
        key = pytree.MappingKey(names[index]) if names else pytree.SequenceKey(index)
        _walk(child, (*path, key), result)


def _names_of(context: Any, count: int) -> bool:
    """Whether a container's context is the names of its ``count`` children."""
    return (
        isinstance(context, (list, tuple))
        and len(context) == count
        and all(isinstance(name, str) for name in context)
    )


__all__ = ["flatten_with_paths"]
