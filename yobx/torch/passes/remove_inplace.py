"""Rewrites the in-place operations of an FX graph into their functional forms.

See :mod:`yobx.torch.passes._inplace_walk` for how writes are tracked through views and
aliasing classes, and :mod:`yobx.torch.passes._mutations` for the two conventions giving
the final values of mutated inputs and buffers (a ``copy_`` write-back by default, or
torch.export's extra outputs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Graph, Node

from ..node_text import describe
from ._inplace_forms import InplaceForm, inplace_form
from ._inplace_walk import WRITE_BACK_KEY, InplaceRemovalError, InplaceWalk
from ._mutations import (
    MUTATIONS_KEY,
    propagate_values,
    record_exported,
    record_outputs,
    write_back,
)
from ._side_effects import _module_writes_inputs, changes_metadata, writes
from ._targets import module_lookup, recompile_owner
from .result import PassResult, Refusal

__all__ = ["InplaceRemovalError", "MUTATIONS_KEY", "WRITE_BACK_KEY", "remove_inplace"]

_MUTATIONS = ("write_back", "outputs")


def _mutation_convention(mutations: str | None, observable: bool | None, exported: Any) -> str:
    if mutations is None:
        if observable is not None:
            # the seed's flag: True made mutations outputs, False kept them in place
            # (the write-back keeps the same side effects with a functional body)
            return "outputs" if observable else "write_back"
        return "outputs" if exported is not None else "write_back"
    if mutations not in _MUTATIONS:
        raise ValueError(f"mutations must be one of {_MUTATIONS}, not {mutations!r}")
    return mutations


def remove_inplace(
    graph: Graph,
    exported_program: Any = None,
    verbose: int = 0,
    exc: bool = True,
    recursive: bool = False,
    observable: bool | None = None,
    *,
    mutations: str | None = None,
    assume_distinct_inputs: bool = False,
) -> PassResult:
    """Rewrites every in-place operation of a graph into its functional form.

    Later uses of a mutated tensor, of its base and of its other views are re-routed to
    the new value. The side effects stay: the graph mutates the same inputs and buffers
    as the original one, in one of two conventions (``mutations``):

    * ``"write_back"`` (default without ``exported_program``): the body is functional and
      ends with one ``copy_(input_or_buffer, final_value)`` per mutated input or buffer,
      so the module returns what it returned and leaves inputs and buffers as eager does;
    * ``"outputs"`` (default with ``exported_program``, used by ``to_onnx``): the final
      values become extra outputs, ``(original_output, new_1, ...)`` listed in
      ``output_node.meta["yobx_mutations"]``, or output specs of the exported program.

    A write that cannot be proven exact is left in place (the graph stays correct).

    :param graph: graph to modify in place (torch-level or aten-level)
    :param exported_program: the ``ExportedProgram`` owning ``graph``, if any
    :param verbose: verbosity
    :param exc: raise :class:`InplaceRemovalError` listing what was left in place
        (after rewriting everything else; the graph stays correct)
    :param recursive: also process subgraphs stored as submodules (cond/scan branches);
        a branch writing into its own inputs is left in place
    :param observable: the seed's flag, kept for compatibility (True: ``"outputs"``,
        False: ``"write_back"``)
    :param mutations: ``"write_back"`` or ``"outputs"``
    :param assume_distinct_inputs: the caller guarantees that graph inputs whose storage
        the graph does not record (no ``meta["val"]``, as with ``symbolic_trace``) share
        no storage with other inputs, parameters or buffers; otherwise a write into such
        an input is rewritten only when no other input or buffer is read after it
    :return: a :class:`~yobx.torch.passes.PassResult`, equal to the number of rewritten
        nodes, or to ``-k`` when ``k`` in-place nodes were left (with ``exc=False``)
    :raises ValueError: ``mutations`` is neither ``"write_back"`` nor ``"outputs"``

    Example::

        >>> import torch
        >>> from yobx.torch.passes import remove_inplace
        >>> class Model(torch.nn.Module):
        ...     def forward(self, x):
        ...         y = x * 2
        ...         y.add_(1)
        ...         return y
        >>> gm = torch.fx.symbolic_trace(Model())
        >>> remove_inplace(gm.graph)
        PassResult('remove_inplace', count=1)
        >>> [n.target for n in gm.graph.nodes if n.op == "call_method"]
        ['add']
    """
    convention = _mutation_convention(mutations, observable, exported_program)
    count, refused = _remove_inplace(
        graph, exported_program, verbose, recursive, convention, assume_distinct_inputs
    )
    if verbose:
        print(f"[remove_inplace] {count} node(s) rewritten, {len(refused)} left")
    result = PassResult("remove_inplace", count, tuple(refused))
    if refused and exc:
        raise InplaceRemovalError("\n".join(r.reason for r in refused))
    return result


def _remove_inplace(
    graph: Graph,
    exported_program: Any,
    verbose: int,
    recursive: bool,
    convention: str,
    assume_distinct_inputs: bool,
) -> tuple[int, list[Refusal]]:
    changed, refused = 0, []
    owner = graph.owning_module
    if recursive and owner is not None:
        for node in graph.nodes:
            if node.op != "get_attr":
                continue
            try:
                sub = owner.get_submodule(node.target)
            except AttributeError:
                continue
            if isinstance(sub, torch.fx.GraphModule):
                sub_changed, sub_refused = _remove_inplace(
                    sub.graph, None, verbose, True, "refuse", assume_distinct_inputs
                )
                sub.recompile()
                changed += sub_changed
                refused.extend(sub_refused)
    any_write, local = _scan_writes(graph)
    if not any_write:
        # the walk would map every node to itself: skip its aliasing analysis (most of
        # a trace's passes when the model has no in-place operation)
        recompile_owner(graph)
        return changed, refused
    walk = InplaceWalk(graph, verbose, convention != "refuse", assume_distinct_inputs)
    original = set(graph.nodes)
    if local is not None:
        # every write goes into a new tensor nobody else reads: rewritten where it is,
        # without the walk's aliasing analysis of the whole graph. No lint: each
        # functional node is inserted right before the node it replaces, with the same
        # arguments, so the graph stays in topological order (the tests lint it).
        changed += _rewrite_local(walk, local)
        propagate_values(graph, original)
        recompile_owner(graph)
        return changed, refused
    changed += walk.run()
    refused.extend(walk.refused)
    finals = walk.final_values()
    if finals:
        if convention == "outputs" and exported_program is not None:
            record_exported(exported_program, finals)
        elif convention == "outputs":
            record_outputs(graph, finals)
        else:
            write_back(graph, finals)
    propagate_values(graph, original)
    graph.lint()
    recompile_owner(graph)
    return changed, refused


def _local_writes(graph: Graph) -> list[tuple[Node, InplaceForm]] | None:
    """The in-place nodes of a graph when each one writes into a tensor read by nothing
    else, else None (the walk decides).

    Such a write is *local*: the mutated tensor is the new result of an operation
    (classified fresh: no input, parameter or other result shares its storage) whose
    only user is the in-place node, itself not a write (``x += a; x += b`` goes to the
    walk). Anything aliasing that storage would be a user of the tensor, so nothing
    but the in-place node's own result sees the write: its functional form, computed
    from the same arguments, replaces it. Augmented assignments on numbers are
    retargeted as the walk does. Any other writing node (views, inputs, buffers,
    ``setitem``, ``out=``, modules writing their inputs, write-backs of an earlier run,
    metadata changes) sends the whole graph to the walk.
    """
    return _scan_writes(graph)[1]


def _scan_writes(graph: Graph) -> tuple[bool, list[tuple[Node, InplaceForm]] | None]:
    """:func:`writes_anything` and :func:`_local_writes` in one walk over the nodes (the
    in-place form of each node and the module of each call computed once)."""
    from .aliasing import FRESH, classify

    local: list[tuple[Node, InplaceForm]] | None = []
    #: the nodes having an in-place form, seen so far
    forms: set[Node] = set()
    module_of_node = module_lookup(graph)
    for node in graph.nodes:
        if node.meta.get(WRITE_BACK_KEY):
            return True, None
        op = node.op
        if op == "call_module":
            module = module_of_node(node)
            # inplace_form's own test: only a module with ``inplace=True`` has a form
            form = (
                inplace_form(node)
                if module is not None and getattr(module, "inplace", False)
                else None
            )
            if form is None:
                # what ``writes`` says of a module call without an in-place form
                if _module_writes_inputs(module):
                    return True, None
                continue
        elif op == "call_function" or op == "call_method":
            if local is not None and changes_metadata(node):
                # not a write by itself (writes_anything), but not local either
                local = None
            form = inplace_form(node)
            if form is None:
                continue
        else:
            # placeholders, attributes and the output write nothing
            continue
        forms.add(node)
        if local is None:
            return True, None
        if form.kind == "number":
            local.append((node, form))
            continue
        mutated = form.mutated
        if (
            form.kind != "twin"
            or not isinstance(mutated, Node)
            or mutated.op not in ("call_function", "call_method", "call_module")
            or list(mutated.users) != [node]
            or mutated in forms
            or classify(mutated).kind != FRESH
        ):
            return True, None
        local.append((node, form))
    return bool(forms), local


def _rewrite_local(walk: InplaceWalk, local: list[tuple[Node, InplaceForm]]) -> int:
    """Rewrites the writes :func:`_local_writes` found, as the walk would."""
    graph = walk.graph
    changed = 0
    for node, form in local:
        if form.kind == "number":
            node.target = form.target
            changed += 1
            continue
        # the form again: its arguments may hold an earlier rewritten node
        form = inplace_form(node)
        if walk.verbose > 1:
            print(f"[remove_inplace] rewrote {describe(node)}")
        with graph.inserting_before(node):
            value = walk._functional_value(node, form, form.mutated)
        node.replace_all_uses_with(value)
        graph.erase_node(node)
        changed += 1
    return changed


def writes_anything(graph: Graph) -> bool:
    """Whether a graph may write into a tensor (what :func:`remove_inplace`'s walk
    rewrites or refuses): an in-place form (augmented assignments on numbers included),
    a module call with in-place children, or the write-backs of an earlier run (which
    the walk re-creates)."""
    return any(
        node.meta.get(WRITE_BACK_KEY) or inplace_form(node) is not None or writes(node)
        for node in graph.nodes
    )
