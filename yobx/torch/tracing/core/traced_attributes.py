"""Leaves, attributes and constants of a trace: what the graph refers to by name.

:class:`AttributesMixin` decides which modules stay ``call_module`` leaves, turns the
root's parameters and buffers into ``get_attr`` proxies, stores the tensors and
callables created while tracing (constants, ``torch.cond`` branches, scan bodies) on
the traced model, and lifts values of an enclosing graph into the subgraph being traced.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
import torch.fx
from torch.fx.node import Node
from torch.fx.proxy import Proxy

from ...ops.rnn import leaf_module_call
from ..errors import TracingError
from ..node_arguments import ATOMIC_ARGUMENTS
from .graph_finish import _CallableModule
from .loops import SymbolicRepeat
from .module_state import assign_traced_buffer
from .proxies import CustomParameterProxy, CustomProxyShape, find_proxy
from .proxy_patches import patch_len_in
from .range_lists import SymbolicRangeList
from .tracer_contract import MixinBase

#: prefix of the constants the tracer stores on ``traced_model``
CONSTANT_PREFIX = "_yobx_constant"


_SYMBOLIC_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool)
_PYTHON_TYPES_AS_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool}


def _from_numpy(value: Any) -> Any:
    """A numpy scalar as the Python number torch takes it for, a numpy array as a
    tensor (the graph's code names no module ``np``); None for anything else."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return None
    if isinstance(value, numpy.generic):
        return value.item()
    if isinstance(value, numpy.ndarray):
        return torch.from_numpy(value.copy())
    return None


def _identifier_of(name: str) -> str:
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return text if text and not text[0].isdigit() else f"_{text}"


class AttributesMixin(MixinBase):
    """Leaf modules, ``get_attr`` proxies, constants and registered callables.

    Mixed into :class:`~yobx.torch.tracing.CustomTracer` (a ``torch.fx.Tracer``), which
    provides ``dims``, ``module_leaves`` and the per-trace tables set by its ``_clear``
    (all declared in :class:`~.tracer_contract.TracerContract`).
    """

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        """A module is a leaf if ``module_leaves`` says so, else as in torch.fx."""
        for cls in type(m).__mro__:
            decide = self.module_leaves.get(cls)
            if decide is not None:
                return bool(decide(m, module_qualified_name))
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m, forward, args, kwargs):
        """Records leaf modules; runs the module itself while computing fake values."""
        if self.state.in_fake:
            # nn.LSTM / nn.GRU cannot run on symbolic sizes: their custom operator
            # computes the same values and keeps the sizes symbolic.
            replacement = leaf_module_call(m, args, kwargs)
            return forward(*args, **kwargs) if replacement is None else replacement
        patch_len_in(type(m).forward)
        if m not in self.submodule_paths:
            # A module built inside forward (`nn.Softmax(dim=-1)(x)`) has no path in the
            # model: it cannot be a call_module node, its operations are traced instead.
            return forward(*args, **kwargs)
        if find_proxy(args, kwargs) is None and self.is_leaf_module(m, self.path_of_module(m)):
            # a leaf called on constants only (`nn.Identity()(None)`, an optional input
            # passed through): what it returns does not depend on the inputs, and is
            # what the code goes on with (None stays None), its operations traced
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def _assign_buffer(self, module: torch.nn.Module, name: str, value: Any) -> bool:
        """``module.name = value`` on a buffer while tracing (see :mod:`.module_state`)."""
        return assign_traced_buffer(self, module, name, value)

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        """Parameters and buffers of the root become ``get_attr`` proxies."""
        if self.state.in_fake or not isinstance(attr_val, torch.Tensor):
            return attr_val
        name = self.state.tensor_names.get(id(attr_val))
        if name is None:
            return attr_val
        if name not in parameter_proxy_cache or (
            parameter_proxy_cache[name].node.graph is not self.graph
        ):
            parameter_proxy_cache[name] = self.create_proxy(
                "get_attr",
                name,
                (),
                {},
                proxy_factory_fn=lambda node: CustomParameterProxy(self, node, name, attr_val),
            )
        return parameter_proxy_cache[name]

    def create_arg(self, a: Any) -> Any:
        """Like torch.fx's, but keeps the user's module untouched for tensor constants."""
        cls = type(a)
        if cls in ATOMIC_ARGUMENTS:
            return a
        if cls is tuple:  # not a named tuple nor a torch.Size (subclasses)
            return tuple([self.create_arg(x) for x in a])
        if cls is list:
            return [self.create_arg(x) for x in a]
        if cls is dict and all(type(k) is str for k in a):
            # the keyword arguments of every node
            return {k: self.create_arg(v) for k, v in a.items()}
        if isinstance(a, Proxy):
            node = a.node
            if node.graph is not self.graph:
                return self._lift(node)
            return node
        if isinstance(a, CustomProxyShape):
            return tuple(self.create_arg(x) for x in a)
        if isinstance(a, (SymbolicRepeat, SymbolicRangeList)):
            # `[0] * n` or `list(range(n))` given to an operation: the list made for
            # real (its length fixed)
            return self.create_arg(a._real())
        if isinstance(a, type) and a in _PYTHON_TYPES_AS_DTYPES:
            # x.to(int): torch maps Python types to dtypes, a graph needs the dtype
            return _PYTHON_TYPES_AS_DTYPES[a]
        if isinstance(a, torch.Tensor) and not isinstance(a, torch._subclasses.FakeTensor):
            return self._tensor_constant(a)
        numpy_value = _from_numpy(a)
        if numpy_value is not None:
            return self.create_arg(numpy_value)
        if isinstance(a, _SYMBOLIC_SCALARS):
            # torch.fx's Graph.create_node warns about these; the tracer's skips that
            # walk of the arguments (see CustomTracer.create_node), so it is done here
            warnings.warn(
                f"Raw {type(a).__name__} value ({a}) passed as argument to a node: a value "
                f"the graph cannot recompute (a bug in yobx, please report it)",
                stacklevel=2,
            )
        return super().create_arg(a)

    def _tensor_constant(self, tensor: torch.Tensor) -> Node:
        writes = self.state.state_writes
        if writes is not None and writes.created.holds(tensor):
            # memory the graph writes into: its copy's view (see constant_writes)
            return self.create_arg(writes.created.proxy_of(tensor))
        key = id(tensor)
        name = self.state.tensor_names.get(key) or self.tensor_attrs.get(tensor)
        if name is None:
            node = self.state.constant_nodes.get(key)
            if node is not None and node.graph is self.graph:
                return node
            name = self.add_constant(tensor)
            if writes is not None:
                writes.created.note_read(tensor)
        node = self.create_node("get_attr", name, (), {})
        node.meta["val"] = self.trace_dims().from_real(tensor)
        self.state.constant_nodes[key] = node
        return node

    @property
    def running_fake(self) -> bool:
        """Whether the tracer is running an operation on fake values (module attribute
        assignments inside it are torch's, not the user's)."""
        return bool(self.state.in_fake)

    def tensor_name(self, tensor: torch.Tensor) -> str | None:
        """The qualified name of a parameter or buffer of the traced module, or None."""
        return self.state.tensor_names.get(id(tensor))

    def constant(self, name: str) -> torch.Tensor:
        """The tensor stored by :meth:`add_constant` under ``name``."""
        return self.state.constants[name]

    @property
    def registered_callables(self) -> dict[str, Any]:
        """What :meth:`register_callable` stored, by name (read only)."""
        return dict(self.state.subgraphs)

    @contextlib.contextmanager
    def subgraph(self, graph: torch.fx.Graph) -> Iterator[list[Node]]:
        """Records into ``graph`` while the block runs (branches of ``torch.cond``, the
        body of a scan). Values of the enclosing graph used inside become placeholders
        of ``graph``; the yielded list receives those outer nodes, in placeholder
        order, when the block ends."""
        outer, saved_cache = self.graph, self.state.shape_cache
        self.graph, self.state.shape_cache = graph, {}
        self.state.lift_stack.append({})
        lifted: list[Node] = []
        try:
            yield lifted
            lifted.extend(self.state.lift_stack[-1])
        finally:
            self.state.lift_stack.pop()
            self.graph, self.state.shape_cache = outer, saved_cache

    def add_constant(self, tensor: torch.Tensor) -> str:
        """Stores a tensor created while tracing on the traced model; returns its name.

        The prefix differs from torch.fx's and make_fx's ``_tensor_constant``: lowering
        the graph again (ONNX export) creates constants of its own with that prefix.
        """
        name = f"{CONSTANT_PREFIX}{len(self.state.constants)}"
        self.state.constants[name] = tensor
        return name

    def _lift(self, node: Node) -> Node:
        """Makes a value of an enclosing graph an input of the subgraph being traced."""
        if not self.state.lift_stack:
            # recording it here would give a graph reading a node it does not hold
            # (torch.fx does, and its lint fails); recording it in the node's own
            # graph would silently leave it out of this trace
            raise TracingError.at(
                self.location(),
                f"node {node} belongs to another graph: a proxy of another trace (kept "
                f"from an earlier call, or built over a node of a graph of its own) was "
                f"used in this one; pass its value as an input of the traced function, "
                f"or create the proxy with this tracer (tracer.create_proxy)",
            )
        lifted = self.state.lift_stack[-1]
        if node not in lifted:
            if node.op == "get_attr":
                new = self.graph.get_attr(cast(str, node.target))  # a get_attr's: a name
            else:
                placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
                anchor = placeholders[-1].next if placeholders else next(iter(self.graph.nodes))
                with self.graph.inserting_before(anchor):
                    new = self.graph.placeholder(f"lifted_{node.name}")
            new.meta.update({k: v for k, v in node.meta.items() if k in ("val", "example_value")})
            lifted[node] = new
        return lifted[node]

    def register_callable(self, name: str, fn: Callable[..., Any]) -> Node:
        """Stores ``fn`` on the traced model and returns a ``get_attr`` node to it.

        A module (a ``GraphModule`` branch of ``torch.cond``, any ``nn.Module``) is
        stored as it is, a ``torch.fx.Graph`` becomes a ``GraphModule`` of the traced
        model, any other callable is wrapped in a module; the name is made unique
        (``name``, ``name_1``...). The graph can then call it (``call_module`` on the
        returned node's target, or pass the node to a higher-order operator).
        """
        if not isinstance(fn, (torch.nn.Module, torch.fx.Graph)):
            fn = _CallableModule(fn)
        base, index = _identifier_of(name), 0
        unique = base
        root = getattr(self, "root", None)
        while unique in self.state.subgraphs or (root is not None and hasattr(root, unique)):
            index += 1
            unique = f"{base}_{index}"
        self.state.subgraphs[unique] = fn
        return self.graph.get_attr(unique)

    def _attribute(self, target: str) -> Any:
        if target in self.state.constants:
            return self.state.constants[target]
        # Module.__getattr__ is patched while tracing: walk the dictionaries instead.
        obj = self.root
        for atom in target.split("."):
            for table in ("_parameters", "_buffers", "_modules"):
                entries = obj.__dict__.get(table)
                if entries is not None and atom in entries:
                    obj = entries[atom]
                    break
            else:
                obj = object.__getattribute__(obj, atom)
        return obj
