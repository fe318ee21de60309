"""``__torch_function__`` of the tracer's proxies: torch.fx's, with a direct path.

torch.fx's ``Proxy.__torch_function__`` walks the arguments with pytree to find the
tracer, then asks ``torch.overrides.is_tensor_method_or_property``, which enters
``warnings.catch_warnings`` on every call: about a fifth of the cost of recording an
operation. :func:`proxy_torch_function` records the same node for the arguments
operations almost always get (atoms, tensors, proxies, flat tuples and lists of them)
and hands anything else to torch.fx's own method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx.proxy import Proxy

from ..node_arguments import ATOMIC_ARGUMENTS

#: torch.fx's method, for the arguments the direct path does not handle
_FX_TORCH_FUNCTION = Proxy.__dict__["__torch_function__"].__func__

#: argument types that are pytree leaves and never proxies (a slice holds no proxy
#: for pytree, which does not look inside it)
_ATOMS = ATOMIC_ARGUMENTS | {slice}

#: a function's ``__name__`` -> the node name torch.fx gives its calls (keyed by the
#: name, not the function: no reference kept to the callables)
_NODE_NAMES: dict[str, str] = {}

_UNHANDLED = object()


def proxy_torch_function(
    cls: type, orig_method: Callable, types: tuple, args: tuple | None, kwargs: dict | None
) -> Any:
    """What ``Proxy.__torch_function__`` records for ``orig_method(*args, **kwargs)``."""
    args = args if args else ()
    kwargs = kwargs if kwargs else {}
    tracer = _tracer_of(cls, args)
    if tracer is not _UNHANDLED and kwargs:
        other = _tracer_of(cls, tuple(kwargs.values()))
        if other is _UNHANDLED or (tracer is not None and other not in (None, tracer)):
            tracer = _UNHANDLED
        elif tracer is None:
            tracer = other
    if (
        tracer is _UNHANDLED
        or tracer is None
        or isinstance(orig_method, (torch._C.ScriptMethod, torch._ops.HigherOrderOperator))
    ):
        return _FX_TORCH_FUNCTION(cls, orig_method, types, args, kwargs)
    if _is_tensor_method(orig_method):
        return tracer.create_proxy("call_method", orig_method.__name__, args, kwargs)
    function_name = orig_method.__name__
    name = _NODE_NAMES.get(function_name)
    if name is None:
        name = tracer.graph._target_to_str(function_name)
        if len(_NODE_NAMES) < 4096:
            _NODE_NAMES[function_name] = name
    return tracer.create_proxy("call_function", orig_method, args, kwargs, name=name)


def _tracer_of(cls: type, values: tuple) -> Any:
    """The one tracer of the ``cls`` proxies among ``values`` (None without any), or
    ``_UNHANDLED`` for a value that needs pytree (or proxies of two tracers)."""
    tracer = None
    for value in values:
        kind = type(value)
        if kind in _ATOMS:
            continue
        if kind is tuple or kind is list:
            found = _tracer_of(cls, value) if _flat(value) else _UNHANDLED
        elif isinstance(value, Proxy):
            found = value.tracer if isinstance(value, cls) else None
        elif isinstance(value, torch.Tensor):
            continue
        else:
            return _UNHANDLED
        if found is _UNHANDLED:
            return _UNHANDLED
        if found is not None:
            if tracer is not None and found is not tracer:
                return _UNHANDLED
            tracer = found
    return tracer


def _flat(values: tuple | list) -> bool:
    """No container inside (a nested one goes to pytree)."""
    for value in values:
        kind = type(value)
        if kind is tuple or kind is list or kind is dict:
            return False
    return True


def _is_tensor_method(function: Any) -> bool:
    """``torch.overrides.is_tensor_method_or_property`` without its warnings block: the
    table of tensor methods is built once (:data:`_TENSOR_METHOD_TABLE`), the warnings
    only concern building it."""
    return function in _TENSOR_METHOD_TABLE or function.__name__ == "__get__"


# torch's own function builds the table inside its warnings block, once
torch.overrides.is_tensor_method_or_property(torch.Tensor.add)
#: torch's table of the functions it passes for tensor methods (cached by torch)
_TENSOR_METHOD_TABLE = torch.overrides._get_tensor_methods()
