"""Argument kinds and forms for the direct lowering's rules.

The rules (:mod:`yobx.torch.onnx.direct_rules`, :mod:`yobx.torch.onnx.direct_nn_rules`)
only read argument kinds (tensor, Python number, int, symbolic int) and compare
plain constants: they never compare a symbolic size, so they add no guard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: the ``end`` torch's indexing gives a slice without one
INT64_MAX = 9223372036854775807

#: what an aten call is made of: the overload, positional and keyword arguments
AtenCall = tuple[torch._ops.OpOverload, tuple, dict]
#: a rule: the interpreted arguments of a node -> its aten call, or None (make_fx)
Rule = Callable[[tuple, dict], "AtenCall | None"]


def is_tensor(value: Any) -> bool:
    """A tensor (fake, in the lowering)."""
    return isinstance(value, torch.Tensor)


def is_optional_tensor(value: Any) -> bool:
    """None or a tensor (an optional bias, weight or mask)."""
    return value is None or isinstance(value, torch.Tensor)


def is_number(value: Any) -> bool:
    """A plain Python int or float (a bool changes the promotion, a symbolic scalar
    is recorded through its own node: both go through make_fx)."""
    return type(value) in (int, float)


def is_dim(value: Any) -> bool:
    """A plain Python int (a dimension index, a static size)."""
    return type(value) is int


def is_size(value: Any) -> bool:
    """An element of a shape argument: an int or a symbolic int (tracked by make_fx)."""
    return type(value) is int or isinstance(value, torch.SymInt)


def bind(args: tuple, kwargs: dict, names: tuple[str, ...], defaults: dict) -> dict | None:
    """Binds ``args``/``kwargs`` to ``names`` (Python's rules, without ``*args``);
    None when an argument is unknown, given twice or missing."""
    if len(args) > len(names):
        return None
    bound = dict(zip(names, args))
    for name, value in kwargs.items():
        if name not in names or name in bound:
            return None
        bound[name] = value
    for name in names:
        if name not in bound:
            if name not in defaults:
                return None
            bound[name] = defaults[name]
    return bound


def shape_arguments(args: tuple) -> list | None:
    """``x.view(2, 3)`` and ``x.view((2, 3))`` alike: the sizes as a list."""
    sizes = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
    sizes = list(sizes)
    return sizes if all(is_size(s) for s in sizes) else None


def is_default(value: Any, argument: Any) -> bool:
    """Whether ``value`` is the schema ``argument``'s default, compared only between
    plain constants (a tensor's ``!=`` is elementwise, a symbolic int's would guard);
    a list of ints is the default int when each of its items is (``padding=0`` of an
    ``int[2]``)."""
    if not argument.has_default_value():
        return False
    default = argument.default_value
    if value is None or default is None:
        return value is default
    plain = (int, float, bool, str)
    if isinstance(value, (list, tuple)):
        if not all(type(v) is int for v in value):
            return False
        if isinstance(default, (list, tuple)):
            return list(value) == list(default)
        return type(default) is int and all(v == default for v in value)
    return type(value) in plain and type(value) is type(default) and value == default


def trimmed(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> AtenCall:
    """Drops trailing positional arguments and keyword-only arguments at their schema
    default: make_fx records them so (``layer_norm(x, [4], w, b)`` without ``eps``)."""
    schema = op._schema.arguments
    positional = [a for a in schema if not a.kwarg_only]
    keyword_only = {a.name: a for a in schema if a.kwarg_only}
    args = list(args)
    while args and len(args) <= len(positional) and is_default(args[-1], positional[len(args) - 1]):
        args.pop()
    kwargs = {
        k: v
        for k, v in kwargs.items()
        if not (k in keyword_only and is_default(v, keyword_only[k]))
    }
    return op, tuple(args), kwargs


def per_dimension(value: Any, rank: int) -> list | None:
    """``3`` or ``(3, 3)`` as ``[3, 3]`` (what torch passes for an ``int[2]``)."""
    if is_dim(value):
        return [value] * rank
    if isinstance(value, (tuple, list)) and len(value) == rank and all(is_dim(v) for v in value):
        return list(value)
    return None
