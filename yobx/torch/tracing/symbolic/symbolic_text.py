"""The text of a symbolic dimension or shape: readable in messages, never a silent value.

Model code turns sizes into text mostly to build messages: ``logger.warning(f"... {x.shape}")``,
``warnings.warn(...)``, ``raise ValueError(f"expected {n} ...")``. While tracing, a dynamic
dimension has no single size, so ``str()``, ``repr()`` and ``format()`` of it (or of a
shape holding it) give its expression in the user's names, ``batch``, ``2*seq``,
``torch.Size([batch, 4])``, and cost nothing: no constraint, no specialization.

Text used as a *value* is another matter: ``int(str(n))``, ``str(n) == "1"``,
``len(f"{n}")`` or ``"3" in str(x.shape)`` would bake the answer of the example (or of the
symbolic text) into the graph. The text is a :class:`SymbolicText`, a ``str`` that
behaves as such in messages but turns every use of its content into a decision on the
dimensions it shows, made as for ``int(n)`` (see
:meth:`~yobx.torch.tracing.core.decisions.DecisionsMixin.python_number`): the dimension is
fixed to its example size, a constraint checked when the graph runs. With ``Dim.AUTO``
(or ``specialize_undecidable=True``) the dimension becomes static with a warning; with a
string name or ``Dim.DYNAMIC`` the trace raises a
:class:`~yobx.torch.tracing.SpecializationError` naming the line; with a named
``torch.export.Dim`` the needed constraint is reported. The operation then runs on the
example's text, as eager would.

* Uses of the content: comparisons (``==`` with anything but the same symbolic text,
  ``<``...), ``len``, indexing, iteration, ``in``, ``int()``/``float()``, and the methods
  answering a question (``isdigit``, ``startswith``, ``find``, ``split``...).
* Message building keeps the marking: ``+``, ``%`` (``"n=%s" % text``), ``*``,
  ``format()`` specs, and the methods returning text (``upper``, ``strip``,
  ``replace``, ``ljust``...). Hashing is free: a dictionary keyed by such texts (a cache
  per shape) gives the same entry to the same symbolic expression, which is right for
  every size.

Limits. Python builds an f-string of several parts (``f"{h}x{w}"``), ``str.join`` and
``str.format`` in C: the result is a plain ``str`` of the symbolic text (``"hxw"``). Parsing
it fails loudly (``int("h")``), but comparing it with a literal answers as for that
text (``False`` for ``"1x1"``) without a constraint. ``"%d" % n`` needs a Python int and
fixes the dimension like ``int(n)``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from ..isolation.patch_window import PatchWindow, current_window

#: str methods whose answer depends on the text's content (run on the example's text)
_CONTENT_OPERATIONS = (
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__len__",
    "__getitem__",
    "__iter__",
    "__contains__",
    "count",
    "encode",
    "endswith",
    "find",
    "index",
    "isalnum",
    "isalpha",
    "isascii",
    "isdecimal",
    "isdigit",
    "isidentifier",
    "islower",
    "isnumeric",
    "isprintable",
    "isspace",
    "istitle",
    "isupper",
    "partition",
    "rfind",
    "rindex",
    "rpartition",
    "rsplit",
    "split",
    "splitlines",
    "startswith",
)

#: str methods building text from text (a message stays marked)
_TEXT_OPERATIONS = (
    "capitalize",
    "casefold",
    "center",
    "expandtabs",
    "ljust",
    "lower",
    "lstrip",
    "removeprefix",
    "removesuffix",
    "replace",
    "rjust",
    "rstrip",
    "strip",
    "swapcase",
    "title",
    "upper",
    "zfill",
)


class SymbolicText(str):
    """Text showing symbolic values: the symbolic expression, with the example's text.

    :param text: the text in the user's dimension names (what the string holds)
    :param example: the text eager gives for the example inputs (None when a value has
        no example, being data-dependent)
    :param values: the proxies of the symbolic values shown
    """

    example: str | None
    values: tuple[Any, ...]
    window: PatchWindow | None

    def __new__(cls, text: str, example: str | None, values: Sequence[Any]):
        self = super().__new__(cls, text)
        self.example = example
        self.values = tuple(values)
        # the trace it belongs to: once over (the text of a recorded warning or of an
        # exception, read afterwards), the text is a plain message
        self.window = current_window()
        return self

    def concrete(self, operation: str) -> str:
        """The example's text, once the values shown are fixed to their example's (a
        constraint on the dimensions, or an error, see the module's documentation).

        Outside the trace that made it, the symbolic text itself.
        """
        if self.window is None or current_window() is not self.window:
            return _plain(self)
        for proxy in self.values:
            tracer = proxy.tracer
            text = tracer.dims.render(proxy.node.meta.get("val"))
            what = (
                f"`{operation}` on the text of `{text}` (from str(), repr(), format() or an "
                f"f-string; a message may show it, a computation needs the dimension itself)"
            )
            if isinstance(proxy.node.meta.get("val"), torch.SymBool):
                tracer.decide(proxy.node.meta["val"], what)
            else:
                tracer.python_number(proxy, what)
        if self.example is None:
            # a data-dependent value shown: the decisions above raise for it, and a
            # str method given None raises this same TypeError
            raise TypeError(f"`{operation}` on a text with no example: {_plain(self)!r}")
        return self.example

    # str() of it is the plain text: what libraries (logging, exceptions, warnings) do
    # with a message after str() stays a message, never a decision on a dimension
    def __str__(self) -> str:
        return _plain(self)

    def __repr__(self) -> str:
        return str.__repr__(self)

    def __bool__(self) -> bool:
        return str.__len__(self) > 0

    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SymbolicText) and str.__eq__(self, other):
            # the same symbolic expression: equal for every size
            return True
        if not isinstance(other, str):
            return NotImplemented
        return str.__eq__(self.concrete("=="), _example(other, "=="))

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __int__(self) -> int:
        return int(self.concrete("int()"))

    def __float__(self) -> float:
        return float(self.concrete("float()"))

    # message building

    def __format__(self, spec: str) -> SymbolicText:
        return self._derived(_format_text(_plain(self), spec), _format(self.example, spec))

    def __add__(self, other: Any) -> Any:
        if not isinstance(other, str):
            return NotImplemented
        return _join(self, other)

    def __radd__(self, other: Any) -> Any:
        if not isinstance(other, str):
            return NotImplemented
        return _join(other, self)

    def __mul__(self, count: Any) -> Any:
        return self._derived(str.__mul__(self, count), _apply(self.example, str.__mul__, count))

    __rmul__ = __mul__

    def __rmod__(self, template: Any) -> Any:
        if not isinstance(template, str):
            return NotImplemented
        return self._derived(
            str.__mod__(template, _plain(self)), _apply(template, str.__mod__, self.example)
        )

    def _derived(self, text: str, example: str | None, values: Sequence[Any] = ()) -> SymbolicText:
        derived = SymbolicText(text, example, self.values + tuple(values))
        derived.window = self.window
        return derived


def _plain(text: str) -> str:
    return str.__str__(text)


def _example(text: str, operation: str) -> str:
    return text.concrete(operation) if isinstance(text, SymbolicText) else text


def _apply(value: Any, function, *args) -> Any:
    return None if value is None else function(value, *args)


def _join(left: str, right: str) -> SymbolicText:
    parts = [p for p in (left, right) if isinstance(p, SymbolicText)]
    left_example, right_example = (
        p.example if isinstance(p, SymbolicText) else p for p in (left, right)
    )
    example = (
        None if left_example is None or right_example is None else left_example + right_example
    )
    values = tuple(v for p in parts for v in p.values)
    return SymbolicText(_plain(left) + _plain(right), example, values)


#: how an operation is named in messages
_DISPLAY = {
    "__lt__": "<",
    "__le__": "<=",
    "__gt__": ">",
    "__ge__": ">=",
    "__len__": "len()",
    "__getitem__": "indexing",
    "__iter__": "iteration",
    "__contains__": "in",
}


def _content_operation(name: str):
    method = getattr(str, name)
    display = _DISPLAY.get(name, f".{name}()")

    def operation(self, *args, **kwargs):
        args = tuple(_example(a, display) if isinstance(a, str) else a for a in args)
        return method(self.concrete(display), *args, **kwargs)

    operation.__name__ = name
    operation.__doc__ = f"``str.{name}`` on the example's text (fixes the values shown)."
    return operation


def _text_operation(name: str):
    method = getattr(str, name)

    def operation(self, *args, **kwargs):
        raw = tuple(_plain(a) if isinstance(a, SymbolicText) else a for a in args)
        examples = tuple(a.example if isinstance(a, SymbolicText) else a for a in args)
        values = tuple(v for a in args if isinstance(a, SymbolicText) for v in a.values)
        example = None if self.example is None or None in examples else self.example
        return self._derived(
            method(_plain(self), *raw, **kwargs),
            None if example is None else method(example, *examples, **kwargs),
            values,
        )

    operation.__name__ = name
    return operation


for _name in _CONTENT_OPERATIONS:
    setattr(SymbolicText, _name, _content_operation(_name))
for _name in _TEXT_OPERATIONS:
    setattr(SymbolicText, _name, _text_operation(_name))


# format specs: numeric ones for the example, their layout only for the symbolic text

_SPEC = re.compile(
    r"^(?:(?P<fill>.)?(?P<align>[<>=^]))?[+\- ]?z?#?(?P<zero>0)?(?P<width>\d+)?"
    r"[_,]?(?:\.\d+)?[bcdeEfFgGnosxX%]?$"
)


def _format_text(text: str, spec: str) -> str:
    """``format(text, spec)``, with a numeric spec (``5d``, ``.3f``) reduced to its layout."""
    text = _plain(text)
    try:
        return format(text, spec)
    except ValueError:
        pass
    match = _SPEC.match(spec)
    if match is None:
        return text
    align = match["align"] or ">"
    align = ">" if align == "=" else align
    fill = match["fill"] or ("0" if match["zero"] else " ")
    return format(text, f"{fill}{align}{match['width'] or ''}")


def _format(value: Any, spec: str) -> str | None:
    return None if value is None else format(value, spec)


def symbolic_text(proxy: Any, spec: str = "") -> str:
    """``str()``/``format()`` of a proxy of a symbolic scalar (see the module)."""
    tracer = proxy.tracer
    val = proxy.node.meta.get("val")
    text = tracer.dims.render(val)
    example = None
    if not tracer.dims.is_data_dependent(val):
        example = _format(tracer.dims.hint(val), spec)
    return SymbolicText(_format_text(text, spec), example, (proxy,))


def shape_text(shape: Sequence[Any], tracer: Any, spec: str = "") -> str:
    """``str()``/``format()`` of a shape holding symbolic dimensions (``torch.Size``'s
    text with the user's names)."""
    items = [symbolic_text(d) if hasattr(d, "node") else str(d) for d in shape]
    values = [v for item in items if isinstance(item, SymbolicText) for v in item.values]
    text = f"torch.Size([{', '.join(_plain(i) for i in items)}])"
    examples = [i.example if isinstance(i, SymbolicText) else i for i in items]
    known = [e for e in examples if e is not None]
    example = None if len(known) < len(examples) else f"torch.Size([{', '.join(known)}])"
    return SymbolicText(_format_text(text, spec), _format(example, spec), values)


__all__ = ["SymbolicText", "shape_text", "symbolic_text"]
