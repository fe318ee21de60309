"""Python-like text of dimension expressions, as users write them.

sympy prints ``Eq(a, b)`` and ``floor(seq/2)``; messages, guards and constraints read
``a == b`` and ``seq // 2``. :func:`pretty` is what
:meth:`SymbolicDimensions.render <yobx.torch.tracing.symbolic.symbolic.SymbolicDimensions.render>`
uses once the symbols carry the user's names.
"""

from __future__ import annotations

import sympy
from sympy.printing.precedence import PRECEDENCE
from sympy.printing.str import StrPrinter

_RELATIONS = {
    sympy.Eq: "==",
    sympy.Ne: "!=",
    sympy.Lt: "<",
    sympy.Le: "<=",
    sympy.Gt: ">",
    sympy.Ge: ">=",
}


class _UserPrinter(StrPrinter):
    """Python-like text of dimension expressions: ``seq <= 128``, ``dim % 2 == 0``,
    ``(seq + 1) // 2``, ``min(4, seq)``. Floor divisions and remainders are
    parenthesized when nested, since ``*`` and ``//`` read ambiguously together."""

    def _binary(self, expr, op: str) -> str:
        # Python's `*`, `//` and `%` share one precedence and associate to the left
        left = self.parenthesize(expr.args[0], PRECEDENCE["Mul"])
        right = self.parenthesize(expr.args[1], PRECEDENCE["Mul"], strict=True)
        return f"({left} {op} {right})"

    def _print_FloorDiv(self, expr):
        return self._binary(expr, "//")

    def _print_Mod(self, expr):
        return self._binary(expr, "%")

    _print_PythonMod = _print_Mod

    def _print_CleanDiv(self, expr):
        return self._binary(expr, "//")

    def _print_Min(self, expr):
        return f"min({', '.join(self._print(a) for a in expr.args)})"

    def _print_Max(self, expr):
        return f"max({', '.join(self._print(a) for a in expr.args)})"

    def _print_Relational(self, expr):
        op = _RELATIONS.get(type(expr), expr.rel_op)
        return f"{_strip(self._print(expr.lhs))} {op} {_strip(self._print(expr.rhs))}"

    def _print_Not(self, expr):
        return f"not ({_strip(self._print(expr.args[0]))})"

    def _print_And(self, expr):
        return " and ".join(f"({_strip(self._print(a))})" for a in expr.args)

    def _print_Or(self, expr):
        return " or ".join(f"({_strip(self._print(a))})" for a in expr.args)


def _strip(text: str) -> str:
    """Removes one pair of parentheses enclosing the whole text."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for i, c in enumerate(text):
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and i < len(text) - 1:
            return text
    return text[1:-1]


_PRINTER = _UserPrinter()


def pretty(expr: sympy.Basic) -> str:
    """Python-like rendering of an expression (sympy prints ``Eq(a, b)``)."""
    return _strip(_PRINTER.doprint(expr))


__all__ = ["pretty"]
