"""Aliasing of FX nodes: which nodes are views of their input and how to write through them.

A *view* node shares storage with its first argument; writing a new value into the view
means computing a new value of that argument (a *scatter*: ``slice_scatter``,
``select_scatter``, an inverse permutation, ...). ``classify`` returns for each node
whether its result is fresh storage, a view (with its scatter when one exists), an
*opaque* value that may or may not alias its inputs, or not a tensor at all.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Graph, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ._node_kinds import (
    _FRESH_MODULES,
    _FUNCTIONAL_OPERATORS,
    INT64_MAX,
    VIEW_ATTRIBUTES,
    _callable_name,
    _module_of,
    aten,
    aten_returns_fresh,
    example_value,
    is_tensor,
)

# scatter(graph, view_node, base_value, new_view_value) -> new base value
Scatter = Callable[[Graph, Node, Node, Node], Node]


@dataclass
class Alias:
    """How a node's result relates to the storage of its inputs.

    :param kind: ``"fresh"``, ``"view"`` (of ``node.args[0]``), ``"opaque"`` (may alias any
        tensor argument) or ``"nontensor"``
    :param scatter: for views, builds the new value of the input from a new value of the
        view; None when the view cannot be written through (expand, as_strided, ...)
    """

    kind: str
    scatter: Scatter | None = None


FRESH = Alias("fresh")
OPAQUE = Alias("opaque")
NONTENSOR = Alias("nontensor")


def _arg(node: Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _varargs(node: Node, name: str) -> list[Any]:
    """Returns a sequence given either as varargs (``x.permute(1, 0)``) or as a list."""
    if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)):
        return list(node.args[1])
    if len(node.args) > 1:
        return list(node.args[1:])
    return list(node.kwargs.get(name, ()))


def _call(graph: Graph, target: Any, *args: Any, **kwargs: Any) -> Node:
    return graph.call_function(target, args, kwargs or None)


def _size(graph: Graph, base: Node, dim: Any, aten_level: bool) -> Node:
    if aten_level:
        return _call(graph, aten.sym_size.int, base, dim)
    return graph.call_method("size", (base, dim))


def _normalized_start(graph: Graph, base: Node, dim: Any, start: Any, aten_level: bool) -> Any:
    """Makes a narrow start non-negative: narrow accepts ``-size <= start <= size``."""
    if isinstance(start, int):
        if start >= 0:
            return start
        return _call(graph, operator.add, start, _size(graph, base, dim, aten_level))
    return _call(graph, operator.mod, start, _size(graph, base, dim, aten_level))


def _scatter_reshape(aten_level: bool) -> Scatter:
    def scatter(graph: Graph, view: Node, base: Node, new: Node) -> Node:
        if aten_level:
            return _call(graph, aten.reshape_as.default, new, base)
        return graph.call_method("reshape_as", (new, base))

    return scatter


def _scatter_identity(graph: Graph, view: Node, base: Node, new: Node) -> Node:
    return new


def _inverse_permutation(dims: list[Any]) -> list[int] | None:
    if not all(isinstance(d, int) for d in dims):
        return None
    rank = len(dims)
    normalized = [d % rank for d in dims]
    inverse = [0] * rank
    for i, d in enumerate(normalized):
        inverse[d] = i
    return inverse


def _scatter_permute(aten_level: bool) -> Scatter | None:
    def scatter(graph: Graph, view: Node, base: Node, new: Node) -> Node:
        dims = list(view.args[1]) if aten_level else _varargs(view, "dims")
        inverse = _inverse_permutation(dims)
        if aten_level:
            return _call(graph, aten.permute.default, new, inverse)
        return _call(graph, torch.permute, new, inverse)

    return scatter


def _permute_is_constant(node: Node, aten_level: bool) -> bool:
    dims = list(node.args[1]) if aten_level else _varargs(node, "dims")
    return _inverse_permutation(dims) is not None


def _scatter_transpose(aten_level: bool) -> Scatter:
    def scatter(graph: Graph, view: Node, base: Node, new: Node) -> Node:
        dim0, dim1 = _arg(view, 1, "dim0"), _arg(view, 2, "dim1")
        if aten_level:
            return _call(graph, aten.transpose.int, new, dim0, dim1)
        return _call(graph, torch.transpose, new, dim0, dim1)

    return scatter


def _scatter_t(aten_level: bool) -> Scatter:
    def scatter(graph: Graph, view: Node, base: Node, new: Node) -> Node:
        return _call(graph, aten.t.default if aten_level else torch.t, new)

    return scatter


def _scatter_movedim(graph: Graph, view: Node, base: Node, new: Node) -> Node:
    source, destination = _arg(view, 1, "source"), _arg(view, 2, "destination")
    return _call(graph, torch.movedim, new, destination, source)


def _scatter_select(aten_level: bool) -> Scatter:
    def scatter(graph: Graph, view: Node, base: Node, new: Node) -> Node:
        dim, index = _arg(view, 1, "dim"), _arg(view, 2, "index")
        if aten_level:
            return _call(graph, aten.select_scatter.default, base, new, dim, index)
        return _call(graph, torch.select_scatter, base, new, dim, index)

    return scatter


def _scatter_slice(graph: Graph, view: Node, base: Node, new: Node) -> Node:
    dim = _arg(view, 1, "dim", 0)
    start, end, step = _arg(view, 2, "start"), _arg(view, 3, "end"), _arg(view, 4, "step", 1)
    return _call(graph, aten.slice_scatter.default, base, new, dim, start, end, step)


def _scatter_narrow(aten_level: bool) -> Scatter:
    def scatter(graph: Graph, view: Node, base: Node, new: Node) -> Node:
        dim, start, length = _arg(view, 1, "dim"), _arg(view, 2, "start"), _arg(view, 3, "length")
        start = _normalized_start(graph, base, dim, start, aten_level)
        end = start + length if isinstance(start, int) and isinstance(length, int) else None
        if end is None:
            end = _call(graph, operator.add, start, length)
        if aten_level:
            return _call(graph, aten.slice_scatter.default, base, new, dim, start, end)
        return _call(graph, torch.slice_scatter, base, new, dim, start, end)

    return scatter


def _scatter_diagonal(aten_level: bool) -> Scatter:
    def scatter(graph: Graph, view: Node, base: Node, new: Node) -> Node:
        offset, dim1, dim2 = (
            _arg(view, 1, "offset", 0),
            _arg(view, 2, "dim1", 0),
            _arg(view, 3, "dim2", 1),
        )
        target = aten.diagonal_scatter.default if aten_level else torch.diagonal_scatter
        return _call(graph, target, base, new, offset, dim1, dim2)

    return scatter


def _scatter_getitem(graph: Graph, view: Node, base: Node, new: Node) -> Node:
    steps = basic_index_steps(view.args[1])
    return scatter_steps(graph, base, new, steps)


def is_full_slice(item: Any) -> bool:
    """Tells if a Python slice selects a whole dimension whatever its size."""
    return (
        isinstance(item, slice)
        and item.start in (None, 0)
        and item.stop in (None, INT64_MAX)
        and item.step in (None, 1)
    )


def _entry_kind(entry: Any) -> str | None:
    if entry is None:
        return "newaxis"
    if entry is Ellipsis:
        return "ellipsis"
    if isinstance(entry, bool):
        return None
    if isinstance(entry, int):
        return "int"
    if isinstance(entry, slice):
        bounds = (entry.start, entry.stop, entry.step)
        if any(isinstance(b, Node) and is_tensor(b) is not False for b in bounds):
            return None
        return "slice"
    if isinstance(entry, Node):
        kind = is_tensor(entry)
        if kind is False:
            return "int"
        return "advanced" if kind else None
    if isinstance(entry, (list, tuple)) and all(
        isinstance(e, int) and not isinstance(e, bool) for e in entry
    ):
        return "advanced"
    return None


@dataclass
class IndexPlan:
    """Decomposition of a ``__getitem__``/``__setitem__`` index.

    :param steps: basic views applied in order, ``("select", dim, index)``,
        ``("slice", dim, slice)`` or ``("unsqueeze", dim)``
    :param advanced: indices for ``index_put`` on the result of the steps (None entries for
        whole dimensions), empty when the index is basic
    """

    steps: list[tuple]
    advanced: list[Any]


def plan_index(index: Any, base_rank: int | None = None) -> IndexPlan | None:
    """Decomposes an index the way torch applies it, None when it cannot be proven."""
    entries = index if isinstance(index, tuple) else (index,)
    kinds = [_entry_kind(e) for e in entries]
    if any(k is None for k in kinds) or kinds.count("ellipsis") > 1:
        return None
    split = kinds.index("ellipsis") if "ellipsis" in kinds else len(kinds)
    steps: list[tuple] = []
    advanced: list[Any] = []
    dim: int | None = 0
    for entry, kind in zip(entries[:split], kinds[:split]):
        if kind in ("int", "slice", "newaxis") and dim is None:
            return None
        if kind == "newaxis":
            steps.append(("unsqueeze", dim))
            advanced.append(None)
            dim += 1
        elif kind == "int":
            steps.append(("select", dim, entry))
        elif kind == "slice":
            if not is_full_slice(entry):
                steps.append(("slice", dim, entry))
            advanced.append(None)
            dim += 1
        else:
            advanced.append(entry)
            dim = None if _mask_rank(entry) is None else dim + _mask_rank(entry)
    right = list(zip(entries[split + 1 :], kinds[split + 1 :]))
    if any(kind == "advanced" for _, kind in right):
        if base_rank is None or dim is None:
            return None
        return _plan_right_advanced(entries, kinds, split, base_rank)
    negative = -1
    for entry, kind in reversed(right):
        if kind == "newaxis":
            steps.append(("unsqueeze", negative))
            negative -= 1
        elif kind == "int":
            steps.append(("select", negative, entry))
        else:
            if not is_full_slice(entry):
                steps.append(("slice", negative, entry))
            negative -= 1
    if not any(a is not None for a in advanced):
        advanced = []
    return IndexPlan(steps, advanced)


def _plan_right_advanced(
    entries: tuple, kinds: list[str], split: int, base_rank: int
) -> IndexPlan | None:
    """Expands the ellipsis when advanced indices follow it (the rank must be known)."""
    consumed = 0
    for entry, kind in zip(entries, kinds):
        if kind in ("int", "slice"):
            consumed += 1
        elif kind == "advanced":
            rank = _mask_rank(entry)
            if rank is None:
                return None
            consumed += rank
    fill = base_rank - consumed
    if fill < 0:
        return None
    expanded = (*entries[:split], *([slice(None)] * fill), *entries[split + 1 :])
    return plan_index(expanded, None)


def _mask_rank(entry: Any) -> int | None:
    """Number of dimensions an advanced index consumes (a boolean mask consumes its rank)."""
    if isinstance(entry, (list, tuple)):
        return 1
    val = example_value(entry)
    if not isinstance(val, torch.Tensor):
        return None
    return val.dim() if val.dtype in (torch.bool, torch.uint8) else 1


def _index_for_dim(dim: int, entry: Any) -> tuple:
    if dim >= 0:
        return (*([slice(None)] * dim), entry)
    return (Ellipsis, entry, *([slice(None)] * (-dim - 1)))


def apply_step(graph: Graph, value: Node, step: tuple) -> Node:
    """Emits the view described by one step of an ``IndexPlan``."""
    if step[0] == "unsqueeze":
        return _call(graph, torch.unsqueeze, value, step[1])
    return _call(graph, operator.getitem, value, _index_for_dim(step[1], step[2]))


def scatter_step(graph: Graph, base: Node, new: Node, step: tuple) -> Node:
    """Emits the new value of ``base`` once the view ``step`` of it receives ``new``."""
    if step[0] == "unsqueeze":
        return _call(graph, torch.squeeze, new, step[1])
    if step[0] == "select":
        return _call(graph, torch.select_scatter, base, new, step[1], step[2])
    item: slice = step[2]
    return _call(
        graph,
        torch.slice_scatter,
        base,
        new,
        step[1],
        item.start,
        item.stop,
        1 if item.step is None else item.step,
    )


def scatter_steps(graph: Graph, base: Node, new: Node, steps: list[tuple]) -> Node:
    """Writes ``new`` into the view of ``base`` described by ``steps``."""
    intermediates = [base]
    for step in steps[:-1]:
        intermediates.append(apply_step(graph, intermediates[-1], step))
    for step, value in zip(reversed(steps), reversed(intermediates)):
        new = scatter_step(graph, value, new, step)
    return new


def basic_index_steps(index: Any) -> list[tuple] | None:
    """Returns the views of a basic index (ints, slices, None, Ellipsis), else None."""
    plan = plan_index(index)
    if plan is None or plan.advanced:
        return None
    return plan.steps


def is_contiguous(val: Any) -> bool:
    """Tells if a (fake) tensor is provably contiguous, without adding any guard."""
    if not isinstance(val, torch.Tensor):
        return False
    expected: Any = 1
    for size, stride in zip(reversed(val.shape), reversed(val.stride())):
        if statically_known_true(size == 1):
            continue
        if not statically_known_true(stride == expected):
            return False
        expected = expected * size
    return True


_TORCH_VIEWS: dict[str, Callable[[Node], Scatter | None]] = {
    "transpose": lambda n: _scatter_transpose(False),
    "swapaxes": lambda n: _scatter_transpose(False),
    "swapdims": lambda n: _scatter_transpose(False),
    "t": lambda n: _scatter_t(False),
    "permute": lambda n: _scatter_permute(False) if _permute_is_constant(n, False) else None,
    "movedim": lambda n: _scatter_movedim,
    "moveaxis": lambda n: _scatter_movedim,
    "unsqueeze": lambda n: _scatter_reshape(False),
    "squeeze": lambda n: _scatter_reshape(False),
    "view": lambda n: (
        None
        if any(isinstance(a, torch.dtype) for a in (*n.args[1:], *n.kwargs.values()))
        else _scatter_reshape(False)
    ),
    "view_as": lambda n: _scatter_reshape(False),
    "unflatten": lambda n: _scatter_reshape(False),
    "narrow": lambda n: _scatter_narrow(False),
    "select": lambda n: _scatter_select(False),
    "diagonal": lambda n: _scatter_diagonal(False),
    "detach": lambda n: _scatter_identity,
    "alias": lambda n: _scatter_identity,
    # autograd-only in-place methods return their input itself
    "detach_": lambda n: _scatter_identity,
    "requires_grad_": lambda n: _scatter_identity,
    "expand": lambda n: None,
    "expand_as": lambda n: None,
    "broadcast_to": lambda n: None,
    "as_strided": lambda n: None,
    "unfold": lambda n: None,
    "real": lambda n: None,
    "imag": lambda n: None,
    "view_as_real": lambda n: None,
    "view_as_complex": lambda n: None,
    "split": lambda n: None,
    "chunk": lambda n: None,
    "unbind": lambda n: None,
    "tensor_split": lambda n: None,
    "split_with_sizes": lambda n: None,
    "hsplit": lambda n: None,
    "vsplit": lambda n: None,
    "dsplit": lambda n: None,
}
# Reshapes alias their input only when it is contiguous.
_MAYBE_VIEWS = frozenset({"reshape", "reshape_as", "flatten", "ravel"})

_ATEN_VIEWS: dict[str, Callable[[Node], Scatter | None]] = {
    "slice": lambda n: _scatter_slice,
    "select": lambda n: _scatter_select(True),
    "narrow": lambda n: _scatter_narrow(True),
    "diagonal": lambda n: _scatter_diagonal(True),
    "transpose": lambda n: _scatter_transpose(True),
    "t": lambda n: _scatter_t(True),
    "permute": lambda n: _scatter_permute(True) if _permute_is_constant(n, True) else None,
    "view": lambda n: _scatter_reshape(True),
    "_reshape_alias": lambda n: _scatter_reshape(True),
    "unsqueeze": lambda n: _scatter_reshape(True),
    "squeeze": lambda n: _scatter_reshape(True),
    "unflatten": lambda n: _scatter_reshape(True),
    "view_as": lambda n: _scatter_reshape(True),
    "alias": lambda n: _scatter_identity,
    "detach": lambda n: _scatter_identity,
}
_ATEN_OTHER_VIEWS = frozenset(
    {
        "expand",
        "expand_as",
        "as_strided",
        "unfold",
        "real",
        "imag",
        "view_as_real",
        "view_as_complex",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "tensor_split",
        "movedim",
        "swapaxes",
        "swapdims",
        "indices",
        "values",
    }
)


def _classify_aten(node: Node) -> Alias:
    target: torch._ops.OpOverload = node.target
    schema = target._schema
    returns = schema.returns
    name = schema.name.split("::")[-1]
    if not any(str(r.type) in ("Tensor", "Tensor[]", "Tensor?") for r in returns):
        return NONTENSOR
    if name in ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"):
        return OPAQUE
    if all(r.alias_info is None for r in returns):
        return FRESH
    if any(r.alias_info is not None and r.alias_info.is_write for r in returns):
        # in-place ops are handled by the pass itself; their result is the mutated input
        return Alias("view", _scatter_identity)
    if name in _ATEN_VIEWS:
        return Alias("view", _ATEN_VIEWS[name](node))
    if name in _ATEN_OTHER_VIEWS:
        return Alias("view", None)
    if name in ("reshape", "flatten") and is_contiguous(example_value(node.args[0])):
        return Alias("view", _scatter_reshape(True))
    return OPAQUE


def classify(node: Node) -> Alias:
    """Tells whether a node's result is fresh, a view of ``node.args[0]``, opaque or no tensor."""
    if node.op in ("placeholder", "get_attr", "output"):
        return FRESH
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return _classify_aten(node)
    tensor = is_tensor(node)
    if node.op == "call_module":
        module = _module_of(node)
        if isinstance(module, torch.nn.Identity):
            return Alias("view", _scatter_identity)
        if isinstance(module, _FRESH_MODULES):
            return FRESH
        return OPAQUE
    target = node.target
    base = node.args[0] if node.args else None
    if node.op == "call_function" and target is operator.getitem:
        base_kind = is_tensor(base)
        if base_kind is True:
            plan = plan_index(node.args[1])
            if plan is None:
                return OPAQUE
            if plan.advanced:
                return FRESH
            return Alias("view", _scatter_getitem)
        if tensor is False:
            return NONTENSOR
        if base_kind is False and isinstance(base, Node) and _returns_new_tensors(base):
            # element of a tuple of new tensors (max.dim, sort, topk...)
            return FRESH
        # element of a tuple of views (split, chunk...) or of unknown origin
        return OPAQUE
    if node.op == "call_function" and target is builtins.getattr:
        if node.args[1] in VIEW_ATTRIBUTES:
            if node.args[1] == "T":
                return Alias("view", _scatter_t_attribute)
            if node.args[1] == "mT":
                return Alias("view", _scatter_mt_attribute)
            return Alias("view", None)
        return NONTENSOR if tensor is False else OPAQUE
    if tensor is False:
        return NONTENSOR
    if node.op == "call_function" and target in _FUNCTIONAL_OPERATORS:
        return FRESH
    name = _callable_name(node)
    if name is None:
        return OPAQUE
    if isinstance(base, Node) and name in _TORCH_VIEWS:
        return Alias("view", _TORCH_VIEWS[name](node))
    if isinstance(base, Node) and name in _MAYBE_VIEWS:
        if is_contiguous(example_value(base)):
            return Alias("view", _scatter_reshape(False))
        return OPAQUE
    return FRESH if aten_returns_fresh(name) else OPAQUE


def _returns_new_tensors(node: Node) -> bool:
    """Tells if a node producing several values allocates all of them (sort, max.dim...)."""
    if node.op not in ("call_function", "call_method"):
        return False
    if isinstance(node.target, torch._ops.OpOverload):
        return _classify_aten(node) is FRESH
    name = _callable_name(node)
    return name is not None and aten_returns_fresh(name) is True


def _scatter_t_attribute(graph: Graph, view: Node, base: Node, new: Node) -> Node:
    return _call(graph, builtins.getattr, new, "T")


def _scatter_mt_attribute(graph: Graph, view: Node, base: Node, new: Node) -> Node:
    return _call(graph, torch.transpose, new, -2, -1)
