"""Fake values of aten operators from the tracer's shape rules, while lowering.

Lowering interprets the traced graph with ``make_fx``: every aten operator it records
also runs on fake tensors with symbolic shapes, through decompositions and Python
meta functions (a ``cat``, a ``mean`` or a composite ``linear`` cost milliseconds).
The tracer's exact shape rules (:mod:`yobx.torch.tracing.shape_rules`) give the same
fake values directly. :func:`aten_fake_rules` routes the fake mode's dispatch through
them for the operators listed here; where a rule does not apply (static shapes,
strided inputs it does not handle...), torch computes the value as before, guards
included. ``YOBX_CHECK_SHAPE_RULES=1`` runs both and compares them.

The composite operators the lowering keeps whole (``linear``, ``matmul``,
``layer_norm``) get the most from it: torch otherwise runs their whole
decomposition just to know the output's shape.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

from yobx.torch.tracing import shape_rules
from yobx.torch.tracing.isolation.patching import patched_attributes
from yobx.torch.tracing.shape_rules import elementwise, views
from yobx.torch.tracing.shape_rules import nn as nn_rules
from yobx.torch.tracing.shape_rules._base import (
    TensorFactory,
    Unsupported,
    exactly_contiguous,
    fake,
)

aten = torch.ops.aten


def _without(names_and_defaults: dict, rule: Callable) -> Callable:
    """Drops keyword arguments at their default value (others: no rule)."""

    def wrapped(factory, args, kwargs):
        for name, default in names_and_defaults.items():
            if name in kwargs:
                if kwargs[name] != default:
                    raise Unsupported(f"{name}={kwargs[name]!r}")
                kwargs = {k: v for k, v in kwargs.items() if k != name}
        return rule(factory, args, kwargs)

    return wrapped


def _layer_norm(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    # aten.layer_norm has a trailing cudnn_enable flag the functional form has not
    names = ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable")
    bound = {**dict(zip(names, args)), **kwargs}
    bound.pop("cudnn_enable", None)
    return nn_rules.layer_norm(factory, (), bound)


def _embedding(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    # aten.embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)
    if len(args) < 2 or kwargs.get("sparse") or (len(args) > 4 and args[4]):
        raise Unsupported("sparse")
    return nn_rules.embedding(factory, (args[1], args[0]), {})


def _slice(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    names = ("self", "dim", "start", "end", "step")
    bound = {"dim": 0, "start": None, "end": None, "step": 1, **dict(zip(names, args)), **kwargs}
    x = fake(bound["self"])
    dim = bound["dim"] % max(x.dim(), 1) if type(bound["dim"]) is int else bound["dim"]
    end = bound["end"]
    if type(end) is int and end >= sys.maxsize:
        end = None
    index = (slice(None),) * dim + (slice(bound["start"], end, bound["step"]),)
    return views.getitem(factory, (x, index), {})


def _select(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    if kwargs or len(args) != 3 or type(args[1]) is not int:
        raise Unsupported("unexpected arguments")
    x, dim, index = args
    dim = dim % max(x.dim(), 1)
    return views.getitem(factory, (x, (slice(None),) * dim + (index,)), {})


def _triangle(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """triu/tril: a fresh tensor shaped like the input."""
    x = fake(args[0])
    if x.dim() < 2 or not exactly_contiguous(x) or set(kwargs) - {"diagonal"}:
        raise Unsupported("layout or arguments")
    return factory.new(x.shape, x.dtype, x.device)


_FLOAT_UNARY = ("rsqrt", "sqrt", "exp", "log", "tanh", "sigmoid", "sin", "cos", "erf", "reciprocal")

#: aten overload -> the shape rule giving its fake value
RULES: dict[Any, Callable] = {
    aten.add.Tensor: _without({"alpha": 1}, elementwise.arithmetic),
    aten.sub.Tensor: _without({"alpha": 1}, elementwise.arithmetic_no_bool),
    aten.mul.Tensor: elementwise.arithmetic,
    aten.div.Tensor: elementwise.true_divide,
    aten.neg.default: elementwise.numeric_unary,
    aten.relu.default: elementwise.numeric_unary,
    aten.silu.default: elementwise.float_unary,
    aten.gelu.default: lambda f, a, k: elementwise.float_unary(f, a, k, ("approximate",)),
    aten.pow.Tensor_Scalar: elementwise.power,
    **{getattr(aten, name).default: elementwise.float_unary for name in _FLOAT_UNARY},
    **{
        getattr(aten, name).Tensor: elementwise.comparison
        for name in ("lt", "le", "gt", "ge", "eq", "ne")
    },
    **{
        getattr(aten, name).Scalar: elementwise.comparison
        for name in ("lt", "le", "gt", "ge", "eq", "ne")
    },
    aten.bitwise_and.Tensor: elementwise.logical,
    aten.bitwise_or.Tensor: elementwise.logical,
    aten.where.self: elementwise.where,
    aten.mean.dim: _without({"dtype": None}, nn_rules._reduction),
    aten.sum.dim_IntList: _without({"dtype": None}, nn_rules._reduction),
    aten.cat.default: nn_rules.cat,
    aten.linear.default: nn_rules.linear,
    aten.matmul.default: nn_rules.matmul,
    aten.bmm.default: nn_rules.bmm,
    aten.layer_norm.default: _layer_norm,
    aten.embedding.default: _embedding,
    aten.view.default: views.view,
    aten.transpose.int: views.transpose,
    aten.permute.default: views.permute,
    aten.unsqueeze.default: views.unsqueeze,
    aten.squeeze.dim: views.squeeze,
    aten.expand.default: _without({"implicit": False}, views.expand),
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.triu.default: _triangle,
    aten.tril.default: _triangle,
}


#: operators whose fake kernel decides only the layout of its result on the sizes:
#: ``aten.copy`` (a write ``x[:, :n] = y``) copies the storage of the slice written,
#: its strides and offset, and asks on the way whether the slice is dense (``seq != n``
#: for ``n`` of the ``seq`` columns). Computed by torch without a guard: the lowering
#: would otherwise adopt that question as a constraint, refusing the one size where the
#: write covers ``x``, though the values are the same at every size.
LAYOUT_ONLY = frozenset({aten.copy.default})


def _without_guards(fake_mode: Any) -> contextlib.AbstractContextManager:
    """Torch's decisions on sizes taken without a guard in ``fake_mode``'s ShapeEnv."""
    shape_env = fake_mode.shape_env
    return shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()


@contextlib.contextmanager
def aten_fake_rules(fake_mode) -> Iterator[None]:
    """Inside the block, ``fake_mode`` computes the operators of :data:`RULES` with the
    shape rules when they apply (the instance is restored on exit)."""
    original = fake_mode._dispatch_impl
    factory = TensorFactory(fake_mode)
    check = shape_rules.check_enabled()

    def dispatch_impl(func, types, args, kwargs):
        if func in LAYOUT_ONLY:
            with _without_guards(fake_mode):
                return original(func, types, args, kwargs)
        rule = RULES.get(func)
        if rule is None or not shape_rules._has_symbolic_tensor(args, kwargs):
            return original(func, types, args, kwargs)
        try:
            value = shape_rules.rule_or_torch(
                lambda: rule(factory, tuple(args), dict(kwargs)), lambda: NotImplemented, check
            )
        except Unsupported:
            value = NotImplemented
        if value is NotImplemented:  # torch decides
            return original(func, types, args, kwargs)
        if check:
            # what torch decides on its way to the value a rule gave (whether a view is
            # dense...) is no decision of the lowering, as it is not without the check:
            # no guard (the tracer checks its rules so too)
            with _without_guards(fake_mode):
                expected = original(func, types, args, kwargs)
            shape_rules.compare(value, expected, pytree.tree_leaves((args, kwargs)), str(func))
        return value

    with patched_attributes([(fake_mode, "_dispatch_impl", dispatch_impl)]):
        yield
