"""Storage of graph inputs, parameters and buffers: which of them may share memory.

Part of the aliasing and mutation table of :mod:`yobx.torch.passes.aliasing`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import torch
from torch.fx import Graph, Node

from ._targets import example_value, fetch_attr

#: ``node.meta`` key of placeholders and ``get_attr`` nodes: equal values mean the
#: tensors share storage (written by tracers whose fake values do not show it).
STORAGE_KEY = "yobx_storage"


def tensor_storages(value: Any) -> list[Any]:
    from torch.multiprocessing.reductions import StorageWeakRef

    result = []
    for leaf in torch.utils._pytree.tree_leaves(value):
        if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided:
            try:
                result.append(StorageWeakRef(leaf.untyped_storage()))
            except (RuntimeError, NotImplementedError):
                continue
    return result


def storage_key(node: Node) -> Hashable | None:
    """Identifies the storage of a placeholder or ``get_attr`` node, None if unknown.

    Equal keys mean shared storage. The key is, in this order: the group a tracer wrote
    in ``meta["yobx_storage"]``, the storage of the attribute's real tensor when the
    graph has an owning module, the storage of the recorded value (``meta["val"]``).
    """
    if STORAGE_KEY in node.meta:
        return ("group", node.meta[STORAGE_KEY])
    if node.op == "get_attr":
        owner = node.graph.owning_module
        if owner is not None:
            try:
                value = fetch_attr(owner, node)
            except AttributeError:
                value = None
            storages = tensor_storages(value) if isinstance(value, torch.Tensor) else []
            if storages:
                return storages[0]
    storages = tensor_storages(example_value(node))
    if isinstance(example_value(node), torch.Tensor) and storages:
        return storages[0]
    return None


def shared_storage_groups(tensors: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Groups the names of the tensors sharing storage (only groups of two or more).

    :param tensors: name -> tensor (example inputs, parameters, buffers); other values
        are ignored
    :return: tuples of names, in the mapping's order
    """
    groups: dict[Any, list[str]] = {}
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            continue
        for storage in tensor_storages(value)[:1]:
            groups.setdefault(storage, []).append(name)
    return [tuple(names) for names in groups.values() if len(names) > 1]


def mark_storages(graph: Graph, tensors: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Records which placeholders and attributes of ``graph`` share storage.

    A tracer whose fake values are created independently for each input calls it with
    the real example inputs, parameters and buffers, so that the passes know exactly
    which of them alias (``f(a, a[1])``, a buffer registered as a view of another).

    :param graph: the traced graph
    :param tensors: placeholder target or attribute name -> real tensor
    :return: the groups of names sharing storage
    """
    from torch.multiprocessing.reductions import StorageWeakRef

    ids: dict[Any, int] = {}
    for node in graph.nodes:
        if node.op not in ("placeholder", "get_attr"):
            continue
        value = tensors.get(node.target)
        if not isinstance(value, torch.Tensor):
            continue
        storage = StorageWeakRef(value.untyped_storage())
        node.meta[STORAGE_KEY] = ids.setdefault(storage, len(ids))
    return shared_storage_groups(tensors)
