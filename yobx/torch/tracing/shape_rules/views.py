"""Shape rules of view operations: the output shares the input's storage.

transpose, permute, unsqueeze, squeeze, expand, view/reshape/flatten (strides from
ATen's ``computeStride``; ``reshape`` copies when no view exists), split/chunk along a
static dimension, basic indexing (ints, symbolic ints known inside their dimension,
full or static slices, ``None``, ``...``), ``contiguous`` and ``to(dtype)``.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import sympy
import torch
from torch._prims_common import is_contiguous_for_memory_format_or_false
from torch._subclasses.fake_tensor import FakeTensor

from ._base import (
    TensorFactory,
    Unsupported,
    broadcast_shapes,
    common_device,
    contiguous_strides,
    decide,
    exactly_contiguous,
    fake,
    is_one,
    is_static,
    normalize_dim,
    pure_key,
    rebuild_symint,
    remember_recipes,
    require_contiguous,
    same_size,
    size_key,
)


def _sizes_argument(args: tuple) -> tuple:
    """``view(a, b)`` and ``view((a, b))`` both give ``(a, b)``."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def transpose(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    if kwargs or len(args) != 3:
        raise Unsupported("unexpected arguments")
    x = fake(args[0])
    rank = x.dim()
    d0, d1 = normalize_dim(args[1], rank), normalize_dim(args[2], rank)
    sizes, strides = list(x.shape), list(x.stride())
    sizes[d0], sizes[d1] = sizes[d1], sizes[d0]
    strides[d0], strides[d1] = strides[d1], strides[d0]
    return factory.view(x, sizes, strides)


def permute(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    if kwargs:
        raise Unsupported("unexpected arguments")
    x = fake(args[0])
    rank = x.dim()
    dims = [normalize_dim(d, rank) for d in _sizes_argument(args[1:])]
    if sorted(dims) != list(range(rank)):
        raise Unsupported("not a permutation")
    sizes, strides = x.shape, x.stride()
    return factory.view(x, [sizes[d] for d in dims], [strides[d] for d in dims])


def unsqueeze(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    if kwargs or len(args) != 2:
        raise Unsupported("unexpected arguments")
    x = fake(args[0])
    dim = normalize_dim(args[1], x.dim() + 1)
    sizes, strides = list(x.shape), list(x.stride())
    # as ATen's inferUnsqueezeGeometry
    stride = 1 if dim >= len(sizes) else sizes[dim] * strides[dim]
    sizes.insert(dim, 1)
    strides.insert(dim, stride)
    return factory.view(x, sizes, strides)


def squeeze(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``squeeze(dim)`` of a static size-1 dimension."""
    if kwargs or len(args) != 2 or type(args[1]) is not int:
        raise Unsupported("only squeeze(dim)")
    x = fake(args[0])
    dim = normalize_dim(args[1], x.dim())
    sizes, strides = list(x.shape), list(x.stride())
    if not is_one(sizes[dim]):
        raise Unsupported("the dimension is not a static 1")
    del sizes[dim], strides[dim]
    return factory.view(x, sizes, strides)


def expand(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    if kwargs:
        raise Unsupported("unexpected arguments")
    x = fake(args[0])
    target = _sizes_argument(args[1:])
    rank, new_rank = x.dim(), len(target)
    if new_rank < rank:
        raise Unsupported("fewer sizes than dimensions")
    sizes, strides = list(x.shape), list(x.stride())
    out_sizes, out_strides = [], []
    for i, size in enumerate(target):
        j = i - (new_rank - rank)
        if j < 0:
            if is_static(size, -1):
                raise Unsupported("-1 for a new dimension")
            out_sizes.append(size)
            out_strides.append(0)
            continue
        if is_static(size, -1) or same_size(size, sizes[j]):
            out_sizes.append(sizes[j])
            out_strides.append(strides[j])
        elif is_one(sizes[j]):
            out_sizes.append(size)
            out_strides.append(0)
        else:
            raise Unsupported("expanding a dimension that may not be 1")
    return factory.view(x, out_sizes, out_strides)


def _view_sizes(x: FakeTensor, target: tuple) -> list[Any]:
    """:func:`infer_sizes`, remembered across traces (:data:`_VIEW_SIZES`).

    The sizes are a function of the expressions and hints of ``x.shape`` and
    ``target`` alone (SymInt arithmetic and sympy, no decision on ranges); a hit
    rebuilds the inferred size as a new ``SymInt`` of ``x``'s ShapeEnv.
    """
    key = (tuple(map(pure_key, x.shape)), tuple(map(pure_key, target)))
    recipe = _VIEW_SIZES.get(key)
    if recipe is None:
        sizes = infer_sizes(x, target)
        # the target's own sizes are kept as they are, only an inferred one is rebuilt
        remember_recipes(
            _VIEW_SIZES, key, tuple(-1 if s is t else s for s, t in zip(sizes, target))
        )
        return sizes
    shape_env = x.fake_mode.shape_env
    return [t if r == -1 else rebuild_symint(r, shape_env) for r, t in zip(recipe, target)]


#: (sizes of a tensor, target of its view) -> recipes of the view's sizes, -1 for a
#: size of the target itself
_VIEW_SIZES: dict[tuple, tuple] = {}


def infer_sizes(x: torch.Tensor, target: tuple) -> list[Any]:
    """Replaces a ``-1`` by the size it stands for, proving the element count matches."""
    numel = x.numel()
    known: Any = 1
    missing = None
    for i, size in enumerate(target):
        key = size_key(size)
        if key == -1:
            if missing is not None:
                raise Unsupported("two -1")
            missing = i
        elif type(key) is int and key < 0:
            raise Unsupported("negative size")
        else:
            known = known * size
    sizes = list(target)
    if missing is not None:
        if is_static(known, 0):
            raise Unsupported("empty")
        sizes[missing] = numel // known
    total: Any = 1
    for size in sizes:
        total = total * size
    if not _provably_equal(size_key(total), size_key(numel)):
        raise Unsupported("element count not provably equal")
    inferred = None if missing is None else size_key(sizes[missing])
    if isinstance(inferred, sympy.Expr) and not inferred.is_Integer and not _is_product(inferred):
        # a symbolic inferred size must be a plain product, not a FloorDiv left over
        raise Unsupported("inferred size is not a product of dimensions")
    return sizes


# Both are pure functions of sympy expressions (the symbols carry their assumptions,
# not the ShapeEnv's ranges), cached across traces: a model reshapes the same sizes
# trace after trace, and sympy's expansion is most of a view's rule.
@functools.lru_cache(maxsize=4096)
def _provably_equal(a: Any, b: Any) -> bool:
    """``a == b`` for every value of the symbols (the expansion of ``a - b`` is 0)."""
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


@functools.lru_cache(maxsize=4096)
def _is_product(expr: sympy.Expr) -> bool:
    """``expr`` is a polynomial of its symbols, without a function (no FloorDiv)."""
    return bool(expr.is_polynomial(*expr.free_symbols)) and not expr.has(sympy.Function)


def _view_or_reshape(factory: TensorFactory, args: tuple, kwargs: dict, copy: bool):
    if kwargs:
        raise Unsupported("unexpected arguments")
    x = fake(args[0])
    target = _sizes_argument(args[1:])
    if not target or any(isinstance(t, torch.dtype) for t in target):
        raise Unsupported("view(dtype) or empty shape")
    sizes = _view_sizes(x, target)
    if exactly_contiguous(x):
        # ATen's computeStride gives a view of exactly contiguous strides the strides
        # of a fresh tensor, size-1 dimensions included
        return factory.view(x, sizes, contiguous_strides(sizes))
    if any(is_one(size) for size in (*sizes, *x.shape)):
        # otherwise it gives size-1 dimensions strides of its own choosing
        raise Unsupported("size-1 dimensions")
    strides = factory.memoized("view_strides", [x], lambda: _view_strides(x, sizes), sizes)
    if strides is _SIZE_ONE:
        raise Unsupported("size-1 dimensions")
    if strides is not None:
        return factory.view(x, sizes, strides)
    if not copy:
        raise Unsupported("view of incompatible strides: torch raises")
    # reshape copies into a fresh contiguous tensor
    grad = x.requires_grad and torch.is_grad_enabled()
    return factory.new(sizes, x.dtype, x.device, grad)


#: what :func:`_view_strides` returns for a view with a size its ranges make 1
_SIZE_ONE = object()


def _view_strides(x: torch.Tensor, sizes: list) -> Any:
    """computeStride's strides for a view of ``x`` with ``sizes`` (None: a copy), or
    :data:`_SIZE_ONE` when a symbolic size of either is 1 by its ranges (a slice of a
    cache's last 3 of 4 columns less 2, in a version where that is 1): computeStride
    gives such a dimension a stride of its own choosing too, which is_one does not
    see. Memoized with the ranges by the caller: the proofs run once per layout."""
    if any(_known_one(size) for size in (*sizes, *x.shape)):
        return _SIZE_ONE
    return view_strides(list(x.shape), list(x.stride()), sizes)


def _known_one(size: Any) -> bool:
    """A symbolic size its ranges prove to be 1."""
    if type(size) is int:
        return False
    try:
        return decide(size == 1)
    except Unsupported:
        return False


def view(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``view``: strides from ATen's ``computeStride``."""
    return _view_or_reshape(factory, args, kwargs, copy=False)


def reshape(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``reshape``: a view when ``computeStride`` finds one, else a contiguous copy."""
    return _view_or_reshape(factory, args, kwargs, copy=True)


def view_strides(
    old_sizes: list,
    old_strides: list,
    new_sizes: list,
    decide: Callable[[Any], bool] = decide,
    one: Callable[[Any], bool] = is_one,
) -> list | None:
    """ATen's ``computeStride``: the strides of a view, ``None`` when a copy is needed.

    Every comparison of sizes goes through ``decide`` (by default :func:`decide`: known
    from the ranges, or the rule does not apply) and every test of a size being 1
    through ``one`` (by default :func:`is_one`: a symbolic size is never taken for 1).
    The tracer passes its own, which decide on the sizes, when the answer matters for
    every size (a write into the result, see ``core.layout_copies``).
    """
    if not old_sizes:
        return [1] * len(new_sizes)
    new_strides: list[Any] = [0] * len(new_sizes)
    view_d = len(new_sizes) - 1
    chunk_base_stride = old_strides[-1]
    tensor_numel: Any = 1
    view_numel: Any = 1
    for tensor_d in range(len(old_sizes) - 1, -1, -1):
        tensor_numel = tensor_numel * old_sizes[tensor_d]
        if tensor_d == 0 or (
            not one(old_sizes[tensor_d - 1])
            and not _equal(old_strides[tensor_d - 1], tensor_numel * chunk_base_stride, decide)
        ):
            while view_d >= 0 and (decide(view_numel < tensor_numel) or one(new_sizes[view_d])):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel = view_numel * new_sizes[view_d]
                view_d -= 1
            if not _equal(view_numel, tensor_numel, decide):
                return None
            if tensor_d > 0:
                chunk_base_stride = old_strides[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return new_strides


def _equal(a: Any, b: Any, decide: Callable[[Any], bool]) -> bool:
    if same_size(a, b):
        return True
    return decide(a == b)


def flatten(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    x = fake(args[0])
    start = kwargs.get("start_dim", args[1] if len(args) > 1 else 0)
    end = kwargs.get("end_dim", args[2] if len(args) > 2 else -1)
    if set(kwargs) - {"start_dim", "end_dim"} or x.dim() == 0:
        raise Unsupported("unexpected arguments")
    start, end = normalize_dim(start, x.dim()), normalize_dim(end, x.dim())
    if start >= end:
        raise Unsupported("nothing to flatten")
    merged: Any = 1
    for size in x.shape[start : end + 1]:
        merged = merged * size
    return reshape(factory, (x, *x.shape[:start], merged, *x.shape[end + 1 :]), {})


def split(factory: TensorFactory, args: tuple, kwargs: dict) -> tuple[torch.Tensor, ...]:
    """``split(int or list, dim)`` along a static dimension."""
    x = fake(args[0])
    if set(kwargs) - {"dim", "split_size", "split_size_or_sections"}:
        raise Unsupported("unexpected arguments")
    split_size = kwargs.get("split_size", kwargs.get("split_size_or_sections"))
    if split_size is None:
        split_size = args[1]
    dim = normalize_dim(kwargs.get("dim", args[2] if len(args) > 2 else 0), x.dim())
    length = size_key(x.shape[dim])
    if type(length) is not int or length == 0:
        raise Unsupported("symbolic or empty dimension")
    if type(split_size) is int and split_size > 0:
        pieces = [min(split_size, length - start) for start in range(0, length, split_size)]
    elif isinstance(split_size, (list, tuple)) and all(type(s) is int for s in split_size):
        pieces = list(split_size)
        if sum(pieces) != length:
            raise Unsupported("sections do not add up")
    else:
        raise Unsupported("split size")
    return _pieces(factory, x, dim, pieces)


def chunk(factory: TensorFactory, args: tuple, kwargs: dict) -> tuple[torch.Tensor, ...]:
    x = fake(args[0])
    if set(kwargs) - {"dim", "chunks"}:
        raise Unsupported("unexpected arguments")
    chunks = kwargs.get("chunks", args[1] if len(args) > 1 else None)
    dim = normalize_dim(kwargs.get("dim", args[2] if len(args) > 2 else 0), x.dim())
    length = size_key(x.shape[dim])
    if type(chunks) is not int or chunks <= 0 or type(length) is not int or length == 0:
        raise Unsupported("symbolic dimension")
    size = -(-length // chunks)
    return _pieces(factory, x, dim, [min(size, length - s) for s in range(0, length, size)])


def _pieces(factory, x, dim, pieces) -> tuple[torch.Tensor, ...]:
    sizes, strides = list(x.shape), list(x.stride())
    offset = x.storage_offset()
    out, start = [], 0
    for piece in pieces:
        sizes[dim] = piece
        out.append(factory.view(x, sizes, strides, offset + start * strides[dim]))
        start += piece
    return tuple(out)


def getitem(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """Basic indexing, replayed as ATen's applySlicing does it, one index at a time."""
    x, index = args
    if not isinstance(x, torch.Tensor):
        raise Unsupported("not a tensor")
    x = fake(x)
    items = index if isinstance(index, tuple) else (index,)
    if any(isinstance(item, torch.Tensor) for item in items):
        return _gather_every_dimension(factory, x, items)
    specified = sum(1 for i in items if i is not None and i is not Ellipsis)
    if specified > x.dim() or sum(1 for i in items if i is Ellipsis) > 1:
        raise Unsupported("too many indices")
    sizes, strides = list(x.shape), list(x.stride())
    offset = x.storage_offset()
    dim = 0
    for item in items:
        if item is None:
            stride = 1 if dim >= len(sizes) else sizes[dim] * strides[dim]
            sizes.insert(dim, 1)
            strides.insert(dim, stride)
            dim += 1
        elif item is Ellipsis:
            dim += x.dim() - specified
        elif type(item) is int:
            length = sizes[dim]
            if type(length) is int:
                if not -length <= item < length:
                    raise Unsupported("index out of range: torch raises")
                position = item % length
            elif item >= 0 and decide(length > item):
                position = item
            elif item < 0 and decide(length >= -item):
                position = length + item
            else:
                raise Unsupported("index maybe out of range")
            offset = offset + position * strides[dim]
            del sizes[dim], strides[dim]
        elif isinstance(item, torch.SymInt):
            # x[:, n - 1]: torch selects (see patches.symbolic_kernels) when the index
            # is known inside the dimension, with the same sign for every size
            offset = offset + _symbolic_position(item, sizes[dim]) * strides[dim]
            del sizes[dim], strides[dim]
        elif type(item) is slice:
            start, stop, step = _static_slice(item, sizes[dim])
            if start is not None:
                offset = offset + start * strides[dim]
                sizes[dim] = max(0, -(-(stop - start) // step))
                if sizes[dim] == 0:
                    raise Unsupported("empty slice")
                strides[dim] = strides[dim] * step
            dim += 1
        else:
            raise Unsupported("advanced indexing")
    return factory.view(x, sizes, strides, offset)


def _symbolic_position(index: torch.SymInt, length: Any) -> Any:
    """The position ``select`` reads for a symbolic index (falls back when its sign or
    its range is not known from the dimensions' ranges)."""
    if decide(index >= 0):
        if decide(index < length):
            return index
    elif decide(index >= -length):
        return length + index
    raise Unsupported("index maybe out of range")


def _gather_every_dimension(factory: TensorFactory, x: torch.Tensor, items: tuple):
    """``x[i0, i1, ...]`` with one integer index tensor per dimension (the masks of
    transformers: ``padding_mask[batch_idx, kv_idx]``): a fresh tensor of the indices'
    broadcast shape. Every dimension being indexed, torch's layout search sees only
    zero strides and keeps the contiguous layout."""
    if len(items) != x.dim() or not all(
        isinstance(i, torch.Tensor) and i.dtype in (torch.int64, torch.int32) for i in items
    ):
        raise Unsupported("advanced indexing other than one index tensor per dimension")
    common_device([x, *items])
    shape = broadcast_shapes(*(i.shape for i in items))
    return factory.new(shape, x.dtype, x.device)


def _static_slice(item: slice, size: Any) -> tuple[Any, Any, Any]:
    """``(start, stop, step)`` of a slice on a static size, ``(None,)*3`` for a full one."""
    start, stop, step = item.start, item.stop, item.step
    if step is not None and (type(step) is not int or step <= 0):
        raise Unsupported("step")
    full_start = start is None or (type(start) is int and start == 0)
    full_stop = stop is None or (not isinstance(stop, int) and same_size(stop, size))
    if full_start and (step is None or step == 1) and full_stop:
        return None, None, None
    length = size_key(size)
    if type(length) is not int or any(v is not None and type(v) is not int for v in (start, stop)):
        raise Unsupported("slice of a symbolic dimension")
    start, stop, step = item.indices(length)
    return start, stop, step


def contiguous(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """An exactly contiguous tensor is its own contiguous version (the same object)."""
    if kwargs or len(args) != 1:
        raise Unsupported("memory format")
    x = fake(args[0])
    if exactly_contiguous(x):
        return x
    if is_contiguous_for_memory_format_or_false(
        x, memory_format=torch.contiguous_format
    ) or _contiguous_at_example(x):
        # torch returns x itself when its size-1 dimensions (at the example's sizes
        # too) are all that keeps it from being exactly contiguous: torch decides
        raise Unsupported("contiguous up to size-1 dimensions")
    return factory.new(x.shape, x.dtype, x.device, x.requires_grad and torch.is_grad_enabled())


def _contiguous_at_example(x: torch.Tensor) -> bool:
    """``x.is_contiguous()`` at the example's sizes (size-1 dimensions skipped),
    computed from the hints, without a guard."""
    expected = 1
    for dim_size, dim_stride in reversed(list(zip(x.shape, x.stride()))):
        size, stride = _hint(dim_size), _hint(dim_stride)
        if size is None or stride is None:
            return False
        if size == 0:
            return True
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _hint(value: Any) -> int | None:
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return None if hint is None else int(hint)
    return int(value)


def size(factory: TensorFactory, args: tuple, kwargs: dict) -> Any:
    """``x.size(dim)``: the tensor's own size (what torch returns, its ``SymInt``)."""
    if kwargs or len(args) != 2:
        raise Unsupported("size() of every dimension, or keyword arguments")
    x = fake(args[0])
    return x.shape[normalize_dim(args[1], x.dim())]


def to_dtype(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``x.to(dtype)`` (and ``float()``...): ``x`` itself or a contiguous copy."""
    x = fake(args[0])
    if set(kwargs) - {"dtype", "device"} or len(args) > 3:
        raise Unsupported("unexpected arguments")
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    for arg in args[1:]:
        if isinstance(arg, torch.dtype) and dtype is None:
            dtype = arg
        elif isinstance(arg, (torch.device, str)) and device is None:
            device = arg
        else:
            raise Unsupported("to(tensor) or unexpected arguments")
    if device is not None and torch.device(device) != x.device:
        raise Unsupported("device transfer")
    return _converted(factory, x, x.dtype if dtype is None else dtype)


def _converted(factory: TensorFactory, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == x.dtype:
        return x
    require_contiguous(x)
    grad = x.requires_grad and torch.is_grad_enabled() and dtype.is_floating_point
    return factory.new(x.shape, dtype, x.device, grad)


def _cast_to(dtype: torch.dtype):
    def rule(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
        if kwargs or len(args) != 1:
            raise Unsupported("memory format")
        return _converted(factory, fake(args[0]), dtype)

    return rule


FUNCTION_RULES: dict[Any, Any] = {
    operator.getitem: getitem,
    torch.transpose: transpose,
    torch.permute: permute,
    torch.unsqueeze: unsqueeze,
    torch.squeeze: squeeze,
    torch.reshape: reshape,
    torch.flatten: flatten,
    torch.split: split,
    torch.chunk: chunk,
}

METHOD_RULES: dict[str, Any] = {
    "transpose": transpose,
    "permute": permute,
    "unsqueeze": unsqueeze,
    "squeeze": squeeze,
    "expand": expand,
    "view": view,
    "reshape": reshape,
    "flatten": flatten,
    "split": split,
    "chunk": chunk,
    "contiguous": contiguous,
    "size": size,
    "to": to_dtype,
    "float": _cast_to(torch.float32),
    "half": _cast_to(torch.float16),
    "bfloat16": _cast_to(torch.bfloat16),
    "double": _cast_to(torch.float64),
    "long": _cast_to(torch.int64),
    "int": _cast_to(torch.int32),
    "bool": _cast_to(torch.bool),
}
