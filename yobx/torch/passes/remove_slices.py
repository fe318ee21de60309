"""Removal of slices selecting everything and of copies changing nothing."""

from __future__ import annotations

import builtins
import operator
from typing import Any

import torch
from torch.fx import Graph, Node

from ._indexing import is_full_slice
from ._side_effects import writes_in
from ._sizes import true_at_every_size
from ._targets import INT64_MAX, aten, callable_name, example_value, is_tensor, recompile_owner
from .aliasing import FRESH, changes_metadata, classify, mutates_container, own_root, writes
from .erase import erase_with_inputs
from .result import PassResult


def _is_size_of(node: Any, base: Node, dim: int, rank: int | None) -> bool:
    """Tells if ``node`` is structurally the size of dimension ``dim`` of ``base``."""
    if not isinstance(node, Node):
        return False

    def same_dim(d: Any) -> bool:
        if not isinstance(d, int):
            return False
        if d == dim:
            return True
        return rank is not None and d % rank == dim % rank

    if node.op == "call_function" and node.target is aten.sym_size.int:
        return node.args[0] is base and same_dim(node.args[1])
    if node.op == "call_method" and node.target == "size" and len(node.args) == 2:
        return node.args[0] is base and same_dim(node.args[1])
    if node.op == "call_function" and node.target is operator.getitem:
        container, index = node.args
        if not same_dim(index) or not isinstance(container, Node):
            return False
        if container.op == "call_function" and container.target is builtins.getattr:
            return container.args[0] is base and container.args[1] == "shape"
        if container.op == "call_method" and container.target == "size":
            return container.args[0] is base and len(container.args) == 1
    return False


def _covers(stop: Any, base: Node, dim: int) -> bool:
    """Tells if ``stop`` is at least the size of dimension ``dim`` of ``base``."""
    if stop is None or stop == INT64_MAX:
        return True
    val = example_value(base)
    rank = val.dim() if isinstance(val, torch.Tensor) else None
    if _is_size_of(stop, base, dim, rank):
        return True
    if rank is None or not -rank <= dim < rank:
        return False
    bound = example_value(stop)
    if not isinstance(bound, (int, torch.SymInt)) or isinstance(bound, bool):
        return False
    return true_at_every_size(bound >= val.shape[dim])


def _full_slice(item: Any, base: Node, dim: int) -> bool:
    if item is Ellipsis or is_full_slice(item):
        return True
    return (
        isinstance(item, slice)
        and item.start in (None, 0)
        and item.step in (None, 1)
        and _covers(item.stop, base, dim)
    )


def _full_getitem(node: Node) -> bool:
    base, index = node.args
    if not isinstance(base, Node):
        return False
    entries = index if isinstance(index, tuple) else (index,)
    if not all(e is Ellipsis or isinstance(e, slice) for e in entries):
        return False
    if entries.count(Ellipsis) > 1:
        return False
    split = entries.index(Ellipsis) if Ellipsis in entries else len(entries)
    left = all(_full_slice(e, base, d) for d, e in enumerate(entries[:split]))
    right = entries[split + 1 :]
    return left and all(_full_slice(e, base, d - len(right)) for d, e in enumerate(right))


def _mutates(node: Node) -> bool:
    """Tells if a user may change the object itself (metadata or container content)."""
    return changes_metadata(node) or mutates_container(node)


def _identity_slice(node: Node) -> Node | None:
    """Returns the value a slice node is identical to, or None."""
    if node.op not in ("call_function", "call_method"):
        return None
    target = node.target
    if target is operator.getitem:
        if not _full_getitem(node):
            return None
        base = node.args[0]
        if is_tensor(base) is not True and any(_mutates(u) for u in base.users):
            return None
        return base
    if target is aten.slice.Tensor:
        base = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        start = node.args[2] if len(node.args) > 2 else node.kwargs.get("start")
        end = node.args[3] if len(node.args) > 3 else node.kwargs.get("end")
        step = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
        if start in (None, 0) and step == 1 and _covers(end, base, dim):
            return base
        return None
    name = callable_name(node)
    if name == "narrow" and len(node.args) == 4 and not node.kwargs:
        base, dim, start, length = node.args
        if isinstance(base, Node) and start == 0 and _covers_exactly(length, base, dim):
            return base
    return None


def _covers_exactly(length: Any, base: Node, dim: Any) -> bool:
    """narrow needs ``length == size``: a larger length is an error, not a full slice."""
    if not isinstance(dim, int):
        return False
    val = example_value(base)
    rank = val.dim() if isinstance(val, torch.Tensor) else None
    if _is_size_of(length, base, dim, rank):
        return True
    if rank is None or not -rank <= dim < rank:
        return False
    bound = example_value(length)
    if not isinstance(bound, (int, torch.SymInt)) or isinstance(bound, bool):
        return False
    return true_at_every_size(bound == val.shape[dim])


def _is_clone(node: Node) -> bool:
    if node.op == "call_function" and node.target is aten.clone.default:
        return True
    return callable_name(node) == "clone" and len(node.args) == 1


def _redundant_copy(node: Node, has_inplace: bool) -> Node | None:
    """Returns the value a copy node can be replaced with, or None."""
    if node.op not in ("call_function", "call_method"):
        return None
    name = callable_name(node)
    if name == "copy_" and len(node.args) >= 2 and node.args[0] is node.args[1]:
        return node.args[0]
    if _is_clone(node):
        inner = node.args[0]
        if (
            isinstance(inner, Node)
            and _is_clone(inner)
            and len(inner.users) == 1
            and node.kwargs == inner.kwargs
        ):
            return inner
        return None
    if node.target is aten.copy.default and not has_inplace:
        dst, src = node.args[0], node.args[1]
        # ``src`` may stand for the copy only when its storage is the graph's own: a
        # view of an input or a buffer (``b.t()``) returned in its place is read after
        # the mutations are written back, and sees a write into a buffer sharing that
        # storage where the copy kept the values it was given (fuzz_passes 71420)
        if not isinstance(src, Node) or own_root(src) is None:
            return None
        dval, sval = example_value(dst), example_value(src)
        if not (isinstance(dval, torch.Tensor) and isinstance(sval, torch.Tensor)):
            return None
        if (dval.dtype, dval.device, dval.dim()) != (sval.dtype, sval.device, sval.dim()):
            return None
        if all(true_at_every_size(a == b) for a, b in zip(dval.shape, sval.shape)):
            return src
    return None


def _is_copy_(node: Node) -> bool:
    if node.op == "call_method":
        return node.target == "copy_"
    return node.op == "call_function" and node.target in (
        aten.copy_.default,
        torch.Tensor.copy_,
    )


def _same_layout(dst: Any, src: Any) -> bool:
    """Same dtype, device, shape and strides: nothing tells one tensor from the other."""
    if not (isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor)):
        return False
    if (dst.dtype, dst.device, dst.dim()) != (src.dtype, src.device, src.dim()):
        return False
    pairs = [*zip(dst.shape, src.shape), *zip(dst.stride(), src.stride())]
    return all(true_at_every_size(a == b) for a, b in pairs)


def _filled_fresh_tensor(node: Node) -> tuple[Node, Node] | None:
    """``dst.copy_(src)`` where ``dst`` is a fresh tensor read for the first time there
    (``torch.empty_like(x)``, ``torch.zeros(...)``) and ``src`` a fresh tensor used only
    there, both of the same dtype, device, shape and strides: ``dst`` after the copy
    holds ``src`` exactly, and nothing else can observe ``src`` or the old ``dst``.

    :return: ``(dst, src)`` or None
    """
    if not _is_copy_(node) or len(node.args) != 2 or node.kwargs:
        return None
    dst, src = node.args
    if not (isinstance(dst, Node) and isinstance(src, Node)) or dst is src:
        return None
    if any(n.op in ("placeholder", "get_attr") for n in (dst, src)):
        return None
    if list(src.users) != [node] or classify(src).kind != FRESH:
        return None
    if classify(dst).kind != FRESH or writes(dst):
        return None
    # the copy is the first use of dst: nothing read or wrote its old value
    if not _first_user(dst, node):
        return None
    if not _same_layout(example_value(dst), example_value(src)):
        return None
    return dst, src


def _first_user(node: Node, user: Node) -> bool:
    """Tells if no other user of ``node`` comes before ``user`` in the graph."""
    current = node.next
    while current is not user:
        if current in node.users or current.op == "output":
            return False
        current = current.next
    return True


def _replace_filled_fresh_tensor(graph: Graph, node: Node, dst: Node, src: Node) -> int:
    """Makes every use of ``dst`` and of the copy use ``src``; erases the copy and
    ``dst``'s construction."""
    node.replace_all_uses_with(src)
    dst.replace_all_uses_with(src, delete_user_cb=lambda user: user is not node)
    # src is defined before the copy, maybe after dst: uses of dst come after the copy
    return erase_with_inputs(graph, node)


def remove_unnecessary_slices(graph: Graph, verbose: int = 0) -> PassResult:
    """Removes slices selecting everything and copies changing nothing.

    Handles ``x[:]``, ``x[:, :]``, ``x[..., :]``, ``x[0:9223372036854775807]``,
    ``x[:x.shape[0]]``, ``aten.slice.Tensor(x, d, 0, INT64_MAX)``, ``narrow`` of the whole
    length, ``x.copy_(x)``, ``clone(clone(x))`` and, in graphs without in-place nodes,
    ``aten.copy(a, b)`` when ``a`` and ``b`` have the same shape, dtype and device,
    ``dst.copy_(src)`` filling a fresh tensor (``torch.empty_like(x)``) with a fresh value
    of the same dtype, device, shape and strides used nowhere else. A bound
    is considered full only when it is provably so (constant, size of the same dimension,
    or ``meta["val"]``); other slices are kept.

    :param graph: graph to modify in place
    :param verbose: verbosity
    :return: the number of removed nodes (a :class:`PassResult`)

    Example::

        >>> import torch
        >>> from yobx.torch.passes import remove_unnecessary_slices
        >>> gm = torch.fx.symbolic_trace(lambda x: x[:, :].relu())
        >>> remove_unnecessary_slices(gm.graph)
        PassResult('remove_unnecessary_slices', count=1)
        >>> [n.op for n in gm.graph.nodes]
        ['placeholder', 'call_method', 'output']
    """
    has_inplace = writes_in(graph)
    removed = 0
    for node in list(graph.nodes):
        if node.graph is not graph:
            continue
        filled = _filled_fresh_tensor(node)
        if filled is not None:
            if verbose:
                dst, src = filled
                print(f"[remove_unnecessary_slices] {node.name}: {dst.name} is {src.name}")
            removed += _replace_filled_fresh_tensor(graph, node, *filled)
            continue
        replacement = _identity_slice(node)
        if replacement is None:
            replacement = _redundant_copy(node, has_inplace)
        if replacement is None or any(_mutates(u) for u in node.users):
            continue
        if verbose:
            print(f"[remove_unnecessary_slices] {node.name} -> {replacement.name}")
        node.replace_all_uses_with(replacement)
        # a self copy_ writes nothing: it goes although copy_ has a side effect in general
        removed += erase_with_inputs(graph, node)
    if removed:
        # (an unchanged graph is as well-formed as it was)
        graph.lint()
    recompile_owner(graph)
    return PassResult("remove_unnecessary_slices", removed)
