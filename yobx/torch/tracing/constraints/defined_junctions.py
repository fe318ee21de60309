"""``and``/``or`` of conditions that may divide by zero, as the checks count them.

A check's condition may divide by a size that is 0 for some inputs (torch's guard on the
number of pieces of ``x.chunk(4, 1)`` divides by ``ceil(dim/4)``). Each operand of an
``and``/``or`` comes with what it needs to be defined (its divisors other than zero):

* an ``or`` counts each disjunct where it is defined, false elsewhere, and is defined
  everywhere: ``body when guard`` is ``Or(Not(guard), body)``, and where the guard does
  not hold the body may divide by zero without breaking the check;
* an ``and`` is false where one of its defined conjuncts is, whatever the others (the
  choice between versions stops at that condition: ``dim >= 2 and ... // ((dim + 3)//4)
  == 4`` at ``dim = 0``), and is defined there or where every conjunct is. Where none is
  false and one divides by zero, it is undefined: the choice would divide by zero too.

The traced graph's checks (:mod:`.runtime_checks`) and the ONNX model's
(:mod:`yobx.torch.onnx.runtime_checks`) build their nodes with :func:`junction`, each
with its own operations; Python's evaluation (:mod:`.size_search`) counts them the same
way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def _fold(operation: Callable[[Any, Any], Any], values: Sequence[Any]) -> Any:
    result = values[0]
    for value in values[1:]:
        result = operation(result, value)
    return result


def junction(
    operands: Sequence[tuple[Any, Sequence[Any]]],
    disjunction: bool,
    both: Callable[[Any, Any], Any],
    either: Callable[[Any, Any], Any],
    negate: Callable[[Any], Any],
) -> tuple[Any, Any]:
    """The value of an ``Or`` (``disjunction``) or an ``And`` of ``operands``, and
    the condition it needs to be defined (None: defined everywhere).

    :param operands: ``(value, needs)`` of each operand, ``needs`` the conditions its
        value needs to be defined
    :param both: ``a and b`` of two values (or conditions)
    :param either: ``a or b``
    :param negate: ``not a``
    """
    values = [value for value, _ in operands]
    definitions = [_fold(both, list(needs)) if needs else None for _, needs in operands]
    if disjunction:
        terms = [v if d is None else both(d, v) for v, d in zip(values, definitions)]
        return _fold(either, terms), None
    result = _fold(both, values)
    known = [d for d in definitions if d is not None]
    if result is False or not known:
        return result, None
    # defined where a defined conjunct is false, or where all of them are defined
    whole = _fold(both, known)
    for value, defined in zip(values, definitions):
        if value is True:
            continue
        false = negate(value)
        whole = either(whole, false if defined is None else both(defined, false))
    return result, whole


__all__ = ["junction"]
