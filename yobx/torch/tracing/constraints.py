"""Constraints: facts on dynamic dimensions that a traced graph relies on.

When a decision on dynamic dimensions is not provable from what is declared (ranges,
``torch._check`` facts, equal names), the tracer adopts the example's answer for
dimensions that allow it (string names, ``Dim.DYNAMIC``, ``Dim.AUTO``) and records it
as a :class:`Constraint`; the traced graph checks every constraint on its inputs when it
runs and raises :class:`ConstraintViolationError` outside them.
"""

from __future__ import annotations

import dataclasses

#: the kinds of constraints, from the most to the least specific
CONSTRAINT_KINDS = ("value", "range", "divisibility", "relation", "other")


@dataclasses.dataclass(frozen=True)
class Constraint:
    """One fact on dynamic dimensions adopted from the example inputs.

    :param expression: the condition, in the user's dimension names
        (``seq <= 128``, ``total == cache + seq``, ``dim % 2 == 0``)
    :param kind: ``"range"``, ``"relation"``, ``"divisibility"``, ``"value"`` (a
        dimension equal to a constant) or ``"other"`` (any other formula)
    :param location: the user's ``file:line`` that needed it
    :param dimensions: the user names of the dimensions involved
    """

    expression: str
    kind: str
    location: str = ""
    dimensions: tuple[str, ...] = ()

    def __str__(self) -> str:
        where = f"  [{self.location}]" if self.location else ""
        return f"{self.expression} ({self.kind}){where}"


class ConstraintViolationError(RuntimeError):
    """Raised by a traced graph whose inputs break one of its constraints.

    :param expression: the constraint, in the user's dimension names
    :param values: the dimension values of the inputs, by user name
    :param location: the user's ``file:line`` that needed the constraint
    """

    def __init__(self, expression: str, values: dict[str, int], location: str = ""):
        self.expression = expression
        self.values = dict(values)
        self.location = location
        sizes = ", ".join(f"{name}={value}" for name, value in self.values.items())
        where = f" (needed by {location})" if location else ""
        super().__init__(
            f"the inputs break the constraint `{expression}` of the traced graph{where}: "
            f"{sizes}; the graph was traced for inputs satisfying it and would be wrong "
            f"for these"
        )
