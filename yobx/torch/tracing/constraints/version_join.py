"""The graph choosing between the versions of a capture at run time.

The versions (see :mod:`.versions`) are the leaves of a decision tree. The joined graph
takes the first capture's inputs, computes the condition of the tree's root from their
sizes and calls ``torch.cond`` on two graph modules: a version's graph (its inputs flat,
its outputs flat) or, for a subtree, a graph routing again. Every branch returns the
outputs any version computes and the new values of the inputs and buffers any version
writes into (see :mod:`.version_writes`), which the joined graph writes back once.
"""

from __future__ import annotations

import copy
import operator
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from ...fx_code import lazy_graph_module
from ...passes import STORAGE_KEY
from ..graph_operators import CondCCOp
from .runtime_checks import insert_condition, insert_runtime_checks, insert_shape_checks
from .version_merging import merged_tree
from .version_writes import (
    buffer_operands,
    buffers_as_inputs,
    check_unshared,
    copy_back,
    fresh_value,
    lift_buffers,
    version_mutations,
    write_into_copies,
    written_inputs,
)
from .versions import (
    CONDITION_KEY,
    DIMENSIONS_KEY,
    Split,
    Version,
    in_dimensions,
    leaves,
    pinned_checks,
)


class VersionJoin:
    """Joins the versions captured from ``first`` (the first capture) for ``tracer``
    (whose ``runtime_checks`` tells whether the joined graph checks its inputs).

    After :meth:`join`: ``joined`` (the versions), ``computed`` (the positions of the
    flat outputs some version computes), ``written`` (the inputs some version writes
    into) and ``buffers`` (the buffers some version writes into, by target, with the
    name of the branches' input replacing each)."""

    def __init__(self, tracer: Any, first: Version):
        self.tracer = tracer
        self.first = first
        self.joined: list[Version] = []
        self.computed: list[int] = []
        self.written: list[str] = []
        self.buffers: dict[str, str] = {}

    def join(self, tree: Split | Version) -> tuple[torch.fx.Graph, torch.nn.Module]:
        """The graph choosing between the versions of ``tree`` at run time, and the
        module holding the versions' graph modules (the traced model of the joined
        graph). Versions computing alike share a branch (:mod:`.version_merging`),
        unless the graph checks its own inputs (each version asserts what it assumes):
        the first capture's graph alone when it computes every version."""
        if not self.tracer.runtime_checks:
            tree = merged_tree(tree, self.first)
        if tree is self.first:
            return self.first.graph, self.first.tracer.traced_model
        holder = torch.nn.Module()
        operands = _operands(self.first.graph)
        # an output computed by one version is returned by every branch (a number
        # another version folded to a constant is returned as that constant)
        self.computed = _routed_positions(leaves(tree))
        self.joined = leaves(tree)
        # the inputs some version writes into: every branch returns their new values
        mutations = version_mutations(self.joined)
        self.written = written_inputs(mutations, operands)
        # the buffers some version writes into: the branches take them as inputs and
        # return their new values, the joined graph writes them back
        self.buffers = buffer_operands(mutations, operands)
        check_unshared(self.first.graph, [*self.written, *self.buffers])
        lift_buffers(holder, self.first.tracer.traced_model, list(self.buffers))
        # two versions or more are left, whose tree is a Split
        assert isinstance(tree, Split)
        graph = self._router(tree, operands, holder, root=True)
        return graph, holder

    def _router(
        self, tree: Split, operands: list[str], holder: torch.nn.Module, root: bool = False
    ) -> torch.fx.Graph:
        first = self.first
        graph = torch.fx.Graph()
        placeholders = {}
        for node in first.graph.nodes:
            if node.op != "placeholder" or not (root or node.target in operands):
                continue
            copy_ = graph.placeholder(node.target)
            kept = ("val", "example_value", STORAGE_KEY)
            copy_.meta.update({k: v for k, v in node.meta.items() if k in kept})
            placeholders[node.target] = copy_
        for target, name in self.buffers.items():
            # the joined graph reads the buffer, a choice inside it receives it
            read = graph.get_attr(target) if root else graph.placeholder(name)
            read.meta["val"] = _buffer_value(self.joined, target)
            placeholders[name] = read
        inputs = first.tracer.state.inputs
        sizes = {n: s for n, s in zip(inputs.names, inputs.sizes) if isinstance(s, (list, tuple))}
        condition = in_dimensions(first.tracer.dims, tree.condition.condition)
        pred = insert_condition(graph, first.tracer.dims, condition, sizes, tree.condition.location)
        branches = []
        for subtree in (tree.true, tree.false):
            if isinstance(subtree, Version):
                module = _flat_module(subtree, operands, self.computed, self.written, self.buffers)
                name = f"version_{subtree.index}"
            else:
                module = lazy_graph_module(holder, self._router(subtree, operands, holder))
                module.meta[DIMENSIONS_KEY] = first.tracer.dims
                name = f"choice_{len(holder._modules)}"
            holder.add_module(name, module)
            branches.append(graph.get_attr(name))
        arguments = tuple(placeholders[name] for name in [*operands, *self.buffers.values()])
        cond = graph.call_function(CondCCOp(), (pred, *branches, arguments))
        cond.meta["stack_trace"] = f"  version choice: {tree.condition}\n"
        # the sizes of the joined graph, to which the ONNX lowering maps the versions'
        cond.meta[DIMENSIONS_KEY] = first.tracer.dims
        cond.meta[CONDITION_KEY] = condition
        outputs = [
            graph.call_function(operator.getitem, (cond, i))
            for i in range(len(self.computed) + len(self.written) + len(self.buffers))
        ]
        for node in graph.nodes:
            if node.op not in ("placeholder",) and node not in outputs and node is not cond:
                node.meta.setdefault("val", None)
        if root:
            self._finish_root(graph, outputs, cond, placeholders)
        else:
            graph.output(tuple(outputs))
        return graph

    def _finish_root(
        self, graph: torch.fx.Graph, outputs: list, cond: torch.fx.Node, placeholders: dict
    ) -> None:
        """The joined graph returns what the first capture returns (constants included),
        writes into the inputs the versions write into, takes its inputs the same way and
        checks their ranks and static sizes."""
        first = self.first
        old_output = next(n for n in first.graph.nodes if n.op == "output")
        flat, spec = pytree.tree_flatten(old_output.args[0])
        vals = []
        for position, node in zip(self.computed, outputs):
            arg = flat[position]
            node.meta["val"] = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
            vals.append(node.meta["val"])
            flat[position] = node
        new_values = outputs[len(self.computed) :]
        written = [*self.written, *self.buffers.values()]
        for name, node in zip(written, new_values):
            node.meta["val"] = fresh_value(placeholders[name].meta.get("val"))
            vals.append(node.meta["val"])
        copy_back(graph, placeholders, written, new_values)
        graph.output(pytree.tree_unflatten(flat, spec))
        cond.meta["val"] = tuple(vals)
        graph._codegen = copy.copy(first.graph._codegen)
        graph._tracer_cls = None
        if self.tracer.runtime_checks:
            inputs = first.tracer.state.inputs
            sizes = {n: s for n, s in zip(inputs.names, inputs.sizes) if s is not None}
            # each version checks its own constraints; a dimension a version pins to 2
            # is checked here, where 1 and 0 reach the choice between versions
            pinned = pinned_checks(first, self.joined)
            insert_runtime_checks(graph, first.tracer.dims, pinned, sizes)
            insert_shape_checks(graph, sizes)


def _buffer_value(versions: list[Version], target: str) -> Any:
    """The value a version's graph gives the buffer at ``target`` (its ``get_attr``)."""
    for version in versions:
        for node in version.graph.find_nodes(op="get_attr", target=target):
            return node.meta.get("val")
    return None


def _operands(graph: torch.fx.Graph) -> list[str]:
    """The inputs the versions receive: tensors and ints declared dynamic (constants
    are baked into each version)."""
    return [
        n.target
        for n in graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), (torch.Tensor, torch.SymInt))
    ]


def _flat_outputs(version: Version) -> list:
    output = next(n for n in version.graph.nodes if n.op == "output")
    return pytree.tree_leaves(output.args[0])


def _routed_positions(versions: list[Version]) -> list[int]:
    """The positions of the flat outputs the choice returns: those a version computes,
    and the constants the versions disagree on (``x[:2].shape[0]`` is 2 in one
    version, 1 in the version of one row: each branch returns its own)."""
    outputs = [_flat_outputs(v) for v in versions]
    routed = []
    for position in range(min(len(o) for o in outputs)):
        values = [o[position] for o in outputs]
        computed = any(isinstance(v, torch.fx.Node) for v in values)
        if computed or not all(_same_constant(v, values[0]) for v in values[1:]):
            routed.append(position)
    return routed


def _same_constant(a: Any, b: Any) -> bool:
    """Whether two versions' constant outputs are the same value."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    return bool(a == b)


def _flat_module(
    version: Version,
    operands: list[str],
    computed: list[int],
    written: list[str],
    buffers: dict[str, str],
) -> torch.fx.GraphModule:
    """The version's graph taking the operands flat, then the ``buffers`` written (by a
    version at least), and returning, flat, its outputs at the positions ``computed``
    (by a version at least), then the new values of the inputs ``written`` and of the
    buffers (see :mod:`.version_writes`): what a branch of the joined graph's
    ``torch.cond`` is."""
    graph = torch.fx.Graph()
    values: dict[torch.fx.Node, torch.fx.Node] = {}
    output = graph.graph_copy(version.graph, values)
    for node in [n for n in graph.nodes if n.op == "placeholder"]:
        if node.target in operands:
            continue
        constant = node.meta.get("val")

        def replaced(a: torch.fx.Node, c: Any = constant, n: torch.fx.Node = node) -> Any:
            return c if a is n else a

        for user in list(node.users):
            user.args = torch.fx.node.map_arg(user.args, replaced)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, replaced)
        graph.erase_node(node)
    flat = pytree.tree_leaves(output)
    returned = graph.output(tuple(flat[i] for i in computed))
    # after the output: a buffer returned (``return self.buf``) is read from its input,
    # and an output that is a written input or buffer returns its new value
    if buffers:
        buffers_as_inputs(graph, buffers)
    new_values = write_into_copies(graph, [*written, *buffers.values()])
    returned.args = ((*returned.args[0], *new_values),)
    graph.lint()
    module = lazy_graph_module(version.tracer.traced_model, graph)
    # lowered alone, on its own example (yobx.torch.onnx.version_lowering)
    module.meta[DIMENSIONS_KEY] = version.tracer.dims
    return module
