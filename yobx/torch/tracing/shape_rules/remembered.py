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
changes what factories make). The grad mode, autocast and the default dtype are part
of every key.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.fx.node import Node

from ._base import TensorFactory, _raw_key, is_static, rebuild_symint, size_key, symint_recipe

#: leaves of a key that stand for themselves (with their type: 1, 1.0 and True differ)
_PLAIN = frozenset(
    {
        int,
        float,
        bool,
        str,
        type(None),
        type(Ellipsis),
        torch.dtype,
        torch.device,
        torch.layout,
        torch.memory_format,
    }
)
_SEQUENCES = frozenset({tuple, list, immutable_list})
_FUNCTION_MODES = torch._C._len_torch_function_stack
_MAPPINGS = frozenset({dict, immutable_dict})


class _NotRemembered(Exception):
    """An argument that cannot be part of a key."""


def _is_torch_operation(node: Node) -> bool:
    if node.op == "call_function":
        module = getattr(node.target, "__module__", None) or ""
        return module == "torch" or module.startswith("torch.") or module == "_operator"
    # a method writing into its tensor ends with "_" (add_, copy_, resize_...)
    return node.op == "call_method" and not node.target.endswith("_")


class RememberedOutputs:
    """The outputs torch computed in one trace, by operation and inputs."""

    def __init__(self, factory: TensorFactory) -> None:
        self.factory = factory
        self._outputs: dict[tuple, tuple] = {}
        #: the node being computed by torch, its key and its inputs' versions
        self._pending: tuple[Node, tuple, tuple] | None = None
        #: how many calls got a remembered output
        self.hits = 0

    def lookup(self, node: Node, args: tuple, kwargs: dict) -> Any:
        """The remembered output of the node's operation on these inputs, a new fresh
        tensor of its layout, or ``NotImplemented`` (then torch computes it: see
        :meth:`remember`)."""
        self._pending = None
        if not _is_torch_operation(node) or "out" in kwargs or _FUNCTION_MODES():
            # a torch function mode (`with torch.device(...)`) may change what a call
            # makes: not remembered while one is active
            return NotImplemented
        tensors: list[FakeTensor] = []
        try:
            key = (
                node.op,
                node.target,
                _key(args, tensors),
                _key(kwargs, tensors),
                self.factory.knowledge(),
                torch.is_grad_enabled(),
                torch._C._is_any_autocast_enabled(),
                torch.get_default_dtype(),
            )
            recipe = self._outputs.get(key)
        except Exception:
            # an argument that cannot be part of a key (an unhashable target, a tensor
            # of another layout...): torch computes the value, as without a memo
            return NotImplemented
        if recipe is None:
            self._pending = (node, key, tuple(t._version for t in tensors), tensors)
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

    def remember(self, node: Node, value: Any, unchanged: bool) -> None:
        """Remembers what torch computed for the node :meth:`lookup` last missed.

        :param unchanged: the call added no guard and no symbol to the ShapeEnv
        """
        pending, self._pending = self._pending, None
        if pending is None or pending[0] is not node or not unchanged:
            return
        _, key, versions, tensors = pending
        if (
            type(value) is not FakeTensor
            or not _plain(value)
            or tuple(t._version for t in tensors) != versions
            or not _fresh(value, tensors)
        ):
            return
        self._outputs[key] = (
            tuple(map(symint_recipe, value.shape)),
            tuple(map(symint_recipe, value.stride())),
            value.dtype,
            value.device,
            value.requires_grad,
        )


def _key(value: Any, tensors: list[FakeTensor]) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return kind, value
    if kind is FakeTensor:
        if not _plain(value):
            raise _NotRemembered
        tensors.append(value)
        return (
            FakeTensor,
            tuple(map(_raw_key, value.shape)),
            tuple(map(_raw_key, value.stride())),
            _raw_key(value.storage_offset()),
            value.dtype,
            value.device,
            value.requires_grad,
        )
    if kind in _SEQUENCES:
        return kind, tuple(_key(v, tensors) for v in value)
    if kind in _MAPPINGS:
        return kind, tuple((k, _key(v, tensors)) for k, v in value.items())
    if kind is torch.SymInt:
        return kind, _raw_key(value)
    if kind is slice:
        return kind, _key((value.start, value.stop, value.step), tensors)
    raise _NotRemembered


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
