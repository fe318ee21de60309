"""Saving and restoring torch's pytree registrations of caches around tests that
change them."""

from __future__ import annotations

import contextlib

import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree

_REGISTRIES = (
    pytree.SUPPORTED_NODES,
    pytree.SUPPORTED_SERIALIZED_TYPES,
    fx_pytree.SUPPORTED_NODES,
)


def _is_cache(cls: type) -> bool:
    return cls.__name__.endswith("Cache")


@contextlib.contextmanager
def pytree_registrations_restored():
    """The pytree registrations of cache classes made or replaced inside are undone on
    exit.

    transformers' exporters register their own flattening of caches (every attribute of
    a layer) in place of yobx's; a test running them, or registering it on purpose,
    must not leave it to the tests run after it in the same process. Other classes
    registered inside stay: libraries register theirs when their modules are imported
    (transformers' model outputs), which happens once per process.
    """
    saved = [dict(registry) for registry in _REGISTRIES]
    try:
        yield
    finally:
        with pytree._NODE_REGISTRY_LOCK:
            for registry, entries in zip(_REGISTRIES, saved):
                for cls in [c for c in registry if _is_cache(c) and c not in entries]:
                    del registry[cls]
                registry.update({c: e for c, e in entries.items() if _is_cache(c)})
            names = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE
            for name in [n for n, c in names.items() if _is_cache(c)]:
                del names[name]
            names.update(
                {node.serialized_type_name: c for c, node in saved[1].items() if _is_cache(c)}
            )
