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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from ._indexing import plan_index
from ._inplace_forms import InplaceForm, inplace_form
from ._side_effects import (
    changes_metadata,
    has_side_effect,
    mutates_container,
    op_name,
    writes,
)
from ._storages import (
    STORAGE_KEY,
    mark_storages,
    shared_storage_groups,
    storage_key,
    tensor_storages,
)
from ._targets import (
    ALIASING_DESPITE_SCHEMA,
    FRESH_FUNCTIONS,
    FRESH_MODULES,
    FUNCTIONAL_OPERATORS,
    INPLACE_MODULES,
    INPLACE_OPERATORS,
    NON_TENSOR_METHODS,
    VIEW_ATTRIBUTES,
    aten_returns_fresh,
    example_value,
    is_tensor,
    module_of,
    tensor_type_kind,
)
from ._views import (
    LAYOUT_COPY,
    LAYOUT_KEY,
    Scatter,
    aten_view_scatter,
    element_scatter,
    is_contiguous,
    is_split,
    keeps_shape,
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
    :param shares: for ``"may_alias"``, the nodes whose storage the result may share,
        instead of all its tensor arguments (None: all of them)
    """

    kind: str
    base: Node | None = None
    scatter: Scatter | None = None
    path: tuple[Node, ...] = ()
    positions: tuple[int, ...] | None = None
    module_state: bool = False
    shares: tuple[Node, ...] | None = None


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
    always, scatter = aten_view_scatter(name, node)
    if always or name in _ATEN_ALWAYS_VIEWS:
        return Alias(VIEW, base, scatter, (node,))
    if name in ("reshape", "flatten", "_reshape_alias") and (
        is_contiguous(example_value(base)) or keeps_shape(example_value(base), example_value(node))
    ):
        return Alias(VIEW, base, scatter_reshape(True), (node,))
    return _conversion(node, name, base) or MAY_ALIAS_ALIAS


def _tensor_index(index: Any) -> bool:
    """Whether ``index`` is one only a tensor accepts: a tuple with a slice, ``...`` or
    None in it."""
    return isinstance(index, tuple) and any(
        isinstance(i, slice) or i is Ellipsis or i is None for i in index
    )


def _classify_getitem(node: Node, known: Mapping[Node, Alias] | None) -> Alias:
    container, index = node.args[0], node.args[1]
    if not isinstance(container, Node):
        return MAY_ALIAS_ALIAS
    container_kind = is_tensor(container)
    if container_kind is None and _tensor_index(index):
        # lists, tuples and dicts refuse a tuple index holding a slice, ``...`` or None:
        # only a tensor (or an array) is indexed so (``x[:, 0]`` in a graph of
        # ``torch.fx.symbolic_trace``, which records no type for ``x``)
        container_kind = True
    if container_kind is True:
        plan = plan_index(index)
        if plan is None:
            return MAY_ALIAS_ALIAS
        if plan.advanced:
            return FRESH_ALIAS
        return Alias(VIEW, container, scatter_getitem, (node,))
    if getattr(container.target, "_name", None) == "yobx_scan":
        return _scan_output(node, container, index)
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
    decided = _decided_layout(node, name, base)
    if decided is not None:
        return decided
    if may_be_view(name):
        base_value = example_value(base)
        # ravel copies a non-contiguous input whatever its shape (contiguous().view)
        same_shape = name != "ravel" and keeps_shape(base_value, example_value(node))
        if is_contiguous(base_value) or same_shape:
            return Alias(VIEW, base, scatter_reshape(False), (node,))
        return MAY_ALIAS_ALIAS
    conversion = _conversion(node, name, base)
    if conversion is not None:
        return conversion
    return FRESH_ALIAS if aten_returns_fresh(name) else MAY_ALIAS_ALIAS


def _decided_layout(node: Node, name: str, base: Node) -> Alias | None:
    """A ``contiguous()`` or a reshape whose layout the tracer decided for the sizes
    its graph runs at (:data:`LAYOUT_KEY`): a view, or a new tensor."""
    layout = node.meta.get(LAYOUT_KEY)
    if layout is None or not (name == "contiguous" or may_be_view(name)):
        return None
    if layout == LAYOUT_COPY:
        return FRESH_ALIAS
    if name == "contiguous":
        return Alias(VIEW, base, scatter_identity)
    return Alias(VIEW, base, scatter_reshape(False), (node,))


# Conversions returning their input itself when nothing changes (``x.to(x.dtype)``).
_CONVERSIONS = frozenset(
    {
        "to",
        "type_as",
        "type",
        "float",
        "double",
        "half",
        "bfloat16",
        "int",
        "long",
        "short",
        "bool",
        "char",
        "byte",
        "cpu",
    }
)


def _conversion(node: Node, name: str, base: Node) -> Alias | None:
    """Decides ``contiguous`` and dtype or device conversions from the recorded values:
    the input itself when nothing changes, a new tensor when the dtype or device does,
    None when it cannot be proven for every size."""
    if name == "contiguous":
        if not node.kwargs and len(node.args) == 1 and is_contiguous(example_value(base)):
            return Alias(VIEW, base, scatter_identity)
        return None
    if name not in _CONVERSIONS or "copy" in node.kwargs or "memory_format" in node.kwargs:
        return None
    if any(isinstance(a, bool) for a in node.args[1:]):
        # to(dtype, non_blocking, copy): a copy may be forced
        return None
    before, after = example_value(base), example_value(node)
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return None
    if (before.dtype, before.device) != (after.dtype, after.device):
        return FRESH_ALIAS
    return Alias(VIEW, base, scatter_identity)


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
        if target in FRESH_FUNCTIONS:
            return FRESH_ALIAS
    if getattr(target, "_name", None) == "yobx_scan":
        # a tuple whose items the getitems reading it classify (see _scan_output)
        return NONTENSOR_ALIAS
    if is_tensor(node) is False and _holds_no_tensor(node):
        return NONTENSOR_ALIAS
    name = op_name(node)
    if name is None:
        return MAY_ALIAS_ALIAS
    return _classify_by_name(node, name)


def _scan_output(node: Node, scan: Node, index: Any) -> Alias:
    """An output of a scan of the tracer (``yobx_scan``: body, carries, stacked inputs,
    constants): its final carries, then the stacked outputs of its steps.

    A stacked output is always new. A final carry is what the body's last step returns,
    new where the body computes it into storage of its own; for zero steps it is the
    initial carry itself: new too where that is a new tensor no one else reads, else
    that tensor's storage. Anything else may alias any of the scan's inputs.
    """
    init = scan.args[1] if len(scan.args) > 1 else None
    if type(index) is not int or not isinstance(init, (list, tuple)) or index < 0:
        return MAY_ALIAS_ALIAS
    if index >= len(init):
        return FRESH_ALIAS
    inputs = tuple(
        a for group in scan.args[1:] if isinstance(group, (list, tuple)) for a in group
        if isinstance(a, Node)
    )  # fmt: skip
    anything = Alias(MAY_ALIAS, shares=inputs)
    results = _scan_body_results(scan)
    if results is None or len(results) < len(init):
        return anything
    roots = [own_root(r) for r in results[: len(init)]]
    # two carries of one storage would be one tensor after the scan too
    if roots[index] is None or roots.count(roots[index]) > 1:
        return anything
    first = init[index]
    if not isinstance(first, Node):
        return anything
    if len(first.users) != 1 or own_root(first) is not first or sum(a is first for a in init) != 1:
        # the first carry itself where the loop runs no step
        return Alias(MAY_ALIAS, shares=(first,))
    return FRESH_ALIAS


def _scan_body_results(scan: Node) -> list | None:
    """What the body of ``scan`` returns, as nodes of its own graph."""
    body_node = scan.args[0] if scan.args else None
    if not isinstance(body_node, Node) or body_node.op != "get_attr":
        return None
    graph = getattr(module_of(body_node), "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return None
    output = graph.find_nodes(op="output")[0]
    results = output.args[0]
    return list(results) if isinstance(results, (list, tuple)) else [results]


def own_root(node: Any) -> Node | None:
    """The node whose new storage ``node`` looks into, None when that storage may be
    an input's (a placeholder or an attribute of the graph, or unknown)."""
    while isinstance(node, Node):
        alias = classify(node)
        if alias.kind == VIEW and alias.base is not None:
            node = alias.base
            continue
        if alias.kind == FRESH and node.op not in ("placeholder", "get_attr"):
            return node
        return None
    return None


def _holds_no_tensor(node: Node) -> bool:
    val = example_value(node)
    if val is not None:
        return not any(isinstance(v, torch.Tensor) for v in torch.utils._pytree.tree_leaves(val))
    name = op_name(node)
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


def _shares_input_storage(node: Node) -> bool:
    """Tells if the recorded values show an output sharing an input's storage."""
    val = example_value(node)
    if val is None:
        return False
    outputs = tensor_storages(val)
    if not outputs:
        return False
    inputs: list[Any] = []
    for arg in node.all_input_nodes:
        inputs.extend(tensor_storages(example_value(arg)))
    return bool(set(outputs) & set(inputs))
