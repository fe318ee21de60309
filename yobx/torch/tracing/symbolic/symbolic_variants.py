"""Symbolic variants of torch functions that fix a dynamic size or fail on one.

Some of torch's kernels read a size as a Python int (``x[:, n - 1]`` guards
``n - 1 == 5``, ``take_along_dim`` guards ``batch == 4``), ask a question about a
symbolic size that has no answer for every size (``reshape``: is ``(d + 1)//2`` equal
to 1?), reject symbolic sizes outright (``F.pad``, ``F.interpolate``), or reject a
dtype their CPU kernel accepts (``_grouped_mm`` on float32). Each variant here computes
the same values with operations that keep the sizes symbolic, and only fake tensors
with symbolic sizes take the detour: real tensors and static shapes run torch's code.

They are installed by :func:`yobx.torch.tracing.symbolic.symbolic_kernels.symbolic_kernels`, while
tracing and while the ONNX lowering re-runs a traced graph through ``make_fx``, which
then records the operations of the variant (``select``, ``gather``, ``clone`` and
``view``...): all have the values of the original for every size.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor

from ..shape_rules._base import (
    Unsupported,
    exactly_contiguous,
    is_one,
    is_static,
    same_size,
)
from ..shape_rules.views import view_strides


def _symbolic_fake(value: Any) -> bool:
    return type(value) is FakeTensor and value._has_symbolic_sizes_strides


# indexing with a symbolic integer: x[:, n - 1]


def _defer_symbolic_indices(tensor: torch.Tensor, key: Any) -> tuple[tuple, list] | None:
    """Splits a basic index into one without symbolic integers and the selects to apply.

    ``x[:, n - 1, 2:]`` becomes ``x[:, :, 2:]`` followed by ``select(1, n - 1)``: the
    same view (torch's indexing applies an integer index with ``select``), while
    torch's C++ indexing turns a SymInt index into a Python int. None when the key
    has no symbolic integer or holds anything beyond ints, slices, None and Ellipsis.
    """
    items = key if type(key) is tuple else (key,)
    if not any(isinstance(item, torch.SymInt) for item in items):
        return None
    specified = 0
    for item in items:
        if isinstance(item, torch.SymInt) or type(item) in (int, slice):
            specified += 1
        elif item is not None and item is not Ellipsis:
            return None
    if specified > tensor.dim():
        return None
    out_dim = 0
    plain, selects = [], []
    for item in items:
        if item is None or type(item) is slice:
            out_dim += 1
        elif item is Ellipsis:
            out_dim += tensor.dim() - specified
        elif isinstance(item, torch.SymInt):
            selects.append((out_dim, item))
            item = slice(None)
            out_dim += 1
        plain.append(item)
    return tuple(plain), selects


def _symbolic_getitem(original: Callable) -> Callable:
    @functools.wraps(original)
    def __getitem__(self, key):
        split = _defer_symbolic_indices(self, key) if type(self) is FakeTensor else None
        if split is None:
            return original(self, key)
        plain, selects = split
        result = original(self, plain)
        # from the last dimension back, so that earlier positions stay valid
        for dim, index in reversed(selects):
            result = result.select(dim, index)
        return result

    return __getitem__


def _fills_under_a_scalar_mask(key: Any, value: Any) -> bool:
    """Whether ``x[key] = value`` writes a number or a 0-d tensor into all of ``x`` or
    nothing, as the 0-d boolean ``key`` says."""
    return (
        isinstance(key, torch.Tensor)
        and key.dtype == torch.bool
        and key.dim() == 0
        and (
            isinstance(value, (int, float, bool))
            or (isinstance(value, torch.Tensor) and value.dim() == 0)
        )
    )


def _symbolic_setitem(original: Callable, getitem: Callable) -> Callable:
    @functools.wraps(original)
    def __setitem__(self, key, value):
        if type(self) is FakeTensor and _fills_under_a_scalar_mask(key, value):
            # x[m] = v with a 0-d mask m (x[x.sum() > 0] = 0): torch's kernel indexes
            # x[None] with m[None], whose count of true values (0 or 1) depends on the
            # values; masked_fill_ fills the same (all of x or nothing)
            self.masked_fill_(key, value)
            return None
        split = _defer_symbolic_indices(self, key) if type(self) is FakeTensor else None
        if split is None:
            return original(self, key, value)
        target = getitem(self, key)
        if not isinstance(value, torch.Tensor):
            target.fill_(value)
            return None
        # as torch's copy_to (TensorIndexing.h): a CPU scalar tensor fills, leading
        # size-1 dimensions of the value are dropped, the rest broadcasts
        same = value.dim() == target.dim() and all(
            same_size(a, b) for a, b in zip(value.shape, target.shape)
        )
        if not same and value.dim() == 0 and value.device.type == "cpu":
            target.fill_(value)
            return None
        leading = 0
        while leading < value.dim() and is_one(value.shape[leading]):
            leading += 1
        if leading and not same:
            value = value.view(value.shape[leading:])
        target.copy_(value)
        return None

    return __setitem__


# take_along_dim: torch's kernel reads the sizes as ints


def _symbolic_take_along_dim(original: Callable) -> Callable:
    """``gather`` on both tensors broadcast but along ``dim``, as ATen's
    ``_take_along_dim_helper`` does, with symbolic sizes."""

    @functools.wraps(original)
    def take_along_dim(input, indices, dim=None, *, out=None):
        if (
            out is not None
            or dim is None
            or not isinstance(indices, torch.Tensor)
            or not (_symbolic_fake(input) or _symbolic_fake(indices))
        ):
            kwargs = {} if out is None else {"out": out}
            return original(input, indices, dim, **kwargs)
        if input.dim() != indices.dim():
            raise RuntimeError(
                f"torch.take_along_dim(): input and indices should have the same number of "
                f"dimensions, but got {input.dim()} dimensions for input, and "
                f"{indices.dim()} dimensions for indices"
            )
        if indices.dtype != torch.long:
            raise RuntimeError(
                f"torch.take_along_dim(): dtype of indices should be Long but got {indices.dtype}"
            )
        dim = dim % max(input.dim(), 1)
        sizes = list(input.shape)
        sizes[dim] = indices.shape[dim]
        broadcast_indices = indices.broadcast_to(torch.broadcast_shapes(sizes, indices.shape))
        sizes = list(indices.shape)
        sizes[dim] = input.shape[dim]
        broadcast_input = input.broadcast_to(torch.broadcast_shapes(sizes, input.shape))
        return broadcast_input.gather(dim, broadcast_indices)

    return take_along_dim


# reshape and flatten: a copy when being a view depends on the sizes


def _reshape_copy(tensor: torch.Tensor, shape: tuple) -> torch.Tensor | None:
    """A contiguous copy reshaped, when whether ``reshape`` can return a view is not
    known for every size (None otherwise: torch decides as usual).

    ``x[:, ::2].flatten(0, 1)`` is a view only when ``(d + 1)//2 == 1`` or ``d`` is
    even; torch's C++ ``computeStride`` guards on the first. The values are the same
    either way, torch documents that code must not depend on reshape copying or not,
    and torch's own symbolic kernels copy when a stride equality is not provable.
    """
    try:
        if exactly_contiguous(tensor):
            return None
    except Unsupported:
        # an empty tensor: no element to copy or alias, view or not (a version captured
        # at size 0 reshaped `(seq, 0)` to `(seq, -1)`, and its capture failed)
        return None
    sizes = list(shape)
    inferred = [i for i, size in enumerate(sizes) if type(size) is int and size == -1]
    if len(inferred) > 1 or any(type(size) is int and size < -1 for size in sizes):
        return None
    if inferred:
        known: Any = 1
        for i, size in enumerate(sizes):
            if i != inferred[0]:
                known = known * size
        if is_static(known, 0):
            return None
        sizes[inferred[0]] = tensor.numel() // known
    try:
        view_strides(list(tensor.shape), list(tensor.stride()), sizes)
    except Unsupported:
        # a comparison of sizes with no answer for every size: torch's view of the copy
        # checks the element count and infers -1 itself
        return tensor.clone(memory_format=torch.contiguous_format).view(shape)
    return None


def _symbolic_reshape(original: Callable) -> Callable:
    @functools.wraps(original)
    def reshape(*args, **kwargs):
        # x.reshape(2, -1), x.reshape((2, -1)), x.reshape(shape=...),
        # torch.reshape(input=x, shape=...): eager takes each form
        self = args[0] if args else kwargs.get("input")
        shape = kwargs.get("shape", args[1:])
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        if _symbolic_fake(self) and shape:
            copy = _reshape_copy(self, tuple(shape))
            if copy is not None:
                return copy
        return original(*args, **kwargs)

    return reshape


def _symbolic_flatten(original: Callable) -> Callable:
    @functools.wraps(original)
    def flatten(self, start_dim=0, end_dim=-1):
        if _symbolic_fake(self) and self.dim() > 1 and type(start_dim) is int:
            rank = self.dim()
            start, end = start_dim % rank, end_dim % rank
            if start < end:
                merged: Any = 1
                for size in self.shape[start : end + 1]:
                    merged = merged * size
                copy = _reshape_copy(self, (*self.shape[:start], merged, *self.shape[end + 1 :]))
                if copy is not None:
                    return copy
        return original(self, start_dim, end_dim)

    return flatten


# padding and resampling: Python decompositions keep the sizes symbolic


def _python_dispatched(original: Callable) -> Callable:
    """Runs ``original`` with torch's Python dispatcher on symbolic fake tensors.

    ``F.pad`` and ``F.interpolate`` end in C++ composite kernels that compute the
    output size from integer sizes (``SymIntArrayRef expected to contain only concrete
    integers``, or a guard on the input size); torch's Python decompositions of the
    same operators (what torch.export runs) compute it symbolically.
    """
    from torch._dispatch.python import enable_python_dispatcher

    @functools.wraps(original)
    def wrapper(input, *args, **kwargs):
        # a static input resized to a symbolic size (a position table interpolated
        # to the image's patch grid) needs it as well
        if _symbolic_fake(input) or (
            type(input) is FakeTensor
            and any(isinstance(a, torch.SymInt) for a in pytree.tree_leaves((args, kwargs)))
        ):
            with enable_python_dispatcher():
                return original(input, *args, **kwargs)
        return original(input, *args, **kwargs)

    return wrapper


_PYTHON_DISPATCHED_NN = (
    "pad",
    "upsample_nearest1d",
    "upsample_nearest2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bilinear2d_aa",
    "_upsample_bicubic2d_aa",
)


#: where the operators of :func:`_python_dispatched` live, by owner: besides padding and
#: resampling, ``torch.polar`` (rotary embeddings in complex form: its kernel resizes
#: its output to the example's size) and ``linalg.solve_triangular`` (gated linear
#: attention: its meta function broadcasts with a C++ ``expand`` of integer sizes)
_PYTHON_DISPATCHED = (
    (torch._C._nn, _PYTHON_DISPATCHED_NN),
    (torch, ("polar",)),
    # torch._C._linalg exists at run time, torch's stubs leave it out
    (torch._C._linalg, ("linalg_solve_triangular",)),  # type: ignore[attr-defined]
    (torch.linalg, ("solve_triangular",)),
)


def _stable_replacements() -> list[tuple[Any, str, Any]]:
    """The variants of functions nothing else patches (built once)."""
    result: list[tuple[Any, str, Any]] = [
        (torch, "take_along_dim", _symbolic_take_along_dim(torch.take_along_dim)),
        (torch.Tensor, "take_along_dim", _symbolic_take_along_dim(torch.Tensor.take_along_dim)),
        (torch, "reshape", _symbolic_reshape(torch.reshape)),
        (torch.Tensor, "reshape", _symbolic_reshape(torch.Tensor.reshape)),
        (torch, "flatten", _symbolic_flatten(torch.flatten)),
        (torch.Tensor, "flatten", _symbolic_flatten(torch.Tensor.flatten)),
    ]
    for owner, names in _PYTHON_DISPATCHED:
        for name in names:
            function = getattr(owner, name, None)
            if function is not None:
                result.append((owner, name, _python_dispatched(function)))
    return result


_STABLE_REPLACEMENTS = _stable_replacements()


def replacements() -> list[tuple[Any, str, Any]]:
    """``(owner, name, variant)`` for
    :func:`~yobx.torch.tracing.isolation.patching.patched_attributes`.

    Indexing wraps the ``Tensor.__getitem__``/``__setitem__`` in place now: the tracer
    patches them too while tracing.
    """
    getitem = _symbolic_getitem(torch.Tensor.__getitem__)
    return [
        (torch.Tensor, "__getitem__", getitem),
        (torch.Tensor, "__setitem__", _symbolic_setitem(torch.Tensor.__setitem__, getitem)),
        *_STABLE_REPLACEMENTS,
    ]


# torch.tensor(x.shape[-1]): a tensor holding sizes


def _symbolic_scalars(data: Any) -> tuple[list, list[int]] | None:
    """The flat items and the shape of nested lists holding a SymInt or a SymFloat."""
    if isinstance(data, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return [data], []
    if not isinstance(data, (list, tuple)) or not data:
        return None
    items, shapes, symbolic = [], set(), False
    for item in data:
        if isinstance(item, (list, tuple)):
            found = _symbolic_scalars(item) or _plain_scalars(item)
            if found is None:
                return None
            items.extend(found[0])
            shapes.add(tuple(found[1]))
        elif isinstance(item, (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)):
            items.append(item)
            shapes.add(())
        else:
            return None
        symbolic = symbolic or any(isinstance(i, (torch.SymInt, torch.SymFloat)) for i in items)
    if len(shapes) != 1 or not symbolic:
        return None
    return items, [len(data), *shapes.pop()]


def _plain_scalars(data: Any) -> tuple[list, list[int]] | None:
    values = torch.tensor(data)
    return values.flatten().tolist(), list(values.shape)


def _symbolic_tensor(original: Callable) -> Callable:
    """``torch.tensor`` of sizes: ``scalar_tensor`` per size, stacked.

    torch's constructor reads each SymInt as a Python int, which fixes the size to the
    example's; ``scalar_tensor`` takes it as it is (make_fx records it with the size).
    """

    @functools.wraps(original)
    def tensor(data, *args, **kwargs):
        # the arguments are passed on as given: torch.as_tensor takes no requires_grad
        dtype, device = kwargs.get("dtype"), kwargs.get("device")
        plain = args or set(kwargs) - {"dtype", "device", "requires_grad"}
        plain = plain or kwargs.get("requires_grad")
        found = None if plain else _symbolic_scalars(data)
        if found is None:
            return original(data, *args, **kwargs)
        items, shape = found
        if dtype is None:
            if all(isinstance(i, (bool, torch.SymBool)) for i in items):
                dtype = torch.bool
            elif all(isinstance(i, (bool, int, torch.SymInt)) for i in items):
                dtype = torch.int64
            else:
                dtype = torch.get_default_dtype()
        parts = [torch.scalar_tensor(i, dtype=dtype, device=device) for i in items]
        return parts[0] if not shape else torch.stack(parts).reshape(shape)

    return tensor


def _symbolic_linspace(original: Callable) -> Callable:
    """``torch.linspace`` with a symbolic start, end or number of steps: torch's Python
    reference (an ``arange`` scaled from both ends, as the kernel computes it).

    The kernel takes its ``start`` and ``end`` as plain numbers, which fixes a size they
    depend on to the example's (``torch.linspace(0, h, h + 1)``, the position grids of
    video transformers); the reference keeps them symbolic. It agrees with the kernel
    to the last bit or one ulp.
    """

    @functools.wraps(original)
    def linspace(*args, **kwargs):
        values = (*args[:3], *(kwargs.get(k) for k in ("start", "end", "steps")))
        if not any(isinstance(v, (torch.SymInt, torch.SymFloat)) for v in values):
            return original(*args, **kwargs)
        return torch._refs.linspace(*args, **kwargs)

    return linspace


#: call_function targets (the builtins recorded in graphs) -> their variant; attribute
#: patches do not reach a graph node holding the builtin itself
FUNCTION_VARIANTS: dict[Any, Callable] = {
    getattr(torch, name): variant for owner, name, variant in _STABLE_REPLACEMENTS if owner is torch
}
FUNCTION_VARIANTS[torch.tensor] = _symbolic_tensor(torch.tensor)
FUNCTION_VARIANTS[torch.as_tensor] = _symbolic_tensor(torch.as_tensor)
FUNCTION_VARIANTS[torch.linspace] = _symbolic_linspace(torch.linspace)


#: Python math functions -> their symbolic twins, which keep a SymInt/SymFloat symbolic
#: (``math.sqrt(n)`` would make a float of the example's ``n``)
SYMBOLIC_MATH: dict[Callable, Callable] = {
    getattr(math, name): getattr(torch, f"_sym_{name}")
    for name in (
        "sqrt",
        "cos",
        "sin",
        "tan",
        "cosh",
        "sinh",
        "tanh",
        "exp",
        "log",
        "asin",
        "acos",
        "atan",
        "log2",
    )
    if hasattr(torch, f"_sym_{name}")
}


def function_variant(target: Any, args: tuple = ()) -> Any:
    """The symbolic variant of a graph node's target (the target itself if none);
    ``args`` selects the symbolic twin of a math function applied to a dimension."""
    try:
        variant = FUNCTION_VARIANTS.get(target, target)
        if variant in SYMBOLIC_MATH and any(
            isinstance(a, (torch.SymInt, torch.SymFloat)) for a in args
        ):
            return SYMBOLIC_MATH[variant]
        return variant
    except TypeError:  # an unhashable callable
        return target


# _grouped_mm: torch's meta function only accepts bfloat16, its CPU kernel more


def _grouped_mm_fake(fake_mode, func, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The fake value of ``aten._grouped_mm`` for the dtypes only the CPU kernel takes.

    The checks of torch's meta function (``_meta_grouped_mm_common``) but the dtype
    one, and the output of torch's own ``_create_grouped_mm_output_tensor``, so that
    float32 gets what bfloat16 gets. bfloat16 itself goes to torch's meta function.
    """
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    if mat_a.dtype not in (torch.float32, torch.float16) or mat_b.dtype != mat_a.dtype:
        return NotImplemented
    torch._check(
        mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
        lambda: (
            f"Multiplicands must be 2D or 3D but got mat_a.dim()={mat_a.dim()} and "
            f"mat_b.dim()={mat_b.dim()}"
        ),
    )
    if mat_a.dim() == 3 or mat_b.dim() == 3:
        torch._check(
            mat_a.size(-1) == mat_b.size(-2),
            lambda: "contraction dimension of mat_a and mat_b must match",
        )
    if mat_a.dim() == 2 or mat_b.dim() == 2:
        torch._check(offs is not None, lambda: "Offsets tensor not provided")
        torch._check(
            offs.dim() == 1 and offs.dtype == torch.int32,
            lambda: f"Offsets tensor must be a 1D int32 tensor, got {offs.dim()}D {offs.dtype}",
        )
    else:
        torch._check(offs is None, lambda: "Offsets tensor provided for 3D/3D multiplicands")
    torch._check(bias is None, lambda: "Bias tensor provided, but it is not supported yet.")
    torch._check(
        out_dtype is None or out_dtype == mat_a.dtype,
        lambda: f"output dtype {out_dtype} differs from the inputs' {mat_a.dtype}",
    )
    with fake_mode:
        return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)


@contextlib.contextmanager
def grouped_mm_fake_values() -> Iterator[None]:
    """Fake tensors compute ``aten._grouped_mm`` in float32 and float16 inside the block.

    The rule is put first in FakeTensor's list of operator implementations (consulted
    before the meta functions) and removed on exit. make_fx still records the
    operator itself, so the lowered graph calls ``_grouped_mm`` as the model does.
    """
    from torch._subclasses.fake_impls import op_implementations_checks

    from ..isolation.patch_window import in_patch_window, register_undo

    grouped_mm = torch.ops.aten._grouped_mm.default
    # the list is shared by every thread: the rule answers for the window's thread only
    entry = (lambda func: func is grouped_mm and in_patch_window(), _grouped_mm_fake)

    def undo() -> None:
        if entry in op_implementations_checks:
            op_implementations_checks.remove(entry)

    restore = register_undo(undo)
    op_implementations_checks.insert(0, entry)
    try:
        yield
    finally:
        restore()
