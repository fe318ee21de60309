"""Finishing a trace: the graph's code generator, runtime checks, the traced model and
the default passes, and what the tracer leaves out of the graph.

:class:`GraphFinishMixin` runs once the user's code has been traced; the module-level
helpers (:func:`graph_fingerprint`...) are shared with the tools that read the graph.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch.fx.graph import _PyTreeInfo

from ...node_text import operation_name
from ...passes.negative_bases import negative_bases_as_nodes
from ..constraints.input_layouts import (
    check_examples,
    insert_layout_checks,
    layout_dependent_inputs,
)
from ..constraints.runtime_checks import (
    RUNTIME_CHECK,
    graph_checks,
    insert_runtime_checks,
    insert_shape_checks,
)
from ..inputs import NO_EXAMPLE
from ..symbolic.symbolic_kernels import symbolic_kernels
from .codegen import CheckedCodeGen, CheckedPyTreeCodeGen
from .tracer_contract import MixinBase

# Nodes computing shapes and scalars have no side effect: removed when unused.
_PURE_SCALAR_FUNCTIONS = frozenset(
    {
        operator.add,
        operator.sub,
        operator.mul,
        operator.floordiv,
        operator.truediv,
        operator.mod,
        operator.pow,
        operator.neg,
        operator.eq,
        operator.ne,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
        operator.getitem,
        operator.and_,
        operator.or_,
        operator.not_,
        getattr,
        torch.sym_max,
        torch.sym_min,
        torch.sym_not,
        torch.sym_float,
        torch.sym_int,
    }
)


_PURE_METHODS = frozenset({"size", "dim", "numel", "stride"})


def graph_fingerprint(graph: torch.fx.Graph) -> str:
    """A digest of a graph's node names, kinds and targets.

    Two captures with the same fingerprint name the same computations the same way;
    tools matching values by node name (ONNX value names, recorded runs) check it first.
    The nodes checking the inputs (``CustomTracer(runtime_checks=...)``) are left out.
    """
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    for node in graph.nodes:
        if node.meta.get(RUNTIME_CHECK):
            continue
        target = node.target if isinstance(node.target, str) else operation_name(node)
        digest.update(f"{node.op}|{node.name}|{target}\n".encode())
    return digest.hexdigest()


def _remove_unused_scalar_nodes(graph: torch.fx.Graph) -> None:
    """Removes shape/scalar computations nobody uses (created by ``x.shape`` & co)."""
    for node in reversed(list(graph.nodes)):
        if node.users:
            continue
        if node.op == "call_method" and node.target in _PURE_METHODS:
            graph.erase_node(node)
        elif node.op == "call_function" and node.target in _PURE_SCALAR_FUNCTIONS:
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor) or node.target is getattr:
                graph.erase_node(node)
        elif node.op == "get_attr":
            graph.erase_node(node)


class _CallableModule(torch.nn.Module):
    """Wraps a callable so that it can be traced and run as a GraphModule."""

    def __init__(self, fn: Callable):
        super().__init__()
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, torch.nn.Module):
            self.owner = owner
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


class GraphFinishMixin(MixinBase):
    """What :meth:`CustomTracer.trace` does once the user's code has been traced.

    Mixed into :class:`~yobx.torch.tracing.CustomTracer`, which provides ``dims``,
    ``refinements``, ``guards``, ``constraints``, ``runtime_checks`` and the per-trace
    tables set by its ``_clear`` (all declared in :class:`~.tracer_contract.TracerContract`).
    """

    def _finish(self, graph, module, root, update_model_with_callable) -> None:
        if self.state.loops:
            self.roll_loops(graph)
            # making the loops scans may unroll one (a value of a step used after the
            # loop): its length is then a need of its own, for a strict Dim an error
            strict = self.trace_refinements().strict_error()
            if strict is not None:
                raise strict
        constants = self._traced_constants(graph)
        inputs = self.state.inputs
        assert inputs is not None, "a trace with examples binds its inputs first"
        if self.state.structured:
            # the forward takes `*args` as the model does: gm(x, y, z) for forward(x, *rest)
            arg_names = [
                f"*{name}" if name == inputs.var_positional else name for name in inputs.arg_names
            ]
            graph._codegen = CheckedPyTreeCodeGen(
                _PyTreeInfo(arg_names, inputs.in_spec, self.state.out_spec), constants
            )
        elif constants:
            graph._codegen = CheckedCodeGen(constants)
        _remove_unused_scalar_nodes(graph)
        # torch.fx prints operator.pow(-1, x) as `-1 ** x`, which is -(1 ** x)
        negative_bases_as_nodes(graph)
        self._check_input_layouts(graph)
        # Pickling or copying a GraphModule traces its code again with this class:
        # torch.fx's own tracer does that job (it needs no example inputs).
        graph._tracer_cls = None
        if self.runtime_checks:
            sizes = {n: s for n, s in zip(inputs.names, inputs.sizes) if s is not None}
            checks = graph_checks(self.trace_dims(), self.refinements)
            insert_runtime_checks(graph, self.trace_dims(), checks, sizes)
            # inserted before the others: a size read by index needs the rank first
            insert_shape_checks(graph, sizes)
        for n in graph.nodes:
            if n.op == "output":
                n.meta["guards"] = list(self.guards)
                n.meta["constraints"] = list(self.constraints)
        if not isinstance(root, torch.nn.Module) and not update_model_with_callable:
            self.traced_model = None
            return
        self.traced_model = self._build_traced_model(module, graph)

    def _check_input_layouts(self, graph) -> None:
        """Refuses a non-contiguous example of an input whose layout the graph depends
        on, and makes the graph check that input's layout (see :mod:`.input_layouts`)."""
        reasons = layout_dependent_inputs(graph, self.state.layout_reads)
        if not reasons:
            return
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        leaves = self.state.inputs.leaves if self.state.inputs is not None else []
        if len(placeholders) == len(leaves):
            check_examples(reasons, dict(zip(placeholders, leaves)))
        if self.runtime_checks:
            insert_layout_checks(graph, reasons)

    def _traced_constants(self, graph) -> dict[str, Any]:
        """Placeholder name -> the Python constant it was traced with."""
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        inputs = self.state.inputs
        if inputs is None or len(placeholders) != len(inputs.leaves):
            return {}
        return {
            node.name: leaf
            for node, leaf, sizes in zip(placeholders, inputs.leaves, inputs.sizes)
            if sizes is None and leaf is not NO_EXAMPLE
        }

    def _build_traced_model(self, module: torch.nn.Module, graph) -> torch.nn.Module:
        """The user's module if the graph only refers to it, else a shallow wrapper.

        The wrapper shares the user's submodules, parameters and buffers (no copy) and
        adds the constants and subgraphs created while tracing, so the user's module
        is never modified.
        """
        if (
            not self.state.constants
            and not self.state.subgraphs
            and module is not None
            and not (isinstance(module, _CallableModule))
        ):
            return module
        wrapper = torch.nn.Module()
        wrapper._modules.update(module._modules)
        wrapper._parameters.update(module._parameters)
        wrapper._buffers.update(module._buffers)
        for k, v in module.__dict__.items():
            if isinstance(v, torch.Tensor) and not k.startswith("_"):
                setattr(wrapper, k, v)
        for name, tensor in self.state.constants.items():
            wrapper.register_buffer(name, tensor, persistent=False)
        for name, subgraph in self.state.subgraphs.items():
            if isinstance(subgraph, torch.fx.Graph):
                subgraph = torch.fx.GraphModule(wrapper, subgraph)
            setattr(wrapper, name, subgraph)
        return wrapper

    def _mark_storages(self, graph: torch.fx.Graph) -> None:
        """Tells the passes which inputs, parameters and buffers share storage.

        Each input gets its own fake tensor, so ``f(a, a[1])`` or a buffer registered
        as a view of another look independent in the graph: the real tensors say which
        alias, and a write into one of them is then rewritten exactly or refused.
        """
        from ...passes import mark_storages

        # only the tensors the graph reads: the inputs, and the parameters, buffers and
        # plain attributes (``self.alias = self.buf[:2]`` aliases too) of its get_attr
        inputs = self.state.inputs
        assert inputs is not None, "a trace with examples binds its inputs first"
        tensors: dict[str, Any] = dict(zip(inputs.names, inputs.leaves))
        for node in graph.find_nodes(op="get_attr"):
            try:
                value = self._attribute(node.target)
            except AttributeError:
                continue
            if isinstance(value, torch.Tensor):
                tensors[node.target] = value
        mark_storages(graph, tensors)

    def _apply_default_passes(self, graph) -> None:
        # [passes, issue 11] the one default pass order shared with to_onnx. exc=False:
        # what a pass cannot prove exact stays as it is (still correct), tracing must not
        # fail because of it. mutations="write_back": the body becomes functional and
        # ends with copy_ into the mutated inputs and buffers, so the graph returns what
        # the model returns and has the same side effects (to_onnx asks for "outputs").
        from ...passes import run_default_passes, untouched_by_default_passes

        if untouched_by_default_passes(graph, self.traced_model):
            # (nor the kernels' patches below)
            return
        # the passes compute the fake values of the nodes they create (x[:, n - 1] = v
        # becomes select_scatter...) with the tracer's symbolic kernels: torch's would
        # specialize the dimensions
        with symbolic_kernels():
            run_default_passes(
                graph, mutations="write_back", exc=False, recursive=True, module=self.traced_model
            )
