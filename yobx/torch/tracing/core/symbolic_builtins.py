"""``int`` and ``float`` in the traced code keep dimensions symbolic.

``F.interpolate(x, size=(int(h // 2), int(w * 1.5)))`` or ``x.new_zeros(int(n // 2))``
ask Python for a number made from a dimension. The builtins can only return a real
``int``/``float``: the dimension would be fixed to its example size (torch.export fixes
it too). Inside the traced modules' code, the names ``int`` and ``float`` are replaced
for the duration of a trace (as ``len`` is, and as ``torch.fx.wrap`` does) by
:data:`traced_int` and :data:`traced_float`: called on a proxy of a dimension they
return a proxy of the same expression (``torch.sym_int``, ``torch.sym_float``), which
every torch function taking sizes accepts; called on anything else, they are the
builtins.

They stand for the builtins everywhere else the name is used: ``isinstance(v, int)``,
``issubclass``, ``x.to(int)`` (the graph records ``torch.int64``), ``int.from_bytes``,
``type(v) == int`` and the ``dtype=int`` of the tensor factories. Only an identity test
(``type(v) is int``) tells them apart, in the code of the traced modules while a trace
runs. A Python ``int`` that must be a real one (indexing a list) still asks for it
(``__index__``), with the usual decision on the example's sizes. ``range`` is replaced
too (:data:`traced_range`): a loop over a symbolic size is a loop region that can
become a scan (:mod:`.loops`); and ``list`` (:data:`traced_list`): ``list()`` of such a
range is a list as long as the size (:mod:`.range_lists`).
"""

from __future__ import annotations

import builtins
from typing import Any

import torch

from ..isolation.patch_window import in_patch_window
from .loops import symbolic_range
from .range_lists import SymbolicRangeList, range_list

_INT = builtins.int
_FLOAT = builtins.float
_RANGE = builtins.range
_LIST = builtins.list


class _SymbolicBuiltin(type):
    """Metaclass of :data:`traced_int` / :data:`traced_float`: the class answers as the
    builtin it replaces (``__yobx_builtin__``) except when called on a scalar proxy."""

    __yobx_builtin__: type

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        builtin = cls.__yobx_builtin__
        if len(args) == 1 and not kwargs and in_patch_window():
            symbolic = _symbolic_conversion(builtin, args[0])
            if symbolic is not None:
                return symbolic
        return builtin(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls.__yobx_builtin__)

    def __subclasscheck__(cls, subclass: Any) -> bool:
        return issubclass(subclass, cls.__yobx_builtin__)

    # ``type(v) == int`` and ``{int: torch.int64}[int]`` hold as for the builtin
    def __eq__(cls, other: Any) -> bool:
        return other is cls or other is cls.__yobx_builtin__

    def __hash__(cls) -> int:
        return hash(cls.__yobx_builtin__)

    def __getattr__(cls, name: str) -> Any:
        # int.from_bytes, float.fromhex, int.__name__...
        return getattr(cls.__yobx_builtin__, name)

    def __repr__(cls) -> str:
        return repr(cls.__yobx_builtin__)


def _symbolic_conversion(builtin: type, value: Any) -> Any:
    """The proxy of ``builtin(value)`` for a proxy of a symbolic int or float, or of a
    one-element tensor (``int(mask.sum())`` is ``mask.sum().item()``, as in eager and
    torch.export), else None (a bool stays a decision: ``int(n > 4)`` is a branch on
    the sizes)."""
    from .proxies import CustomProxy, CustomProxyFloat, CustomProxyInt, _ScalarProxy

    if isinstance(value, CustomProxy) and not isinstance(value, _ScalarProxy):
        # a tensor: its value, a number read from the data (see CustomProxy.item)
        value = value.item()
        symbolic = _symbolic_conversion(builtin, value)
        return symbolic if symbolic is not None else builtin(value)
    if isinstance(value, CustomProxyInt):
        if builtin is _INT:
            return value
        return value.tracer.create_proxy("call_function", torch.sym_float, (value,), {})
    if isinstance(value, CustomProxyFloat):
        if builtin is _FLOAT:
            return value
        # truncation toward zero, as int() of a float
        return value.tracer.create_proxy("call_function", torch.sym_int, (value,), {})
    return None


class traced_int(_INT, metaclass=_SymbolicBuiltin):  # lower case: it stands for `int`
    """``int`` in the traced code: ``int(proxy of a dimension)`` stays symbolic."""

    __yobx_builtin__ = _INT
    __yobx_any_thread__ = True  # installed without a thread gate: it is one already


class traced_float(_FLOAT, metaclass=_SymbolicBuiltin):  # it stands for `float`
    """``float`` in the traced code: ``float(proxy of a dimension)`` stays symbolic."""

    __yobx_builtin__ = _FLOAT
    __yobx_any_thread__ = True


class _SymbolicRangeType(_SymbolicBuiltin):
    """Metaclass of :data:`traced_range`: a range over a symbolic size is a loop that
    may become a scan (see :mod:`.loops`)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if not kwargs:
            loop = symbolic_range(*args)
            if loop is not None:
                return loop
        return _RANGE(*args, **kwargs)


class traced_range(metaclass=_SymbolicRangeType):  # it stands for `range`
    """``range`` in the traced code: ``for i in range(x.shape[1])`` is a loop region
    (see :mod:`.loops`) instead of a fixed number of steps."""

    __yobx_builtin__ = _RANGE


class _SymbolicListType(_SymbolicBuiltin):
    """Metaclass of :data:`traced_list`: ``list()`` of a range over a symbolic size is
    a list as long as the size (see :mod:`.range_lists`), which ``isinstance(v, list)``
    takes for a list."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs:
            values = range_list(args[0])
            if values is not None:
                return values
        return _LIST(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _LIST) or type(obj) is SymbolicRangeList


class traced_list(_LIST, metaclass=_SymbolicListType):  # it stands for `list`
    """``list`` in the traced code: ``list(range(x.shape[1]))`` keeps its length
    symbolic (see :mod:`.range_lists`); ``list[int]`` is the builtin's alias."""

    __yobx_builtin__ = _LIST
    __yobx_any_thread__ = True  # the builtin for anything but a traced range

    def __class_getitem__(cls, item: Any) -> Any:
        return _LIST[item]


#: name in the traced code's globals -> its replacement while a trace runs
TRACED_BUILTINS: dict[str, type] = {
    "int": traced_int,
    "float": traced_float,
    "range": traced_range,
    "list": traced_list,
}


def as_builtin(value: Any) -> Any:
    """The builtin type that ``value`` stands for (``value`` itself for anything else):
    torch takes ``dtype=int`` only from the builtin."""
    return getattr(value, "__yobx_builtin__", value) if type(value) is _SymbolicBuiltin else value
