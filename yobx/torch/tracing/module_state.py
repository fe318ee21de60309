"""The user's modules while tracing: attribute assignments in ``forward``.

``self.count += 1`` on a buffer runs ``Module.__setattr__(self, "count", proxy)`` and
torch accepts the proxy as the new buffer (it has ``__torch_function__``); a cache
stored with ``self.last = x`` leaves a proxy behind as well. Tracing must not change
the user's modules, and the graph must still compute what eager does:

* :func:`preserved_modules` snapshots every module's attributes, parameters, buffers
  and submodules and restores them after the trace, also when it raises;
* :func:`buffer_assignments` routes the assignment of a traced tensor to a buffer
  through the tracer: an in-place update of that buffer (``+=``) is already in the
  graph, any other new value becomes ``buffer.copy_(value)``, which keeps eager's
  values for every later read (the buffer must keep its shape and dtype).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .patches import patched_attributes

_MISSING = object()


@contextlib.contextmanager
def preserved_modules(root: torch.nn.Module) -> Iterator[None]:
    """Restores the state of every module of ``root`` on exit."""
    snapshot = [
        (m, dict(m.__dict__), dict(m._parameters), dict(m._buffers), dict(m._modules))
        for m in root.modules()
    ]
    try:
        yield
    finally:
        for module, attributes, parameters, buffers, modules in snapshot:
            for table, saved in (
                (module._parameters, parameters),
                (module._buffers, buffers),
                (module._modules, modules),
            ):
                if table != saved:
                    table.clear()
                    table.update(saved)
            current = module.__dict__
            for name in [name for name in current if name not in attributes]:
                del current[name]
            for name, value in attributes.items():
                if current.get(name, _MISSING) is not value:
                    current[name] = value


@contextlib.contextmanager
def buffer_assignments(assign: Callable[[torch.nn.Module, str, Any], bool]) -> Iterator[None]:
    """Patches ``Module.__setattr__``: ``assign(module, name, value)`` handles the
    assignment when it returns True; otherwise it happens as usual."""
    original = torch.nn.Module.__setattr__

    def setattr_(module: torch.nn.Module, name: str, value: Any) -> None:
        buffers = module.__dict__.get("_buffers")
        if buffers is not None and buffers.get(name) is not None and assign(module, name, value):
            return
        original(module, name, value)

    with patched_attributes([(torch.nn.Module, "__setattr__", setattr_)]):
        yield
