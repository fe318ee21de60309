"""Operations no default pass rewrites: a graph made only of them skips the passes.

Most traced models write nothing in place, slice nothing away and have no vmap
region, and each default pass would still classify every node to find that out (a
few microseconds per node, most of the passes' time on a model without in-place
operations). :func:`untouched_by_default_passes` answers first with one lookup per
node, on a list of operations none of the passes matches whatever their arguments
(``out=`` aside). The list is conservative: an operation missing from it only sends
the graph to the passes, which decide as before.

Layers above the passes register their own functions of that kind (the tracer's
runtime checks) with :func:`register_untouched_functions`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Graph

from ._inplace_walk import WRITE_BACK_KEY
from ._targets import FUNCTIONAL_OPERATORS, module_lookup, owned_by

#: call_function targets none of the default passes rewrites: no in-place form (no
#: ``inplace=`` parameter either: ``F.relu(x, True)`` writes), no slice or copy, no
#: container mutation, no vmap bookkeeping
_FUNCTIONS: set[Callable[..., Any]] = {
    # operator.add... (their in-place twins are not there)
    *FUNCTIONAL_OPERATORS,
    operator.not_,
    torch.add,
    torch.sub,
    torch.mul,
    torch.div,
    torch.pow,
    torch.neg,
    torch.abs,
    torch.exp,
    torch.log,
    torch.sqrt,
    torch.rsqrt,
    torch.tanh,
    torch.sigmoid,
    torch.sin,
    torch.cos,
    torch.relu,
    torch.matmul,
    torch.bmm,
    torch.mm,
    torch.einsum,
    torch.cat,
    torch.stack,
    torch.where,
    torch.flatten,
    torch.reshape,
    torch.permute,
    torch.transpose,
    torch.unsqueeze,
    torch.squeeze,
    torch.softmax,
    torch.log_softmax,
    torch.mean,
    torch.sum,
    torch.amax,
    torch.argmax,
    torch.arange,
    torch.ones,
    torch.zeros,
    torch.full,
    F.linear,
    F.softmax,
    F.log_softmax,
    F.gelu,
    F.layer_norm,
    F.embedding,
    F.scaled_dot_product_attention,
    F.conv1d,
    F.conv2d,
}

#: call_method names none of the default passes rewrites (tensor methods without a
#: trailing ``_``; not ``clone``, ``copy_``, ``narrow``, ``__getitem__``, nor a name
#: that mutates a Python list or dict)
_METHODS = frozenset(
    {
        "size",
        "dim",
        "view",
        "reshape",
        "flatten",
        "permute",
        "transpose",
        "unsqueeze",
        "squeeze",
        "expand",
        "expand_as",
        "matmul",
        "softmax",
        "log_softmax",
        "add",
        "sub",
        "mul",
        "div",
        "pow",
        "neg",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "tanh",
        "sigmoid",
        "relu",
        "mean",
        "sum",
        "amax",
        "argmax",
        "masked_fill",
    }
)


def register_untouched_functions(*functions: Callable[..., Any]) -> None:
    """Declares functions that none of the default passes rewrites: a call of one of
    them can neither write into its arguments nor be a slice or a copy."""
    _FUNCTIONS.update(functions)


def untouched_by_default_passes(graph: Graph, module: torch.nn.Module | None = None) -> bool:
    """True when none of the default passes can change ``graph``: every node is a
    placeholder, the output, an attribute that is not a subgraph, a call of a module
    without in-place children or an operation of the lists above (without ``out=``),
    and no node is a write-back of an earlier run of the passes.

    :param graph: the graph
    :param module: the module holding its attributes and submodules when the graph has
        no owning module (as :func:`~yobx.torch.passes.run_default_passes`)
    """
    with owned_by(graph, module):
        return _untouched(graph)


def _untouched(graph: Graph) -> bool:
    module_of_node = None
    owner = graph.owning_module
    for node in graph.nodes:
        if WRITE_BACK_KEY in node.meta:
            return False
        op = node.op
        if op == "call_function":
            try:
                if node.target not in _FUNCTIONS:
                    return False
            except TypeError:  # an unhashable callable
                return False
            if "out" in node.kwargs:
                return False
        elif op == "call_method":
            if node.target not in _METHODS or "out" in node.kwargs:
                return False
        elif op == "call_module":
            if module_of_node is None:
                module_of_node = module_lookup(graph)
            module = module_of_node(node)
            if module is None or any(getattr(sub, "inplace", False) for sub in module.modules()):
                return False
        elif op == "get_attr" and owner is not None and _is_subgraph(owner, node.target):
            # remove_inplace cleans the subgraphs of torch.cond / scan
            return False
    return True


def _is_subgraph(owner: torch.nn.Module, target: str) -> bool:
    try:
        return isinstance(owner.get_submodule(target), torch.fx.GraphModule)
    except AttributeError:
        return False
