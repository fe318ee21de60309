"""onnxscript's no-op rewrite rules, with their constants matched exactly.

onnxscript removes ``x + 0``, ``x - 0``, ``x * 1`` and ``x / 1`` with patterns whose
constants match within a tolerance (``abs_tol=1e-8``, and a relative one): the
``variance + 1e-8`` of an RMS normalization (Helium's ``rms_norm_eps``) matched
``x + 0`` and was removed, and ``rsqrt`` of a zero variance (an embedding's padding
row) became ``inf`` then ``NaN`` in the exported model, where eager is finite (both
torch.onnx and yobx's exports were wrong). These rules replace them: the constant
must be a scalar equal to 0 (or 1) exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import RewriteRule


def _exactly(value: ir.Value | None, expected: float) -> bool:
    """Whether ``value`` is a constant scalar (rank 0) equal to ``expected`` exactly."""
    if value is None or value.const_value is None:
        return False
    array = value.const_value.numpy()
    return array.ndim == 0 and bool(np.asarray(array == expected).all())


def _identity(op, x, c):
    return op.Identity(x)


def _is_zero(context: Any, x: ir.Value, c: ir.Value, **_: Any) -> bool:
    return _exactly(c, 0)


def _is_one(context: Any, x: ir.Value, c: ir.Value, **_: Any) -> bool:
    return _exactly(c, 1)


#: name -> (operator, whether the constant is the first operand, the check)
_NO_OPS = {
    "ExactAddZero": ("Add", False, _is_zero),
    "ExactZeroAdd": ("Add", True, _is_zero),
    "ExactSubZero": ("Sub", False, _is_zero),
    "ExactMulOne": ("Mul", False, _is_one),
    "ExactOneMul": ("Mul", True, _is_one),
    "ExactDivOne": ("Div", False, _is_one),
}


def _pattern(operator: str, constant_first: bool):
    def pattern(op, x, c):
        return getattr(op, operator)(c, x) if constant_first else getattr(op, operator)(x, c)

    return pattern


def exact_no_op_rules() -> list[RewriteRule]:
    """``x + 0``, ``0 + x``, ``x - 0``, ``x * 1``, ``1 * x``, ``x / 1`` removed when the
    constant is exactly 0 or 1 (a scalar: a larger one would broadcast ``x``)."""
    return [
        RewriteRule(_pattern(operator, first), _identity, check, name=name)
        for name, (operator, first, check) in _NO_OPS.items()
    ]


def tolerant_no_op_rules() -> list[Any]:
    """onnxscript's no-op rules on constants, as its default rules hold them (the
    dropouts left: they match no constant)."""
    from onnxscript.rewriter.rules.common import _no_op

    dropouts = (_no_op.dropout_zero_rule, _no_op.dropout_inference_rule)
    return [rule for rule in _no_op.rules.rules if all(rule is not d for d in dropouts)]


__all__ = ["exact_no_op_rules", "tolerant_no_op_rules"]
