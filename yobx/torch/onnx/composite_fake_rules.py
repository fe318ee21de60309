"""Fake values of the composite operators the lowering keeps whole, from shape rules.

While lowering, ``linear``, ``matmul`` and ``layer_norm`` stay single aten nodes
(torch_lib translates them). torch still needs their fake output and computes it by
running their decomposition on fake tensors (a transpose, an expand, a ``bmm``, views,
with symbolic shapes): tens of milliseconds per node. The tracer's exact shape rules
(:mod:`yobx.torch.tracing.shape_rules`) give the same value directly; where a rule does
not apply, the decomposition runs as before. ``YOBX_CHECK_SHAPE_RULES=1`` compares both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses import fake_impls

from yobx.torch.tracing import shape_rules
from yobx.torch.tracing.shape_rules import nn as nn_rules
from yobx.torch.tracing.shape_rules._base import TensorFactory, Unsupported

aten = torch.ops.aten


def _layer_norm(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    # aten.layer_norm has a trailing cudnn_enable flag the functional form has not
    names = ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable")
    bound = {**dict(zip(names, args)), **kwargs}
    bound.pop("cudnn_enable", None)
    return nn_rules.layer_norm(factory, (), bound)


#: aten composite operator -> the shape rule giving its output
_RULES: dict[Any, Callable] = {
    aten.linear.default: nn_rules.linear,
    aten.matmul.default: nn_rules.matmul,
    aten.layer_norm.default: _layer_norm,
}


def _fake_impl(op: Any, rule: Callable) -> Callable:
    from torch._export.utils import _get_decomp_for_cia

    decomposition = _get_decomp_for_cia(op)

    def impl(fake_mode, func, *args, **kwargs):
        value = NotImplemented
        if shape_rules._has_symbolic_tensor(args, kwargs):
            try:
                value = rule(TensorFactory(fake_mode), args, kwargs)
            except Unsupported:
                value = NotImplemented
        if value is NotImplemented or shape_rules.check_enabled():
            with fake_mode:
                expected = decomposition(*args, **kwargs)
            if value is NotImplemented:
                return expected
            shape_rules.compare(value, expected, pytree.tree_leaves((args, kwargs)), str(op))
        return value

    return impl


@contextlib.contextmanager
def composite_fake_rules(ops: Any) -> Iterator[None]:
    """Registers the fast fake implementations of ``ops`` (those with a rule) inside
    the block; torch's own registrations are left alone and everything is removed on
    exit."""
    registered = []
    try:
        for op in ops:
            rule = _RULES.get(op)
            if rule is None or fake_impls._is_op_registered_to_fake_rule(op):
                continue
            fake_impls.register_op_impl(op)(_fake_impl(op, rule))
            registered.append(op)
        yield
    finally:
        for op in registered:
            fake_impls._deregister_op_impl(op)
