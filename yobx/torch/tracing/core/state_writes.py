"""Writes into the module's state reached outside its attributes, and reads after them.

The tracer turns a parameter or buffer into a ``get_attr`` proxy when the code reads it
as a module attribute (``self.cache``). Code can also hold the same tensor elsewhere:
transformers' static cache keeps its layers' ``keys``, ``values`` and
``cumulative_length`` in plain Python objects, which the exportable wrappers register
as buffers too. Through such a reference the code gets the real tensor, and an
operation whose arguments are all real runs eagerly while tracing:
``layer.cumulative_length.add_(1)`` then wrote into the user's buffer and never reached
the graph, and ``torch.arange(n) + layer.cumulative_length`` read the value the buffer
had while tracing, baked into the graph: both silently wrong when the graph runs.

:class:`StateWrites` (a ``TorchFunctionMode`` active while tracing) sees every torch
call of the model's code. An in-place operation on a parameter or buffer marks it
*written*, and from then on every call that reads or writes it receives its proxy
instead of the tensor: the call is recorded in the graph, on the buffer's node, as the
module attribute would have been. A state tensor never written keeps being read as a
constant of the trace (its value is the same at every call of the graph).

Tensors the code creates while it runs and the graph then writes into are not the
module's state: the graph writes into a copy of their memory made at each call, and
the mode sends the calls on them to that copy (:mod:`.constant_writes`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx.node import Node
from torch.fx.proxy import Proxy
from torch.overrides import TorchFunctionMode

from ..isolation.parameter_writes import writes_in_place
from .constant_writes import ConstantWrites


class StateWrites(TorchFunctionMode):
    """Records the calls on the module's parameters and buffers once one is written
    into (see the module's documentation).

    :param tracer: the :class:`~yobx.torch.tracing.CustomTracer` tracing
    """

    def __init__(self, tracer: Any):
        super().__init__()
        self.tracer = tracer
        #: ids of the parameters and buffers written into while tracing
        self.written: set[int] = set()
        #: the tensors created while tracing that the graph writes into
        self.created = ConstantWrites(tracer)
        # the inverse of the trace's tensor_names, made at the first write through a
        # get_attr node (tensor_names is filled before the mode is entered)
        self._ids_by_name: dict[str, list[int]] | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        state = self.tracer.state
        if state.in_fake:
            return func(*args, **kwargs)
        created = self.created
        if not state.tensor_names and not created:
            return created.note_result(func(*args, **kwargs), args, kwargs)
        in_place = writes_in_place(func, kwargs)
        if not self.written and not in_place and not created:
            # nothing written yet: the common path
            return created.note_result(func(*args, **kwargs), args, kwargs)
        names = state.tensor_names
        if in_place and args and _is_state(args[0], names):
            self.written.add(id(args[0]))
        if in_place and args and created.written_later(args[0]):
            # an eager write into memory the graph reads: recorded (see constant_writes)
            created.proxy_of(args[0])
        leaves = pytree.tree_leaves((args, kwargs))
        if not any(self._written(t, names) for t in leaves):
            return created.note_result(func(*args, **kwargs), args, kwargs)
        args, kwargs = pytree.tree_map(self._proxy_of_written, (args, kwargs))
        if args and isinstance(args[0], Proxy):
            # a method's or a property's descriptor takes no proxy: the proxy's own
            # method or property records it
            kind, name = _tensor_attribute(func)
            if kind == "property":
                return getattr(args[0], name)
            if kind == "method":
                return getattr(args[0], name)(*args[1:], **kwargs)
        return func(*args, **kwargs)

    def _written(self, value: Any, names: dict[int, str]) -> bool:
        return (_is_state(value, names) and id(value) in self.written) or self.created.holds(value)

    def _proxy_of_written(self, value: Any) -> Any:
        names = self.tracer.state.tensor_names
        if _is_state(value, names) and id(value) in self.written:
            return self.tracer.create_proxy("get_attr", names[id(value)], (), {})
        if self.created.holds(value):
            return self.created.proxy_of(value)
        return value

    @staticmethod
    def writes_attribute(kind: str, target: Any, args: Any, kwargs: dict) -> bool:
        """Whether a node about to be recorded writes in place into a ``get_attr``
        (a parameter, a buffer, a constant of the trace), its first argument."""
        return bool(
            kind != "get_attr"
            and args
            and type(args[0]) is Node
            and args[0].op == "get_attr"
            and writes_in_place(target, kwargs)
        )

    def written_argument(self, written: Node) -> Node:
        """The node a node about to be recorded writes into, ``written`` (a ``get_attr``):
        for a tensor the model created while tracing (a constant of the graph), its
        view of the copy of its memory the graph writes into instead (see
        :mod:`.constant_writes`); else ``written``."""
        tensor = self.tracer.state.constants.get(written.target)
        if tensor is None or not self.created.is_created_tensor(tensor):
            return written
        view = self.created.proxy_of(tensor).node
        if not written.users:
            # made for this write only: the view reads the memory instead
            self.tracer.state.constant_nodes.pop(id(tensor), None)
            written.graph.erase_node(written)
        return view

    def note_write(self, node: Any) -> None:
        """A recorded ``node`` writing into a parameter or buffer through its
        ``get_attr`` proxy marks it written: later reads through other references
        read the graph's value."""
        if self._ids_by_name is None:
            self._ids_by_name = {}
            for key, name in self.tracer.state.tensor_names.items():
                self._ids_by_name.setdefault(name, []).append(key)
        self.written.update(self._ids_by_name.get(node.args[0].target, ()))


def _tensor_attribute(func: Any) -> tuple[str, str]:
    """``("method", name)`` for a method of ``torch.Tensor`` (its descriptor, called
    unbound by the dispatch of a method call), ``("property", name)`` for a property's
    getter (``x.shape``), ``("", "")`` for a function."""
    owner = getattr(func, "__objclass__", None)
    if owner is not None and issubclass(owner, torch._C.TensorBase):
        return "method", func.__name__
    if getattr(func, "__name__", "") == "__get__":
        descriptor = getattr(func, "__self__", None)
        owner = getattr(descriptor, "__objclass__", None)
        if descriptor is not None and owner is not None and issubclass(owner, torch._C.TensorBase):
            return "property", descriptor.__name__
    if getattr(func, "__qualname__", "").startswith(("Tensor.", "TensorBase.")):
        # methods torch writes in Python (split), and the tracer's wrappers of methods
        return "method", func.__name__
    return "", ""


def _is_state(value: Any, names: dict[int, str]) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and not isinstance(value, torch._subclasses.FakeTensor)
        and id(value) in names
    )


__all__ = ["StateWrites", "writes_in_place"]
