"""Side effects of FX nodes: what a node writes, and whether it may be erased.

Part of the aliasing and mutation table of :mod:`yobx.torch.passes.aliasing`.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any

import torch
from torch.fx import Graph, Node

from ._inplace_forms import inplace_form
from ._targets import (
    FRESH_MODULES,
    INPLACE_MODULES,
    METADATA_INPLACE,
    callable_name,
    is_tensor,
    module_lookup,
    module_of,
)

_PURE_MODULES = (
    *FRESH_MODULES,
    *INPLACE_MODULES,
    torch.nn.Identity,
    torch.nn.Flatten,
    torch.nn.Unflatten,
    torch.nn.Sequential,
    torch.nn.ModuleList,
    torch.nn.ModuleDict,
    torch.nn.Softmin,
    torch.nn.Softsign,
    torch.nn.Tanhshrink,
    torch.nn.Hardshrink,
    torch.nn.Softshrink,
    torch.nn.LogSigmoid,
    torch.nn.PReLU,
    torch.nn.modules.dropout._DropoutNd,
    torch.nn.RNNBase,
    torch.nn.MultiheadAttention,
    torch.nn.EmbeddingBag,
    torch.nn.Upsample,
    torch.nn.PixelShuffle,
    torch.nn.modules.pooling._AdaptiveAvgPoolNd,
    torch.nn.modules.pooling._AdaptiveMaxPoolNd,
)
_CONTAINER_MUTATORS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "remove",
        "clear",
        "sort",
        "reverse",
        "update",
        "setdefault",
        "popitem",
    }
)
_SIDE_EFFECT_METHODS = _CONTAINER_MUTATORS | frozenset(
    {
        "backward",
        "register_hook",
        "register_post_accumulate_grad_hook",
        "retain_grad",
        "record_stream",
    }
)
_PURE_MODULE_NAMES = ("_operator", "operator", "math", "torch", "torch.nn.functional")
# torch functions changing global state or checking something (bookkeeping of vmap,
# autocast, grad mode, random seeds, runtime asserts)
_IMPURE_TORCH_PREFIXES = (
    "_check",
    "_assert",
    "_vmap_",
    "_jvp_",
    "_enter",
    "_exit",
    "_set",
    "set_",
    "manual_seed",
    "seed",
    "sym_constrain",
    "_constrain",
    "lazy_load",
    "_record",
)
_IMPURE_BUILTINS = frozenset(
    {builtins.print, builtins.setattr, builtins.delattr, builtins.exec, builtins.eval}
)


def writes(node: Node) -> list[Any]:
    """Returns what a node may write into: the mutated argument of an in-place form,
    every tensor argument of a module call with in-place children, else nothing."""
    form = inplace_form(node)
    if form is not None and form.kind != "number":
        if isinstance(form.mutated, Node):
            return [form.mutated]
        return [a for a in node.all_input_nodes if is_tensor(a) is not False]
    if node.op == "call_module" and _module_writes_inputs(module_of(node)):
        return [a for a in node.all_input_nodes if is_tensor(a) is not False]
    return []


def writes_in(graph: Graph) -> bool:
    """``any(writes(node) for node in graph.nodes)``, each module looked up once."""
    module_of_node = module_lookup(graph)
    for node in graph.nodes:
        if node.op == "call_module":
            module = module_of_node(node)
            if module is not None and getattr(module, "inplace", False):
                # an in-place form (inplace_form's own test): what it writes
                if writes(node):
                    return True
            elif _module_writes_inputs(module):
                return True
        elif writes(node):
            return True
    return False


def _module_writes_inputs(module: Any) -> bool:
    """A module with an in-place child may write into its inputs (unknown module: no,
    as torch.fx assumes; its own buffers are updated in place at run time)."""
    return module is not None and any(
        getattr(sub, "inplace", False) is True for sub in module.modules()
    )


def mutates_container(node: Node) -> bool:
    """Tells if a node may change a Python container (``append``, ``setitem``...)."""
    if node.op == "call_function" and node.target in (operator.setitem, operator.delitem):
        return True
    # ``x.sort()`` on a tensor returns new tensors, ``values.sort()`` on a list sorts it
    return (
        node.op == "call_method"
        and node.target in _CONTAINER_MUTATORS
        and bool(node.args)
        and is_tensor(node.args[0]) is not True
    )


def changes_metadata(node: Node) -> bool:
    """Tells if a node changes the shape, strides or storage of its input in place."""
    return op_name(node) in METADATA_INPLACE


def _module_has_side_effect(module: Any) -> bool:
    if module is None:
        return True
    for sub in module.modules():
        if getattr(sub, "inplace", False) is True:
            return True
        if isinstance(sub, torch.fx.GraphModule):
            if any(has_side_effect(n) for n in sub.graph.nodes if n.op != "output"):
                return True
            continue
        if isinstance(sub, torch.nn.modules.batchnorm._NormBase):
            if sub.training and sub.track_running_stats:
                return True
            continue
        if isinstance(sub, torch.nn.modules.dropout._DropoutNd) and sub.training:
            return True
        if not isinstance(sub, _PURE_MODULES):
            return True
    return False


def _known_pure_function(target: Any) -> bool:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    if target in _IMPURE_BUILTINS:
        return False
    if getattr(builtins, getattr(target, "__name__", ""), None) is target:
        return True
    module = getattr(target, "__module__", None) or ""
    if module in _PURE_MODULE_NAMES or module.startswith("torch."):
        name = getattr(target, "__name__", "")
        return not name.startswith(_IMPURE_TORCH_PREFIXES)
    return False


def has_side_effect(node: Node) -> bool:
    """Tells if erasing a node (even unused) would change what the graph does.

    True for placeholders and outputs, impure nodes (``Node.is_impure``: mutable
    schemas, random ops, functions registered with ``torch.fx.node.has_side_effect``),
    every in-place form (methods, functions, ``setitem``, ``copy_``, ``out=``,
    ``inplace=True``), container mutations, module calls which may mutate (in-place
    children, batch norms updating their statistics, unknown leaf modules) and calls of
    Python functions the passes do not know.
    """
    if node.op in ("placeholder", "output"):
        return True
    if node.op == "get_attr":
        return False
    form = inplace_form(node)
    if form is not None and form.kind != "number":
        return True
    if node.op == "call_module":
        return _module_has_side_effect(module_of(node))
    if node.op == "call_method":
        return (
            mutates_container(node)
            or node.target in _SIDE_EFFECT_METHODS - _CONTAINER_MUTATORS
            or node.target in METADATA_INPLACE
        )
    if node.target in (operator.setitem, operator.delitem):
        return True
    try:
        if node.is_impure():
            return True
    except (AssertionError, AttributeError):
        return True
    return not _known_pure_function(node.target)


def op_name(node: Node) -> str | None:
    """The aten or torch name of what a node calls (None for other callables)."""
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return node.target._schema.name.split("::")[-1]
    return callable_name(node)
