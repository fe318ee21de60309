"""Custom operators of the checks a model makes on tensor values, for the ONNX export.

A traced graph checks ``assert lengths.max() <= n`` with a
:func:`~yobx.torch.tracing.constraints.value_checks.check_value` node, which returns nothing. ONNX
has no assertion: a node whose result nothing reads is removed. Before lowering, the
check becomes :func:`value_check`, which returns a *token* (one int64 zero), and every
output of its graph goes through :func:`gated` with that token: the outputs then
depend on the check (see :mod:`yobx.torch.onnx.value_checks` for their ONNX form).
"""

from __future__ import annotations

import torch


@torch.library.custom_op("yobx::value_check", mutates_args=())
def value_check(condition: torch.Tensor, message: str) -> torch.Tensor:
    """Raises ``AssertionError(message)`` unless every element of ``condition`` holds;
    returns the token, ``tensor([0])``."""
    if not bool(condition.all()):
        raise AssertionError(message)
    return torch.zeros(1, dtype=torch.int64)


@value_check.register_fake
def _value_check_fake(condition: torch.Tensor, message: str) -> torch.Tensor:
    return condition.new_zeros(1, dtype=torch.int64)


@torch.library.custom_op("yobx::gated", mutates_args=())
def gated(value: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """``value`` once the check that made ``token`` passed (a copy: an operator's
    output cannot be its input)."""
    return value.clone()


@gated.register_fake
def _gated_fake(value: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(value)


__all__ = ["gated", "value_check"]
