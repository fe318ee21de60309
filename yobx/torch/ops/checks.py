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

from ._lazy import LazyOperators


def _value_check(condition: torch.Tensor, message: str) -> torch.Tensor:
    """Raises ``AssertionError(message)`` unless every element of ``condition`` holds;
    returns the token, ``tensor([0])``."""
    if not bool(condition.all()):
        raise AssertionError(message)
    return torch.zeros(1, dtype=torch.int64)


def _value_check_fake(condition: torch.Tensor, message: str) -> torch.Tensor:
    return condition.new_zeros(1, dtype=torch.int64)


def _gated(value: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """``value`` once the check that made ``token`` passed (a copy: an operator's
    output cannot be its input)."""
    return value.clone()


def _gated_fake(value: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(value)


#: the custom operators ``yobx::value_check`` and ``yobx::gated`` by name, defined the
#: first time they are asked for (``operators()``) in a process: see :mod:`._lazy`
operators = LazyOperators(
    {
        "value_check": ("yobx::value_check", _value_check, _value_check_fake),
        "gated": ("yobx::gated", _gated, _gated_fake),
    }
)
#: whether they were defined in this process
defined = operators.defined

#: `value_check` and `gated`, defined when first read
__getattr__ = operators.module_getattr(__name__)


# `value_check` and `gated` are read through __getattr__ (defined when first read)
__all__ = ["defined", "operators"]
