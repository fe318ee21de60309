"""Views of a tensor and how to write through them.

A *view* node shares storage with its base; writing a new value into the view means
computing a new value of the base (a *scatter*: ``slice_scatter``, ``select_scatter``, an
inverse permutation, ...). This module maps each view operation to its scatter, including
the elements of tuple-of-views operations (``split``, ``chunk``, ``unbind``,
``tensor_split``, ``split_with_sizes``, ``hsplit``...). A view without a scatter
(``expand``, ``as_strided``...) still aliases its base; writing through it is refused.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Graph, Node

from ._indexing import basic_index_steps, scatter_steps
from ._sizes import true_at_every_size
from ._targets import aten, example_value

# scatter(graph, view_node, base_value, new_view_value) -> new base value
Scatter = Callable[[Graph, Node, Node, Node], Node]

#: ``node.meta`` key a tracer sets on a ``contiguous()`` or a reshape whose result is a
#: view at some sizes and a copy at others, once the capture decided which it is at the
#: sizes its graph runs for (see ``yobx.torch.tracing.core.layout_copies``):
#: :data:`LAYOUT_VIEW` or :data:`LAYOUT_COPY`
LAYOUT_KEY = "yobx_layout"
LAYOUT_VIEW = "view"
LAYOUT_COPY = "copy"


def _arg(node: Node, index: int, name: str, default: Any = None, *aliases: str) -> Any:
    if len(node.args) > index:
        return node.args[index]
    for key in (name, *aliases):
        if key in node.kwargs:
            return node.kwargs[key]
    return default


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
        dim0 = _arg(view, 1, "dim0", None, "axis0")
        dim1 = _arg(view, 2, "dim1", None, "axis1")
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


def scatter_getitem(graph: Graph, view: Node, base: Node, new: Node) -> Node:
    """Writes through a basic ``base[index]`` view."""
    steps = basic_index_steps(view.args[1])
    return scatter_steps(graph, base, new, steps)


def is_contiguous(val: Any) -> bool:
    """Tells if a (fake) tensor is provably contiguous, without adding any guard."""
    if not isinstance(val, torch.Tensor):
        return False
    expected: Any = 1
    for size, stride in zip(reversed(val.shape), reversed(val.stride())):
        if true_at_every_size(size == 1):
            continue
        if not true_at_every_size(stride == expected):
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
    # view.dtype reinterprets the bytes: it cannot be inverted by a reshape
    "view": lambda n: None if n.target._overloadname == "dtype" else _scatter_reshape(True),
    "_reshape_alias": lambda n: _scatter_reshape(True),
    "unsqueeze": lambda n: _scatter_reshape(True),
    "squeeze": lambda n: _scatter_reshape(True),
    "unflatten": lambda n: _scatter_reshape(True),
    "view_as": lambda n: _scatter_reshape(True),
    "alias": lambda n: _scatter_identity,
    "detach": lambda n: _scatter_identity,
    "swapaxes": lambda n: _scatter_transpose(True),
    "swapdims": lambda n: _scatter_transpose(True),
    "numpy_T": lambda n: _scatter_self_inverse,
    "mT": lambda n: _scatter_self_inverse,
    "movedim": lambda n: _scatter_aten_movedim,
}


def _scatter_self_inverse(graph: Graph, view: Node, base: Node, new: Node) -> Node:
    """Views which are their own inverse (``numpy_T`` reverses the dimensions, ``mT``
    swaps the last two or returns a tensor of fewer than 2 itself)."""
    return _call(graph, view.target, new, *view.args[1:])


def _scatter_aten_movedim(graph: Graph, view: Node, base: Node, new: Node) -> Node:
    source, destination = _arg(view, 1, "source"), _arg(view, 2, "destination")
    return _call(graph, view.target, new, destination, source)


def scatter_t_attribute(graph: Graph, view: Node, base: Node, new: Node) -> Node:
    """Inverse of ``x.T``: reversing the dimensions is its own inverse."""
    return _call(graph, builtins.getattr, new, "T")


def scatter_mt_attribute(graph: Graph, view: Node, base: Node, new: Node) -> Node:
    """Inverse of ``x.mT``, which is its own inverse: a transposition of the last two
    dimensions, the identity on a tensor of fewer than 2 (where torch deprecates
    ``mT`` but returns the tensor itself); ``mT`` again when the rank is unknown (a
    graph without values)."""
    value = example_value(view)
    if not isinstance(value, torch.Tensor):
        return _call(graph, builtins.getattr, new, "mT")
    if value.dim() < 2:
        return new
    return _call(graph, torch.transpose, new, -2, -1)


def torch_view_scatter(name: str, node: Node) -> tuple[bool, Scatter | None]:
    """Tells if torch-level ``name`` is always a view of its first argument, and its scatter."""
    factory = _TORCH_VIEWS.get(name)
    if factory is None:
        return False, None
    return True, factory(node)


def aten_view_scatter(name: str, node: Node) -> tuple[bool, Scatter | None]:
    """Tells if aten ``name`` is always a view of its first argument, and its scatter."""
    factory = _ATEN_VIEWS.get(name)
    if factory is None:
        return False, None
    return True, factory(node)


def keeps_shape(base: Any, result: Any) -> bool:
    """Whether a reshape's result provably has its input's shape (``y[::2].reshape(-1)``
    of a 1-d ``y``): torch then returns a view whatever the strides."""
    if not isinstance(base, torch.Tensor) or not isinstance(result, torch.Tensor):
        return False
    if base.dim() != result.dim():
        return False
    return all(true_at_every_size(a == b) for a, b in zip(base.shape, result.shape))


def may_be_view(name: str) -> bool:
    """Reshapes alias their input when its layout allows it, else they copy."""
    return name in _MAYBE_VIEWS


def scatter_reshape(aten_level: bool) -> Scatter:
    """Writes a reshaped view back (the reshape of a contiguous tensor is a view)."""
    return _scatter_reshape(aten_level)


scatter_identity = _scatter_identity


# Operations returning a tuple of views of their first argument.
SPLIT_FAMILY = frozenset(
    {
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "tensor_split",
        "hsplit",
        "vsplit",
        "dsplit",
        "unsafe_split",
        "unsafe_chunk",
        "unsafe_split_with_sizes",
    }
)
_AMOUNT_NAMES = (
    "split_size_or_sections",
    "split_size",
    "split_sizes",
    "chunks",
    "indices_or_sections",
    "sections",
    "indices",
)


def _split_name(node: Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", "")


def _split_dim(node: Node, name: str) -> Any:
    if name in ("hsplit", "vsplit", "dsplit"):
        if name == "vsplit":
            return 0
        if name == "dsplit":
            return 2
        val = example_value(node.args[0])
        if not isinstance(val, torch.Tensor):
            return None
        return 1 if val.dim() > 1 else 0
    position = 1 if name == "unbind" else 2
    return _arg(node, position, "dim", 0)


def _arith(graph: Graph, op: Any, a: Any, b: Any) -> Any:
    """``op(a, b)`` computed now on ints, emitted as a node on symbolic values."""
    if isinstance(a, int) and isinstance(b, int):
        return op(a, b)
    return _call(graph, op, a, b)


def _minimum(graph: Graph, a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return _call(graph, torch.sym_min, a, b)


def _is_size(value: Any) -> bool:
    """An int or a node holding an int (a tensor of indices is not a size)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, Node):
        return isinstance(example_value(value), (int, torch.SymInt))
    return False


def _split_spec(container: Node, index: int) -> tuple[str, int, Any] | None:
    """``(name, dim, amount)`` of a split-like node when element ``index`` has exact bounds."""
    name = _split_name(container).removeprefix("unsafe_")
    if name not in SPLIT_FAMILY or index < 0:
        return None
    dim = _split_dim(container, name)
    if not isinstance(dim, int):
        return None
    if name == "unbind":
        return name, dim, None
    amount = _arg(container, 1, _AMOUNT_NAMES[0], None, *_AMOUNT_NAMES[1:])
    if isinstance(amount, (list, tuple)):
        if not all(_is_size(a) for a in amount):
            return None
        if name in ("split", "split_with_sizes") and index >= len(amount):
            return None
        return name, dim, list(amount)
    if name == "split_with_sizes" or not _is_size(amount):
        return None
    return name, dim, amount


def _element_bounds(graph: Graph, spec: tuple, base: Node, index: int, aten_level: bool) -> tuple:
    """Emits ``(dim, start, end)`` of element ``index`` of a split-like node."""
    name, dim, amount = spec
    if isinstance(amount, list):
        if name in ("split", "split_with_sizes"):
            start: Any = 0
            for size in amount[:index]:
                start = _arith(graph, operator.add, start, size)
            return dim, start, _arith(graph, operator.add, start, amount[index])
        # tensor_split, hsplit... with indices: slice semantics between the indices
        start = amount[index - 1] if index > 0 else 0
        return dim, start, amount[index] if index < len(amount) else None
    if name == "split":
        start = _arith(graph, operator.mul, index, amount)
        return dim, start, _arith(graph, operator.add, start, amount)
    size = _size(graph, base, dim, aten_level)
    if name == "chunk":
        # chunk(n) is split(ceil(size / n))
        rounded = _arith(graph, operator.sub, _arith(graph, operator.add, size, amount), 1)
        step = _arith(graph, operator.floordiv, rounded, amount)
        start = _arith(graph, operator.mul, index, step)
        return dim, start, _arith(graph, operator.add, start, step)
    # tensor_split, hsplit, vsplit, dsplit with a number of sections: the first
    # ``size % sections`` sections get one more element
    quotient = _arith(graph, operator.floordiv, size, amount)
    remainder = _arith(graph, operator.mod, size, amount)

    def bound(i: int) -> Any:
        scaled = _arith(graph, operator.mul, i, quotient)
        return _arith(graph, operator.add, scaled, _minimum(graph, i, remainder))

    return dim, bound(index), bound(index + 1)


def element_scatter(container: Node, index: int) -> Scatter | None:
    """Scatter writing element ``index`` of a split-like ``container`` back into its base,
    None when its bounds cannot be known (a tensor of indices, an unknown rank...)."""
    spec = _split_spec(container, index)
    if spec is None:
        return None
    aten_level = isinstance(container.target, torch._ops.OpOverload)

    def scatter(graph: Graph, view: Node, base: Node, new: Node) -> Node:
        if spec[0] == "unbind":
            target = aten.select_scatter.default if aten_level else torch.select_scatter
            return _call(graph, target, base, new, spec[1], index)
        dim, start, end = _element_bounds(graph, spec, base, index, aten_level)
        target = aten.slice_scatter.default if aten_level else torch.slice_scatter
        return _call(graph, target, base, new, dim, start, end)

    return scatter


def is_split(node: Node) -> bool:
    """Tells if a node is a tuple-of-views operation (split, chunk, unbind...)."""
    return _split_name(node).removeprefix("unsafe_") in SPLIT_FAMILY
