"""Outputs torch computed for an operation, remembered for its next call on the same inputs.

An operation without a shape rule runs through torch's fake kernels: milliseconds for a
composite one such as ``scaled_dot_product_attention`` (about 10 ms on a Llama layer,
whose decompositions and backend choice run again for every layer). What torch
returns is a function of what it was given: the operation, the geometry (sizes,
strides, storage offset), dtype, device and ``requires_grad`` of each tensor, the
other arguments, and what the ShapeEnv knows of the sizes. When a call added no guard
and no symbol, wrote into none of its inputs and returned a fresh tensor (a storage of
its own, sized as ``empty_strided`` sizes it), the next call with the same inputs gets
a fresh tensor of the same layout, as from a rule, and the test suite's check mode
compares it with torch as it compares the rules.

Only torch's own operations are remembered: the functions of ``torch``'s modules and
of ``operator``, and the tensor methods that do not write into their input. A user's
function run on fake values may do anything else. A fake tensor holding a constant
(whose values torch may read: ``x[mask]`` of a constant mask) is never part of a key,
and nothing is remembered under a torch function mode (``with torch.device(...)``
changes what factories make) or autocast. The grad mode, the default dtype and torch's
backend flags (which SDPA kernel may run decides the layout of its output) are part of
every key. An output whose sizes hold a symbol none of the inputs has (a data-dependent
size torch took from its own memo of an earlier call) is not remembered.
"""

from __future__ import annotations

from typing import Any, cast

import sympy
import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.immutable_collections import immutable_dict
from torch.fx.node import Node

from yobx.torch.bounded_cache import BoundedCache

from ..node_arguments import ATOMIC_ARGUMENTS
from ._base import (
    ARGUMENT_SEQUENCES,
    TensorFactory,
    _raw_key,
    is_static,
    pure_key,
    rebuild_symint,
    size_key,
    symint_recipe,
)

_MAPPINGS = frozenset({dict, immutable_dict})
_FUNCTION_MODES = torch._C._len_torch_function_stack


#: torch's global backend flags (``torch.backends.*``) a kernel may read to choose what
#: runs, and so its output's layout (scaled_dot_product_attention's flash or math
#: kernel): plain reads of torch's global context, none initializes a device
_BACKEND_FLAGS = tuple(
    getattr(torch._C, name)
    for name in (
        "_get_flash_sdp_enabled",
        "_get_mem_efficient_sdp_enabled",
        "_get_math_sdp_enabled",
        "_get_cudnn_sdp_enabled",
        "_get_overrideable_sdp_enabled",
        "_get_fa3_sdp_enabled",
        "_get_math_sdp_allow_fp16_bf16_reduction",
        "_get_mkldnn_enabled",
        "_get_mkldnn_deterministic",
        "_get_nnpack_enabled",
        "_get_cudnn_enabled",
        "_get_cudnn_benchmark",
        "_get_cudnn_deterministic",
        "_get_cudnn_allow_tf32",
        "_get_cublas_allow_tf32",
        "_get_deterministic_algorithms",
    )
    if hasattr(torch._C, name)
)


class _NotRemembered(Exception):
    """An argument that cannot be part of a key."""


def _is_torch_operation(node: Node) -> bool:
    if node.op == "call_function":
        module = getattr(node.target, "__module__", None) or ""
        return module == "torch" or module.startswith("torch.") or module == "_operator"
    # a method writing into its tensor ends with "_" (add_, copy_, resize_...)
    # a call_method's target is the method's name
    return node.op == "call_method" and not cast(str, node.target).endswith("_")


class RememberedOutputs:
    """The outputs torch computed, by operation and inputs: for one trace, under keys
    holding the sizes' expressions and the ShapeEnv's counters (cheap), and for the
    process, under keys holding the expressions with their example values and
    everything the ShapeEnv knows (see :func:`_environment`): the next traces of a
    model make the same calls."""

    def __init__(self, factory: TensorFactory) -> None:
        self.factory = factory
        self._outputs: dict[tuple, tuple] = {}
        #: the node being computed by torch, its keys and its inputs and their versions
        self._pending: tuple | None = None
        #: how many calls got a remembered output
        self.hits = 0

    def lookup(self, node: Node, args: tuple, kwargs: dict) -> Any:
        """The remembered output of the node's operation on these inputs, a new fresh
        tensor of its layout, or ``NotImplemented`` (then torch computes it: see
        :meth:`remember`)."""
        self._pending = None
        if (
            not _is_torch_operation(node)
            or "out" in kwargs
            or _FUNCTION_MODES()
            or torch._C._is_any_autocast_enabled()
        ):
            # a torch function mode (`with torch.device(...)`) may change what a call
            # makes, autocast its dtype: not remembered while one is active
            return NotImplemented
        tensors: list[FakeTensor] = []
        try:
            modes = (
                torch.is_grad_enabled(),
                torch.get_default_dtype(),
                # the backends a kernel may choose from, and so its output's layout
                # (scaled_dot_product_attention's flash or math kernel)
                tuple(flag() for flag in _BACKEND_FLAGS),
                torch.backends.opt_einsum.enabled,
                torch.backends.opt_einsum.strategy,
            )
            key = (
                node.op,
                node.target,
                _key(args, tensors, _raw_key),
                _key(kwargs, tensors, _raw_key),
                self.factory.knowledge(),
                modes,
            )
            recipe = self._outputs.get(key)
            if recipe is None:
                process_key = (
                    node.op,
                    node.target,
                    _key(args, [], pure_key),
                    _key(kwargs, [], pure_key),
                    _environment(self.factory.fake_mode.shape_env),
                    modes,
                )
                recipe = _PROCESS_OUTPUTS.get(process_key)
                if recipe is not None:
                    self._outputs[key] = recipe
        except Exception:
            # an argument that cannot be part of a key (an unhashable target, a tensor
            # of another layout...): torch computes the value, as without a memo
            return NotImplemented
        if recipe is None:
            versions = tuple(t._version for t in tensors)
            self._pending = (node, key, process_key, versions, tensors, (args, kwargs))
            return NotImplemented
        self.hits += 1
        shape_env = self.factory.fake_mode.shape_env
        sizes, strides, dtype, device, requires_grad = recipe
        return self.factory.new(
            [rebuild_symint(r, shape_env) for r in sizes],
            dtype,
            device,
            requires_grad,
            [rebuild_symint(r, shape_env) for r in strides],
        )

    def what_is_known(self) -> tuple:
        """A cheap fingerprint of what the ShapeEnv knows, to tell whether a call
        taught it anything: the factory's :meth:`~._base.TensorFactory.knowledge`
        (counters, and the ranges' generation) and the number of its guards, axioms
        and deferred assertions."""
        shape_env = self.factory.fake_mode.shape_env
        if shape_env is None:
            return ()
        return (
            self.factory.knowledge(),
            len(shape_env.guards),
            len(shape_env.axioms),
            shape_env.num_deferred_runtime_asserts,
        )

    def remember(self, node: Node, value: Any, unchanged: bool) -> None:
        """Remembers what torch computed for the node :meth:`lookup` last missed.

        :param unchanged: the call taught the ShapeEnv nothing (no guard, symbol,
            range, replacement or assertion: :meth:`what_is_known` is the same before
            and after it); a call that did must run again wherever that is not known
        """
        pending, self._pending = self._pending, None
        if pending is None or pending[0] is not node or not unchanged:
            return
        _, key, process_key, versions, tensors, arguments = pending
        if (
            type(value) is not FakeTensor
            or not _plain(value)
            or tuple(t._version for t in tensors) != versions
            or not _fresh(value, tensors)
            # a size from torch's own memo of a data-dependent size (a second
            # x.nonzero() reuses the first one's symbol, adding none): it belongs to
            # that tensor, not to every tensor of its geometry
            or not _symbols([value]) <= _symbols(pytree.tree_leaves(arguments))
        ):
            return
        recipe = self._outputs[key] = (
            tuple(map(symint_recipe, value.shape)),
            tuple(map(symint_recipe, value.stride())),
            value.dtype,
            value.device,
            value.requires_grad,
        )
        _PROCESS_OUTPUTS[process_key] = recipe


#: the outputs remembered for the process (see :class:`RememberedOutputs`)
_PROCESS_OUTPUTS: dict[tuple, tuple] = BoundedCache(20_000)


def _example_values(shape_env: Any) -> dict:
    # torch 2.13 renamed var_to_val (deprecated) to backed_var_to_val
    if hasattr(shape_env, "backed_var_to_val"):
        return shape_env.backed_var_to_val
    return shape_env.var_to_val


def _environment(shape_env: Any) -> tuple:
    """Everything a ShapeEnv knows that torch's computation of an output may read, or
    that decides whether the computation teaches it something (a guard it already
    has): its settings, the ranges and example values of its symbols, its
    replacements, divisibility facts, axioms, guards and deferred assertions, the
    sizes taken for sizes, and whether the tracer's prover answers its questions
    (:meth:`~yobx.torch.tracing.symbolic.symbolic.SymbolicDimensions.consult_prover`).

    A call remembered where a guard was already known would otherwise, in a trace
    where it is not, skip the guard and the constraint the trace adopts from it.
    """
    if shape_env is None:
        return ()
    return (
        shape_env.settings,
        frozenset(shape_env.var_to_range.items()),
        frozenset(_example_values(shape_env).items()),
        frozenset(shape_env.replacements.items()),
        frozenset(shape_env.divisible),
        frozenset(shape_env.axioms.items()),
        frozenset(guard.expr for guard in shape_env.guards),
        frozenset(
            assertion.expr
            for assertions in shape_env.deferred_runtime_asserts.values()
            for assertion in assertions
        ),
        frozenset(shape_env.size_like),
        "_maybe_evaluate_static" in vars(shape_env),
    )


def _key(value: Any, tensors: list[FakeTensor], size: Any) -> Any:
    """``value`` as part of a key, sizes written by ``size`` (:func:`_raw_key` or
    :func:`pure_key`); the fake tensors found are appended to ``tensors``."""
    kind = type(value)
    if kind in ATOMIC_ARGUMENTS:
        # with its type: 1, 1.0 and True differ
        return kind, value
    if kind is FakeTensor:
        if not _plain(value):
            raise _NotRemembered
        tensors.append(value)
        return (
            FakeTensor,
            tuple(map(size, value.shape)),
            tuple(map(size, value.stride())),
            size(value.storage_offset()),
            value.dtype,
            value.device,
            value.requires_grad,
        )
    if kind in ARGUMENT_SEQUENCES:
        return kind, tuple(_key(v, tensors, size) for v in value)
    if kind in _MAPPINGS:
        return kind, tuple((k, _key(v, tensors, size)) for k, v in value.items())
    if kind is torch.SymInt:
        return kind, size(value)
    if kind is slice:
        return kind, _key((value.start, value.stop, value.step), tensors, size)
    raise _NotRemembered


def _symbols(values: list[Any]) -> set:
    """The symbols of the sizes, strides and offsets of the tensors among ``values``
    and of its SymInts."""
    symbols: set = set()
    for value in values:
        if isinstance(value, torch.Tensor):
            sizes = (*value.shape, *value.stride(), value.storage_offset())
        elif isinstance(value, torch.SymInt):
            sizes = (value,)
        else:
            continue
        for size in sizes:
            if isinstance(size, torch.SymInt):
                symbols |= size.node.expr.free_symbols
    return symbols


def _plain(value: FakeTensor) -> bool:
    """A dense tensor holding no constant (values torch may read) and no lazy conjugate
    or negation."""
    return (
        value.constant is None
        and value.layout is torch.strided
        and not value.is_conj()
        and not value.is_neg()
    )


def _fresh(value: FakeTensor, inputs: list[FakeTensor]) -> bool:
    """A tensor with a storage of its own, sized and laid out as ``empty_strided``
    makes it (the factory makes the same)."""
    storage = value.untyped_storage()
    if any(t.untyped_storage()._cdata == storage._cdata for t in inputs):
        return False
    if not is_static(value.storage_offset(), 0):
        return False
    try:
        sizes = [size_key(s) for s in value.shape]
        strides = [size_key(s) for s in value.stride()]
        nbytes = size_key(storage.nbytes())
    except Exception:  # an unusual size (a SymInt of another kind): not remembered
        return False
    if any(type(s) is int and s == 0 for s in sizes):
        return False
    extent: Any = 1
    for size, stride in zip(sizes, strides):
        extent = extent + stride * (size - 1)
    return sympy.expand(sympy.sympify(extent * value.dtype.itemsize - nbytes)) == 0
