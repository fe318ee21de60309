"""Building blocks of the shape rules: symbolic sizes compared exactly, and fake
tensors created directly (no FakeTensor dispatch).

A rule never decides anything about a dynamic dimension: it compares sizes
*structurally* (the same symbolic expression, or the same integer). Whenever that is
not enough (two different symbols that may or may not be equal, a non-contiguous
input whose output layout depends on strides, an unusual dtype...), it raises
:class:`Unsupported` and the tracer runs the operation through torch's fake tensors,
which decide (and guard) as usual.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager
from torch.fx.experimental.sym_node import SymNode
from torch.fx.immutable_collections import immutable_list
from torch.utils._sympy.functions import Max

_MISSING = object()


class Unsupported(Exception):
    """The rule does not apply exactly here: use torch's fake tensor dispatch instead."""


#: the sequences of operator arguments: a node's lists are torch.fx's immutable_list
ARGUMENT_SEQUENCES = frozenset({tuple, list, immutable_list})

#: dtypes the elementwise rules handle (others fall back)
FLOATING = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
INTEGRAL = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64})


def size_key(value: Any) -> Any:
    """An ``int`` for a static size, the sympy expression of a symbolic one.

    Two sizes with the same key are the same size for every input. Different keys
    prove nothing (``s0`` and ``s1`` may be equal): rules then fall back.
    """
    if type(value) is int:
        return value
    if isinstance(value, torch.SymInt):
        # SymNode.maybe_as_int, reading the normalized expression once (each read
        # tests it for a number, a walk of the expression)
        expr = value.node.expr
        return int(expr) if expr.is_number else expr
    raise Unsupported(f"not a size: {value!r}")


def _raw_key(value: Any) -> Any:
    """A cheaper :func:`size_key` for memo keys: the expression a SymInt was built with,
    before the ShapeEnv's replacements. Keys that also hold the ShapeEnv's version
    (replacements included) stay exact; two spellings of one size only miss."""
    if type(value) is int:
        return value
    if isinstance(value, torch.SymInt):
        return value.node._expr
    return size_key(value)


def same_key(a: Any, b: Any) -> bool:
    """Whether two :func:`size_key` are the same size.

    An int is never compared with an expression: sympy would convert the int first
    (``sympify``), the most expensive part of a rule's comparisons.
    """
    return a is b or ((type(a) is int) is (type(b) is int) and a == b)


def same_size(a: Any, b: Any) -> bool:
    """``True`` when both sizes are the same expression (or the same integer)."""
    return same_key(size_key(a), size_key(b))


def is_static(size: Any, value: int) -> bool:
    """A static size equal to ``value`` (a symbolic size is never taken for it)."""
    key = size_key(size)
    return type(key) is int and key == value


def is_one(size: Any) -> bool:
    """A static size 1 (a symbolic size is never taken for 1)."""
    return is_static(size, 1)


def fake(value: Any) -> FakeTensor:
    """The argument as a fake tensor, or :class:`Unsupported`."""
    if not isinstance(value, FakeTensor):
        raise Unsupported("not a fake tensor")
    return value


def exactly_contiguous(tensor: torch.Tensor) -> bool:
    """Strides equal, expression for expression, to the ones of a fresh ``empty``.

    Stricter than ``is_contiguous`` (which ignores the strides of size-1 dimensions):
    outputs of the rules are fresh contiguous tensors, which is only what torch
    produces when the inputs are laid out exactly that way.
    """
    return _exactly_contiguous(
        tuple(size_key(s) for s in tensor.shape), tuple(size_key(s) for s in tensor.stride())
    )


@functools.lru_cache(maxsize=4096)
def _exactly_contiguous(sizes: tuple[Any, ...], strides: tuple[Any, ...]) -> bool:
    # structural (expressions only, no ranges): cached across traces, since the products
    # of sympy expressions are what the check costs.
    # torch writes contiguous strides as products of max(size, 1)
    # (make_contiguous_strides_for), which sympy simplifies to the size for a symbol but
    # not for an expression such as s // 8 (a convolution's output, whose ranges may not
    # exclude 0 since the tracer does not record what a convolution asks): both
    # spellings are accepted. They differ only when a size is 0, where the tensor is
    # empty: no element to compute, nothing aliased, contiguous for torch whatever the
    # strides.
    expected: Any = 1
    expected_max: Any = 1
    for i in range(len(sizes) - 1, -1, -1):
        size = sizes[i]
        if size == 0:
            raise Unsupported("empty tensor")
        if strides[i] != expected and strides[i] != expected_max:
            return False
        # sympy keeps products of symbols in a canonical order: no expand needed
        expected = expected * size
        expected_max = expected_max * (size if type(size) is int else Max(1, size))
    return True


def require_contiguous(*tensors: torch.Tensor) -> None:
    """Falls back unless every tensor is :func:`exactly_contiguous`."""
    for tensor in tensors:
        if not exactly_contiguous(tensor):
            raise Unsupported("non-contiguous input")


def common_device(tensors: Sequence[torch.Tensor]) -> torch.device:
    """The device shared by all tensors (falls back when they differ)."""
    device = tensors[0].device
    for tensor in tensors[1:]:
        if tensor.device != device:
            raise Unsupported("several devices")
    return device


def needs_grad(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether an autograd-recorded result would require a gradient."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def decide(condition: Any) -> bool:
    """A comparison of sizes that is known from the dimension ranges alone.

    Falls back (:class:`Unsupported`) when it is not: torch would then guard on the
    example, and the tracer's own checks must see that guard.
    """
    if type(condition) is bool:
        return condition
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if statically_known_true(condition):
        return True
    if statically_known_true(torch.sym_not(condition)):
        return False
    raise Unsupported("comparison of dimensions not known from their ranges")


class TensorFactory:
    """Creates the output fake tensors of the rules for one trace's fake mode.

    :param static_fake: the trace's fake copy of a module's own tensor
        (:meth:`~yobx.torch.tracing.symbolic.symbolic.SymbolicDimensions.from_real`), which
        :meth:`parameter` gives the module rules for a parameter on the meta device
    """

    def __init__(self, fake_mode, static_fake: Any = None) -> None:
        self.fake_mode = fake_mode
        self._static_fake = static_fake
        #: results of layout computations, keyed by the geometry of their inputs and
        #: the version of the ShapeEnv's knowledge (see :meth:`memoized`)
        self._memo: dict[Any, Any] = {}
        #: the symbols and ranges seen last, and their generation (see knowledge)
        self._ranges: tuple[tuple, tuple] = ((), ())
        self._generation = 0

    def parameter(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        """A module's parameter as the trace computes with it.

        A parameter on the meta device (a model built without its weights) computes
        as its fake copy, a CPU tensor, as in torch's own run of the module (the
        tracer swaps the copies in); any other is used as it is.
        """
        if tensor is None or self._static_fake is None or tensor.device.type != "meta":
            return tensor
        return self._static_fake(tensor)

    def memoized(
        self, kind: str, tensors: Sequence[torch.Tensor], compute, sizes: Sequence[Any] = ()
    ) -> Any:
        """``compute()``, a function of the sizes and strides of ``tensors`` and of the
        sizes ``sizes`` only, cached (an :class:`Unsupported` it raises is not).

        The key holds every size and stride (expressions) and what the ShapeEnv knows
        of them: its version counter (replacements, divisibility, runtime asserts, as
        torch keys its own static evaluations) and the ranges of its symbols, which
        change without the counter. A repeated layer then computes its layouts once.
        """
        key = (
            kind,
            self.knowledge(),
            tuple(
                (tuple(map(_raw_key, t.shape)), tuple(map(_raw_key, t.stride()))) for t in tensors
            ),
            tuple(map(_raw_key, sizes)),
        )
        result = self._memo.get(key, _MISSING)
        if result is _MISSING:
            result = self._memo[key] = compute()
        return result

    def knowledge(self) -> Any:
        """The version of what the ShapeEnv knows of the sizes, for memo keys.

        Its version counter (replacements, divisibility, runtime asserts, as torch
        keys its own static evaluations), the counter of its replacements (the keys
        are expressions before them, see :func:`_raw_key`), and a generation of the
        ranges of its symbols, which change without the counters: it moves on when
        a symbol or a range object is not the one seen last (ranges are immutable,
        an update replaces the object), a sweep of identities where hashing the
        ranges took a tenth of a rule.
        """
        shape_env = self.fake_mode.shape_env
        if shape_env is None:
            return None
        ranges = shape_env.var_to_range
        symbols, values = self._ranges
        if (
            len(symbols) != len(ranges)
            or not all(map(operator.is_, symbols, ranges))
            or not all(map(operator.is_, values, ranges.values()))
        ):
            self._ranges = (tuple(ranges), tuple(ranges.values()))
            self._generation += 1
        return (
            shape_env._version_counter,
            shape_env._replacements_version_counter,
            self._generation,
        )

    def new(
        self,
        sizes: Sequence[Any],
        dtype: torch.dtype,
        device: torch.device,
        requires_grad: bool = False,
        strides: Sequence[Any] | None = None,
    ) -> FakeTensor:
        """A fresh tensor: contiguous as ``torch.empty(sizes)`` makes it, or with
        explicit ``strides``."""
        for size in sizes:
            if is_static(size, 0):
                raise Unsupported("empty output")
        if _DISPATCH_MODES() or _FUNCTION_MODES():
            # a caller's mode (a trace under a TorchFunctionMode, a rule run under a
            # fake mode) would see the making of the tensor, or take it over
            with _NO_TORCH_FUNCTION():
                with in_kernel_invocation_manager(self.fake_mode):
                    meta = self._meta(sizes, strides, dtype)
                return self._fake(meta, device, requires_grad)
        return self._fake(self._meta(sizes, strides, dtype), device, requires_grad)

    def _fake(self, meta: torch.Tensor, device: torch.device, requires_grad: bool) -> FakeTensor:
        # out of in_kernel_invocation_manager, as torch's fake mode makes its outputs
        out = FakeTensor(self.fake_mode, meta, device)
        if requires_grad:
            out.requires_grad_(True)
        return out

    def _meta(
        self, sizes: Sequence[Any], strides: Sequence[Any] | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """``torch.empty_strided(sizes, strides)`` on the meta device."""
        if all(type(size) is int for size in sizes):
            if strides is None:
                return _EMPTY(tuple(sizes), dtype=dtype, device=_META)
            return _EMPTY_STRIDED(tuple(sizes), tuple(strides), dtype=dtype, device=_META)
        return self._symbolic_meta(sizes, strides, dtype)

    def _symbolic_meta(
        self, sizes: Sequence[Any], strides: Sequence[Any] | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """``torch.empty_strided(sizes, strides)`` on the meta device, symbolic sizes.

        torch's factories compute the strides, the element count and the storage
        size with ``SymInt`` arithmetic, each operation a call back into Python: a
        quarter of a trace. Here they are computed once per geometry (a repeated
        layer creates the same ones over and over, and the next trace of the model
        too: see :data:`_CONTIGUOUS_STORAGES`), and the tensor is a restriding of
        a storage resized to torch's size (``computeStorageNbytes``): the tensor owns
        its storage, as a factory's output does. Each tensor gets its own ``SymNode``
        objects, as from a factory (see :mod:`..symbolic_memo` for why).
        """
        itemsize = dtype.itemsize
        shape_env = self.fake_mode.shape_env
        sizes_key = tuple(map(pure_key, sizes))
        if strides is None:
            key: tuple = (itemsize, sizes_key)
            recipe = _CONTIGUOUS_STORAGES.get(key)
            if recipe is None:
                layout, nbytes = _contiguous_storage(sizes, itemsize)
                recipe = remember_recipes(_CONTIGUOUS_STORAGES, key, (*layout, nbytes))
            *strides, nbytes = (rebuild_symint(r, shape_env) for r in recipe)
        else:
            key = (itemsize, sizes_key, tuple(map(pure_key, strides)))
            recipe = _STRIDED_STORAGES.get(key)
            if recipe is None:
                nbytes = _strided_storage(sizes, strides, itemsize)
                recipe = remember_recipes(_STRIDED_STORAGES, key, (nbytes,))
            nbytes = rebuild_symint(recipe[0], shape_env)
        base = _EMPTY((0,), dtype=dtype, device=_META)
        _RESIZE_STORAGE_BYTES(base, nbytes)
        return _AS_STRIDED(base, tuple(sizes), tuple(strides), 0).detach()

    def view(
        self,
        base: FakeTensor,
        sizes: Sequence[Any],
        strides: Sequence[Any],
        offset: Any = None,
    ) -> FakeTensor:
        """A view of ``base`` (same storage) with the given geometry."""
        if _FUNCTION_MODES():
            with _NO_TORCH_FUNCTION():
                return self._view(base, sizes, strides, offset)
        return self._view(base, sizes, strides, offset)

    def _view(
        self, base: FakeTensor, sizes: Sequence[Any], strides: Sequence[Any], offset: Any
    ) -> FakeTensor:
        if offset is None:
            offset = base.storage_offset()
        # the restriding of the fake tensor's meta tensor, in the kernel's context
        with in_kernel_invocation_manager(self.fake_mode):
            meta = _AS_STRIDED(base, tuple(sizes), tuple(strides), offset)
        out = FakeTensor(self.fake_mode, meta, base.device)
        if base.requires_grad and torch.is_grad_enabled():
            out.requires_grad_(True)
        return out


def _contiguous_storage(sizes: Sequence[Any], itemsize: int) -> tuple[tuple[Any, ...], Any]:
    """The strides and the storage size (bytes) of ``torch.empty(sizes)``."""
    numel: Any = 1
    for size in sizes:
        numel = numel * size
    return tuple(contiguous_strides(sizes)), itemsize * numel


def _strided_storage(sizes: Sequence[Any], strides: Sequence[Any], itemsize: int) -> Any:
    """The storage size (bytes) of ``torch.empty_strided(sizes, strides)``: one more
    than the position of the last element (the sizes are not 0, see ``new``)."""
    extent: Any = 1
    for size, stride in zip(sizes, strides):
        extent = extent + stride * (size - 1)
    return itemsize * extent


#: (item size, sizes) -> the strides and the byte count of ``torch.empty(sizes)``, and
#: (item size, sizes, strides) -> the byte count of ``torch.empty_strided``, as
#: :func:`symint_recipe`s. Process-wide: the layouts are SymInt arithmetic on the sizes, a
#: function of their expressions (after the ShapeEnv's replacements) and hints only,
#: which the keys hold (:func:`pure_key`); they serve every trace of a model.
_CONTIGUOUS_STORAGES: dict[tuple, tuple] = {}
_STRIDED_STORAGES: dict[tuple, tuple] = {}
#: entries kept before a cache starts over (a few large models' geometries)
_MAX_STORAGES = 50_000


def pure_key(value: Any) -> Any:
    """A size in a process-wide key: the int, or the normalized expression and hint."""
    if type(value) is int:
        return value
    if isinstance(value, torch.SymInt):
        node = value.node
        return node.expr, node._hint
    raise Unsupported(f"not a size: {value!r}")


def symint_recipe(value: Any) -> Any:
    """What :func:`rebuild_symint` needs to rebuild ``value`` in another ShapeEnv."""
    if type(value) is int:
        return value
    node = value.node
    return node._expr, node.pytype, node._hint, node._optimized_summation


def remember_recipes(cache: dict, key: tuple, values: tuple) -> tuple:
    """Stores the recipes of ``values`` (ints and SymInts) under ``key`` in a
    process-wide ``cache``, which starts over when it is full; returns them."""
    if len(cache) >= _MAX_STORAGES:
        cache.clear()
    recipe = cache[key] = tuple(map(symint_recipe, values))
    return recipe


def rebuild_symint(recipe: Any, shape_env: Any) -> Any:
    """A new ``SymInt`` of ``shape_env`` from a :func:`symint_recipe` (an int stays an int)."""
    if type(recipe) is int:
        return recipe
    expr, pytype, hint, optimized_summation = recipe
    return torch.SymInt(
        SymNode(expr, shape_env, pytype, hint, optimized_summation=optimized_summation)
    )


# torch's Python bindings (those of torch._C, which no trace patches) rather than the
# operator overloads: their argument parser converts SymInts at a fraction of the cost
# of an OpOverload's boxed call (an as_strided with symbolic sizes: 11 µs against 16;
# torch.empty(0): 1 µs against 4).
_EMPTY = torch._C._VariableFunctions.empty
_EMPTY_STRIDED = torch._C._VariableFunctions.empty_strided
_AS_STRIDED = torch._C.TensorBase.as_strided
_DISPATCH_MODES = torch._C._len_torch_dispatch_stack
_FUNCTION_MODES = torch._C._len_torch_function_stack
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction
# resizes a storage to a symbolic number of bytes (registered by torch's C++ library,
# without importing inductor)
_RESIZE_STORAGE_BYTES = torch.ops.inductor.resize_storage_bytes_.default
_META = torch.device("meta")


def contiguous_strides(sizes: Sequence[Any]) -> list[Any]:
    """Strides of a fresh contiguous tensor of ``sizes`` (SymInt arithmetic).

    Symbolic strides are remembered across traces (:data:`_CONTIGUOUS_STRIDES`) and
    rebuilt as new ``SymInt`` objects of the sizes' ShapeEnv.
    """
    symbolic = next((size for size in sizes if type(size) is not int), None)
    if symbolic is None:
        return _contiguous_strides(sizes)
    key = tuple(map(pure_key, sizes))
    recipe = _CONTIGUOUS_STRIDES.get(key)
    if recipe is None:
        strides = _contiguous_strides(sizes)
        remember_recipes(_CONTIGUOUS_STRIDES, key, tuple(strides))
        return strides
    shape_env = symbolic.node.shape_env
    return [rebuild_symint(r, shape_env) for r in recipe]


def _contiguous_strides(sizes: Sequence[Any]) -> list[Any]:
    strides: list[Any] = [1] * len(sizes)
    acc: Any = 1
    for i in range(len(sizes) - 1, -1, -1):
        strides[i] = acc
        size = sizes[i]
        if type(size) is int:
            if size == 0:
                raise Unsupported("empty tensor")
            if size != 1:
                acc = acc * size
        else:
            # as torch's make_contiguous_strides_for: an empty dimension counts as 1
            # (`max(n, 1)`, which stays `n` when n is known to be at least 1)
            size = torch.sym_max(size, 1)
            acc = size if type(acc) is int and acc == 1 else acc * size
    return strides


#: sizes (:func:`pure_key`) -> the recipes of their contiguous strides
_CONTIGUOUS_STRIDES: dict[tuple, tuple] = {}


def normalize_dim(dim: Any, rank: int) -> int:
    """A dimension index in ``[0, rank)`` (falls back when out of range)."""
    if type(dim) is not int:
        raise Unsupported("dimension is not an int")
    if dim < 0:
        dim += rank
    if not 0 <= dim < max(rank, 1):
        raise Unsupported("dimension out of range")
    return dim


def broadcast_shapes(*shapes: Sequence[Any]) -> list[Any]:
    """Broadcasts shapes when it is decidable without knowing any dimension.

    Sizes agree when they are the same expression or one of them is a static 1.
    """
    rank = max(len(s) for s in shapes)
    result: list[Any] = [1] * rank
    keys: list[Any] = [1] * rank
    for shape in shapes:
        offset = rank - len(shape)
        for i, size in enumerate(shape):
            key = size_key(size)
            current = keys[offset + i]
            if same_key(key, current) or (type(key) is int and key == 1):
                continue
            if type(current) is int and current == 1:
                result[offset + i] = size
                keys[offset + i] = key
                continue
            raise Unsupported("broadcasting needs a decision on dimensions")
    return result
