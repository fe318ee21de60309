"""Exact shape rules: the fake values of common operations without FakeTensor dispatch.

Running an operation on fake tensors with symbolic shapes is what makes a trace
slow: torch decomposes it, builds symbolic strides with sympy and fills its cache,
a few milliseconds per node. For the operations transformers and CNNs spend their
time in (matrix products, elementwise arithmetic, views, normalizations, softmax,
concatenation...), these rules build the output fake tensor directly from the
inputs' shapes, in a fraction of that time.

Rules only apply when an input has symbolic sizes (static shapes go through
torch's C++ meta kernels, whose layouts differ in corner cases, and are cheap).
A rule is exact or it does not apply: it only compares sizes structurally (same
expression or same integer, see :func:`~._base.size_key`), never decides anything
about a dynamic dimension, and only handles layouts whose output strides it knows
(exactly contiguous inputs). Otherwise it raises :class:`~._base.Unsupported` and the
tracer runs torch's fake kernels, guards included.

Setting the environment variable ``YOBX_CHECK_SHAPE_RULES=1`` makes the tracer run
both and compare shapes, strides, storage offsets, dtypes, devices, aliasing and
``requires_grad`` for every node a rule handled (the test suite runs that way).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.node import Node

from . import conv, elementwise, factories, nn, resample, views
from ._base import ARGUMENT_SEQUENCES, TensorFactory, Unsupported
from .remembered import RememberedOutputs

__all__ = [
    "ShapeRuleMismatch",
    "ShapeRules",
    "Unsupported",
    "check_enabled",
    "compare",
    "rule_or_torch",
]

_FUNCTION_RULES = {
    **elementwise.FUNCTION_RULES,
    **views.FUNCTION_RULES,
    **nn.FUNCTION_RULES,
    **resample.FUNCTION_RULES,
    **factories.LIKE_RULES,
}
_FACTORY_RULES = frozenset(factories.FUNCTION_RULES.values())
#: rules that also apply to a static input given symbolic sizes (torch's Python
#: decompositions compute those, see symbolic_variants._python_dispatched)
_SIZED_RULES = frozenset([*resample.FUNCTION_RULES.values(), *factories.METHOD_RULES.values()])
_FUNCTION_RULES.update(factories.FUNCTION_RULES)
_METHOD_RULES = {
    **elementwise.METHOD_RULES,
    **views.METHOD_RULES,
    **nn.METHOD_RULES,
    **factories.METHOD_RULES,
}
_MODULE_RULES = {**nn.MODULE_RULES, **conv.MODULE_RULES}


class ShapeRuleMismatch(AssertionError):
    """A shape rule gave another value than torch (a bug in yobx, found by the check mode)."""


def check_enabled() -> bool:
    """Whether ``YOBX_CHECK_SHAPE_RULES`` asks to compare every rule with torch."""
    return os.environ.get("YOBX_CHECK_SHAPE_RULES", "") not in ("", "0")


def rule_or_torch(rule: Callable[[], Any], torch_decides: Callable[[], Any], check: bool) -> Any:
    """The policy when a rule of yobx (a shape rule, a layout decision, a direct
    lowering) fails on an input it did not foresee: that is a bug in the rule, not in
    the model, so torch decides instead (``torch_decides()``); in the check mode
    (``check``: :func:`check_enabled`, the test suite) the failure is raised, to be
    fixed. :class:`Unsupported` (the rule says it does not apply exactly) is raised
    for the caller to handle.
    """
    try:
        return rule()
    except Unsupported:
        raise
    except Exception:
        if check:
            raise
        return torch_decides()


class ShapeRules:
    """The rules bound to one trace's fake mode."""

    def __init__(self, fake_mode, static_fake: Any = None) -> None:
        """:param static_fake: see :class:`~._base.TensorFactory`"""
        self.factory = TensorFactory(fake_mode, static_fake)
        #: what torch computed for the operations without a rule (see :mod:`.remembered`)
        self.remembered = RememberedOutputs(self.factory)
        #: how many nodes the rules computed, and how many fell back (for profiling)
        self.handled = 0
        self.fallbacks = 0

    def run(self, node: Node, args: tuple, kwargs: dict, module: Any = None) -> Any:
        """The node's fake value, or ``NotImplemented`` when no rule applies exactly."""
        if node.op == "call_function":
            rule = _FUNCTION_RULES.get(node.target)
        elif node.op == "call_method":
            # a call_method's target is the method's name
            rule = _METHOD_RULES.get(cast(str, node.target))
        else:
            rule = _MODULE_RULES.get(type(module))
        if rule is None:
            return self._remembered(node, args, kwargs)
        if rule in _FACTORY_RULES:
            if not _any_symbolic_size(args, {}):
                return NotImplemented
        elif not _has_symbolic_tensor(args, kwargs) and not (
            rule in _SIZED_RULES and _any_symbolic_size(args, kwargs)
        ):
            return NotImplemented
        inputs = (module, args, kwargs) if node.op == "call_module" else (args, kwargs)
        try:
            value = rule_or_torch(
                lambda: rule(self.factory, *inputs),
                lambda: NotImplemented,  # torch computes the value
                check_enabled(),
            )
        except Unsupported:
            self.fallbacks += 1
            return self._remembered(node, args, kwargs)
        if value is NotImplemented:
            self.fallbacks += 1
            return NotImplemented
        self.handled += 1
        return value

    def _remembered(self, node: Node, args: tuple, kwargs: dict) -> Any:
        if node.op == "call_module" or not _has_symbolic_tensor(args, kwargs):
            # static shapes take ATen's C++ meta kernels, which are cheap
            return NotImplemented
        return self.remembered.lookup(node, args, kwargs)

    def remember(self, node: Node, value: Any, unchanged: bool) -> None:
        """What torch computed for a node no rule handled (see :mod:`.remembered`).

        :param unchanged: the ShapeEnv knows what it knew before the call
            (:meth:`what_is_known` is the same)
        """
        self.remembered.remember(node, value, unchanged)

    def what_is_known(self) -> tuple:
        """See :meth:`~.remembered.RememberedOutputs.what_is_known`."""
        return self.remembered.what_is_known()


def _has_symbolic_tensor(args: tuple, kwargs: dict) -> bool:
    """Whether an input has symbolic sizes.

    FakeTensor computes static shapes with ATen's C++ meta kernels (TensorIterator
    layouts) and symbolic ones with its Python implementations: the rules follow
    the latter, so they only apply when torch would take that path.
    """
    return _any_symbolic(args) or _any_symbolic(kwargs.values())


def _any_symbolic_size(args: tuple, kwargs: dict) -> bool:
    """Whether a ``SymInt`` is among the arguments, or in a tuple or list of them."""
    return any(
        isinstance(v, torch.SymInt)
        or (type(v) in ARGUMENT_SEQUENCES and any(isinstance(i, torch.SymInt) for i in v))
        for v in (*args, *kwargs.values())
    )


def _any_symbolic(values: Any) -> bool:
    # the containers of operator arguments, walked without pytree (a fifth of the
    # rules' own time); a tensor in another container is missed: torch computes it
    for value in values:
        kind = type(value)
        if kind is FakeTensor:
            if value._has_symbolic_sizes_strides:
                return True
        elif kind in ARGUMENT_SEQUENCES:
            if _any_symbolic(value):
                return True
        elif kind is dict:
            if _any_symbolic(value.values()):
                return True
        elif isinstance(value, FakeTensor) and value._has_symbolic_sizes_strides:
            return True
    return False


def compare(
    value: Any,
    expected: Any,
    inputs: list[Any],
    what: str,
    prove: Callable[[Any], bool | None] | None = None,
) -> None:
    """Raises :class:`ShapeRuleMismatch` when a rule's value differs from torch's.

    :param prove: decides a symbolic equality that the ShapeEnv cannot (torch writes a
        size-1 stride as ``max(1, n)`` where a rule may write ``n`` with ``n >= 1``)
    """
    if isinstance(expected, (tuple, list)):
        if not isinstance(value, (tuple, list)) or len(value) != len(expected):
            raise ShapeRuleMismatch(f"shape rule of {what}: {value!r} instead of {expected!r}")
        for v, e in zip(value, expected):
            compare(v, e, inputs, what, prove)
        return

    def _equal(a: Any, b: Any) -> bool:
        if _known_equal(a, b):
            return True
        equal = a == b
        if isinstance(equal, bool):
            return equal
        return prove is not None and prove(equal.node.expr) is True

    if isinstance(expected, (int, torch.SymInt)) and not isinstance(expected, bool):
        # a size (x.size(dim)): the same expression
        if not isinstance(value, (int, torch.SymInt)) or not _equal(value, expected):
            raise ShapeRuleMismatch(f"shape rule of {what}: {value!r} instead of {expected!r}")
        return
    if not isinstance(expected, torch.Tensor) or not isinstance(value, torch.Tensor):
        raise ShapeRuleMismatch(f"shape rule of {what}: {value!r} instead of {expected!r}")
    problems = []
    for label, got, want in (
        ("shape", tuple(value.shape), tuple(expected.shape)),
        ("stride", value.stride(), expected.stride()),
    ):
        if len(got) != len(want) or not all(
            _equal(g, w) or (label == "stride" and _is_static_one(size))
            for g, w, size in zip(got, want, expected.shape)
        ):
            problems.append(f"{label} {got} instead of {want}")
    if not _equal(value.storage_offset(), expected.storage_offset()):
        problems.append(f"storage offset {value.storage_offset()} != {expected.storage_offset()}")
    for attribute in ("dtype", "device", "requires_grad"):
        if getattr(value, attribute) != getattr(expected, attribute):
            problems.append(
                f"{attribute} {getattr(value, attribute)} instead of {getattr(expected, attribute)}"
            )
    if _aliases(value, inputs) != _aliases(expected, inputs):
        problems.append("aliasing differs")
    if (value is _same_input(value, inputs)) != (expected is _same_input(expected, inputs)):
        problems.append("identity with an input differs")
    if problems:
        raise ShapeRuleMismatch(f"shape rule of {what}: " + "; ".join(problems))


def _is_static_one(size: Any) -> bool:
    # the stride of a dimension of size 1 addresses nothing: torch's kernels differ on
    # it (TensorIterator writes `max(size, 1)` products, views keep the input's)
    return type(size) is int and size == 1


def _known_equal(a: Any, b: Any) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return statically_known_true(a == b)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _aliases(value: torch.Tensor, inputs: list[Any]) -> bool:
    storage = _storage(value)
    return any(isinstance(t, torch.Tensor) and _storage(t) == storage for t in inputs)


def _same_input(value: torch.Tensor, inputs: list[Any]) -> Any:
    return next((t for t in inputs if t is value), None)
