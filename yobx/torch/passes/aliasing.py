"""The passes' single source of truth on aliasing and mutation.

For every FX node, :func:`classify` tells how its result relates to the storage of its
inputs, :func:`inplace_form` (re-exported) tells what it writes and how to compute the
written value functionally, and :func:`has_side_effect` tells whether it may be erased.
``remove_inplace``, ``graph_erase_node`` and ``remove_unnecessary_slices`` all ask here.

Where the answers come from:

* aten overloads: their schema's alias annotations (``Tensor(a)`` returns are views of
  the argument annotated ``(a)``, ``Tensor(a!)`` arguments are written, ``Tensor(a)[]``
  returns are tuples of views);
* torch-level functions and methods: a table of views with their inverse (*scatter*),
  the tuple-of-views operations (``split``, ``chunk``, ``unbind``, ``tensor_split``...),
  then the aten schemas of the same name;
* the fake values the capture recorded (``meta["val"]``): an output whose storage is the
  storage of an input aliases it, whatever the tables say;
* otherwise the sound default: the result **may alias every tensor input**.

Storage shared between graph inputs, parameters and buffers comes from
:func:`storage_key`: a group id a tracer wrote in ``meta["yobx_storage"]``, the storage of
the real attribute tensor, or the storage of the placeholder's fake value (torch.export
keeps the example's aliasing there). A placeholder without any of them has an unknown
storage.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Graph, Node

from ._indexing import plan_index
from ._inplace_forms import InplaceForm, inplace_form
from ._targets import (
    ALIASING_DESPITE_SCHEMA,
    FRESH_MODULES,
    FUNCTIONAL_OPERATORS,
    INPLACE_MODULES,
    INPLACE_OPERATORS,
    METADATA_INPLACE,
    NON_TENSOR_METHODS,
    VIEW_ATTRIBUTES,
    aten_returns_fresh,
    callable_name,
    example_value,
    fetch_attr,
    is_tensor,
    module_of,
    tensor_type_kind,
)
from ._views import (
    Scatter,
    aten_view_scatter,
    element_scatter,
    is_contiguous,
    is_split,
    may_be_view,
    scatter_getitem,
    scatter_identity,
    scatter_mt_attribute,
    scatter_reshape,
    scatter_t_attribute,
    torch_view_scatter,
)

__all__ = [
    "Alias",
    "InplaceForm",
    "STORAGE_KEY",
    "changes_metadata",
    "classify",
    "has_side_effect",
    "inplace_form",
    "mark_storages",
    "mutates_container",
    "shared_storage_groups",
    "storage_key",
    "writes",
]

#: ``node.meta`` key of placeholders and ``get_attr`` nodes: equal values mean the
#: tensors share storage (written by tracers whose fake values do not show it).
STORAGE_KEY = "yobx_storage"

FRESH = "fresh"
VIEW = "view"
VIEWS = "views"
MAY_ALIAS = "may_alias"
NONTENSOR = "nontensor"


@dataclass(frozen=True)
class Alias:
    """How a node's result relates to the storage of its inputs.

    :param kind: ``"fresh"`` (every tensor it holds is new storage), ``"view"`` (shares
        the storage of ``base``), ``"views"`` (a tuple or list of views of ``base``),
        ``"may_alias"`` (may share storage with any tensor input, and with the called
        module's parameters and buffers when ``module_state``) or ``"nontensor"``
    :param base: the node a view or a tuple of views looks into
    :param scatter: builds the new value of ``base`` from a new value of the view; None
        when the view cannot be written through (``expand``, ``as_strided``, ...)
    :param path: nodes from ``base`` (excluded) to the node, each taking the previous one
        as first argument: re-running them on a new value of ``base`` rebuilds the view
        (empty for results equal to ``base``, such as in-place results)
    :param positions: for ``"views"``, the index in the original split of each element
        (None when they are in order, ``()`` when unknown)
    :param module_state: for ``"may_alias"``, the result may also alias the called
        module's parameters and buffers
    """

    kind: str
    base: Node | None = None
    scatter: Scatter | None = None
    path: tuple[Node, ...] = ()
    positions: tuple[int, ...] | None = None
    module_state: bool = False


_UNSET = object()
FRESH_ALIAS = Alias(FRESH)
MAY_ALIAS_ALIAS = Alias(MAY_ALIAS)
NONTENSOR_ALIAS = Alias(NONTENSOR)

# Always views of their first argument, whatever the layout, without a known inverse.
_ATEN_ALWAYS_VIEWS = frozenset(
    {
        "expand",
        "expand_as",
        "as_strided",
        "unfold",
        "real",
        "imag",
        "view_as_real",
        "view_as_complex",
        "movedim",
        "swapaxes",
        "swapdims",
        "permute",
        "positive",
        "numpy_T",
        "matrix_H",
        "adjoint",
        "mT",
        "mH",
        "diagonal",
        "narrow",
        "indices",
        "values",
    }
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


def _op_name(node: Node) -> str | None:
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return node.target._schema.name.split("::")[-1]
    return callable_name(node)


def _argument(node: Node, schema: Any, position: int) -> Any:
    argument = schema.arguments[position]
    if not argument.kwarg_only and position < len(node.args):
        return node.args[position]
    return node.kwargs.get(argument.name)


def _classify_aten(node: Node) -> Alias:
    target: torch._ops.OpOverload = node.target
    schema = target._schema
    returns = schema.returns
    name = schema.name.split("::")[-1]
    if not any(tensor_type_kind(r.type) is not None for r in returns):
        return NONTENSOR_ALIAS
    aliased = [r for r in returns if r.alias_info is not None]
    if not aliased:
        return MAY_ALIAS_ALIAS if name in ALIASING_DESPITE_SCHEMA else FRESH_ALIAS
    if len(returns) != 1:
        return MAY_ALIAS_ALIAS
    sets = aliased[0].alias_info.before_set
    # a list return ``Tensor(a)[]`` exposes no set in Python: its argument is ``(a -> *)``
    position = next(
        (
            i
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None
            and (a.alias_info.before_set & sets if sets else "*" in a.alias_info.after_set)
        ),
        None,
    )
    base = None if position is None else _argument(node, schema, position)
    if not isinstance(base, Node):
        return MAY_ALIAS_ALIAS
    if aliased[0].alias_info.is_write:
        # in-place and out= results are the written argument itself
        return Alias(VIEW, base, scatter_identity)
    if tensor_type_kind(returns[0].type) == "list":
        return Alias(VIEWS, base, path=(node,)) if position == 0 else MAY_ALIAS_ALIAS
    if position != 0:
        return MAY_ALIAS_ALIAS
    scatter = aten_view_scatter(name, node)
    if scatter is not None:
        return Alias(VIEW, base, scatter, (node,))
    if name in _ATEN_ALWAYS_VIEWS:
        return Alias(VIEW, base, None, (node,))
    if name in ("reshape", "flatten", "_reshape_alias") and is_contiguous(example_value(base)):
        return Alias(VIEW, base, scatter_reshape(True), (node,))
    return MAY_ALIAS_ALIAS


def _classify_getitem(node: Node, known: Mapping[Node, Alias] | None) -> Alias:
    container, index = node.args[0], node.args[1]
    if not isinstance(container, Node):
        return MAY_ALIAS_ALIAS
    container_kind = is_tensor(container)
    if container_kind is True:
        plan = plan_index(index)
        if plan is None:
            return MAY_ALIAS_ALIAS
        if plan.advanced:
            return FRESH_ALIAS
        return Alias(VIEW, container, scatter_getitem, (node,))
    outer = known.get(container) if known is not None else None
    if outer is None:
        outer = classify(container, known)
    if outer.kind == NONTENSOR:
        return NONTENSOR_ALIAS
    if outer.kind == VIEWS:
        return _element(node, outer, index)
    if (
        outer.kind == FRESH
        and container_kind is False
        and container.op in ("call_function", "call_method", "call_module")
    ):
        # an element of a tuple of new tensors (sort, max.dim, topk...)
        return FRESH_ALIAS
    return MAY_ALIAS_ALIAS


def _element(node: Node, outer: Alias, index: Any) -> Alias:
    """An element (or a sub-tuple) of a tuple of views."""
    origin = outer.path[0]
    positions = outer.positions
    if positions is None:
        length = _length(origin)
        positions = tuple(range(length)) if length is not None else None
    path = (*outer.path, node)
    if isinstance(index, slice):
        if positions is None or not all(
            isinstance(b, (int, type(None))) for b in (index.start, index.stop, index.step)
        ):
            return Alias(VIEWS, outer.base, path=path, positions=())
        return Alias(VIEWS, outer.base, path=path, positions=positions[index])
    position = None
    if isinstance(index, int) and not isinstance(index, bool):
        if positions is None:
            position = index if index >= 0 else None
        elif -len(positions) <= index < len(positions):
            position = positions[index]
    scatter = element_scatter(origin, position) if position is not None else None
    return Alias(VIEW, outer.base, scatter, path)


def _length(node: Node) -> int | None:
    val = example_value(node)
    return len(val) if isinstance(val, (tuple, list)) else None


def _classify_module(node: Node) -> Alias:
    module = module_of(node)
    if isinstance(module, torch.nn.Identity):
        return Alias(VIEW, node.args[0], scatter_identity) if node.args else MAY_ALIAS_ALIAS
    if isinstance(module, FRESH_MODULES):
        return FRESH_ALIAS
    if type(module) in INPLACE_MODULES and not getattr(module, "inplace", False):
        return FRESH_ALIAS
    return Alias(MAY_ALIAS, module_state=True)


def _classify_by_name(node: Node, name: str) -> Alias:
    base = node.args[0] if node.args else None
    if name in NON_TENSOR_METHODS:
        return NONTENSOR_ALIAS
    if not isinstance(base, Node):
        return FRESH_ALIAS if aten_returns_fresh(name) else MAY_ALIAS_ALIAS
    if is_split(node):
        return Alias(VIEWS, base, path=(node,))
    always, scatter = torch_view_scatter(name, node)
    if always:
        return Alias(VIEW, base, scatter, (node,))
    if name == "positive":
        return Alias(VIEW, base, scatter_identity)
    if may_be_view(name):
        if is_contiguous(example_value(base)):
            return Alias(VIEW, base, scatter_reshape(False), (node,))
        return MAY_ALIAS_ALIAS
    return FRESH_ALIAS if aten_returns_fresh(name) else MAY_ALIAS_ALIAS


def _classify_attribute(node: Node) -> Alias:
    base, attribute = node.args[0], node.args[1]
    if attribute == "T":
        return Alias(VIEW, base, scatter_t_attribute, (node,))
    if attribute == "mT":
        return Alias(VIEW, base, scatter_mt_attribute, (node,))
    if attribute == "data":
        return Alias(VIEW, base, scatter_identity, (node,))
    if attribute in VIEW_ATTRIBUTES or attribute in ("real", "imag"):
        return Alias(VIEW, base, None, (node,))
    return NONTENSOR_ALIAS if is_tensor(node) is False else MAY_ALIAS_ALIAS


def _classify(node: Node, known: Mapping[Node, Alias] | None, form: Any) -> Alias:
    if node.op in ("placeholder", "get_attr", "output"):
        return FRESH_ALIAS
    if form is _UNSET:
        form = inplace_form(node)
    if form is not None and form.kind != "number":
        if form.kind == "setitem":
            return NONTENSOR_ALIAS
        mutated = form.mutated if isinstance(form.mutated, Node) else None
        if mutated is None:
            return MAY_ALIAS_ALIAS
        # the result of an in-place call is the written tensor itself
        return Alias(VIEW, mutated, scatter_identity)
    if node.op == "call_module":
        return _classify_module(node)
    target = node.target
    if node.op == "call_function":
        if isinstance(target, torch._ops.OpOverload):
            return _classify_aten(node)
        if target is operator.getitem:
            return _classify_getitem(node, known)
        if target is builtins.getattr:
            return _classify_attribute(node)
        if target is operator.pos and is_tensor(node.args[0]) is not False:
            # +x returns x itself
            return Alias(VIEW, node.args[0], scatter_identity)
        if target in FUNCTIONAL_OPERATORS or target in INPLACE_OPERATORS:
            return NONTENSOR_ALIAS if is_tensor(node) is False else FRESH_ALIAS
    if is_tensor(node) is False and _holds_no_tensor(node):
        return NONTENSOR_ALIAS
    name = _op_name(node)
    if name is None:
        return MAY_ALIAS_ALIAS
    return _classify_by_name(node, name)


def _holds_no_tensor(node: Node) -> bool:
    val = example_value(node)
    if val is not None:
        return not any(isinstance(v, torch.Tensor) for v in torch.utils._pytree.tree_leaves(val))
    name = _op_name(node)
    return name in NON_TENSOR_METHODS or (
        node.op == "call_function" and node.target is builtins.getattr
    )


def classify(node: Node, known: Mapping[Node, Alias] | None = None, form: Any = _UNSET) -> Alias:
    """Tells how a node's result relates to the storage of its inputs.

    :param node: the node
    :param known: classifications of earlier nodes (saves re-classifying tuples)
    :param form: ``inplace_form(node)`` when the caller already has it
    :return: an :class:`Alias`
    """
    alias = _classify(node, known, form)
    # the fake values may say otherwise than the tables: trust the values
    if (
        alias.kind == FRESH
        and node.op not in ("placeholder", "get_attr")
        and not (node.target is operator.getitem and is_tensor(node.args[0]) is not True)
        and _shares_input_storage(node)
    ):
        return MAY_ALIAS_ALIAS
    return alias


def _storages(value: Any) -> list[Any]:
    from torch.multiprocessing.reductions import StorageWeakRef

    result = []
    for leaf in torch.utils._pytree.tree_leaves(value):
        if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided:
            try:
                result.append(StorageWeakRef(leaf.untyped_storage()))
            except (RuntimeError, NotImplementedError):
                continue
    return result


def _shares_input_storage(node: Node) -> bool:
    """Tells if the recorded values show an output sharing an input's storage."""
    val = example_value(node)
    if val is None:
        return False
    outputs = _storages(val)
    if not outputs:
        return False
    inputs: list[Any] = []
    for arg in node.all_input_nodes:
        inputs.extend(_storages(example_value(arg)))
    return bool(set(outputs) & set(inputs))


# mutation and side effects


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
    return _op_name(node) in METADATA_INPLACE


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


# storage of graph inputs, parameters and buffers


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
            storages = _storages(value) if isinstance(value, torch.Tensor) else []
            if storages:
                return storages[0]
    storages = _storages(example_value(node))
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
        for storage in _storages(value)[:1]:
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
