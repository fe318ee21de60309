"""Proxies that know the (fake) value of the node they stand for.

Every proxy created by :class:`yobx.torch.tracing.CustomTracer` wraps a node whose
``meta["val"]`` holds a fake tensor, a SymInt/SymFloat/SymBool, or a tuple of those.
The proxy uses it to behave like the value would: a tensor proxy answers ``.shape``,
``.dtype``, ``len()`` and ``isinstance(x, torch.Tensor)``; an integer proxy decides
comparisons soundly through the tracer.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch.fx.proxy import Attribute, Proxy, TraceError

from .symbolic_text import shape_text, symbolic_text


class CustomProxy(Proxy):
    """Proxy of a tensor (or of any non-scalar value) whose node carries ``meta["val"]``."""

    @property
    def val(self) -> Any:
        """The fake value of the node (FakeTensor, SymInt, tuple...)."""
        return self.node.meta.get("val")

    def __getattr__(self, name: str) -> Any:
        val = self.node.meta.get("val")
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if isinstance(val, torch.Tensor):
            if name == "shape":
                return self.tracer.shape_of(self)
            if name in _STATIC_TENSOR_ATTRIBUTES:
                return getattr(val, name)
            descriptor = getattr(torch.Tensor, name, None)
            if descriptor is not None and not callable(descriptor):
                # a property (x.T, x.is_nested, x.real): computed now, so that
                # constants (flags) are plain Python values and tensors get a node
                return self.tracer.create_proxy("call_function", getattr, (self, name), {})
        return CustomAttribute(self, name)

    def size(self, dim: int | None = None) -> Any:
        """Same as ``torch.Tensor.size``: static dimensions are ints."""
        shape = self.tracer.shape_of(self)
        return shape if dim is None else shape[dim]

    def dim(self) -> int:
        """Rank of the tensor (always static)."""
        return self.val.dim()

    def __len__(self) -> int:
        length = self.length()
        if isinstance(length, int):
            return length
        # Python requires an int here: the dimension would become a constant
        return self.tracer.python_number(length, "len() (x.shape[0] would stay symbolic)")

    def length(self) -> Any:
        """``len(x)``: an int when static, the symbolic first dimension otherwise.

        Inside the traced code, ``len`` itself is replaced so that ``n = len(x)`` stays
        symbolic (as ``torch.fx.wrap("len")`` would); Python's ``__len__`` must return
        an int.
        """
        val = self.val
        if isinstance(val, (tuple, list)):
            return len(val)
        if isinstance(val, torch.Tensor):
            if val.dim() == 0:
                raise TypeError("len() of a 0-d tensor")
            return self.tracer.shape_of(self)[0]
        raise TraceError(f"{self.tracer.location()}: len() of {type(val).__name__}")

    def __iter__(self):
        val = self.val
        if isinstance(val, (tuple, list)):
            return iter([self[i] for i in range(len(val))])
        if isinstance(val, torch.Tensor):
            n = len(self)
            return iter([self[i] for i in range(n)])
        return super().__iter__()

    def __bool__(self) -> bool:
        return self.tracer.to_bool(self)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})

    def __contains__(self, item: Any) -> bool:
        val = self.val
        if isinstance(val, (tuple, list)):
            return any(item is v for v in val)
        raise TraceError(f"{self.tracer.location()}: `in` on a traced tensor is data-dependent")


# In-place operators: Python falls back to ``x = x + y`` when ``__iadd__`` is missing,
# which would lose the mutation of ``x`` (and of every view of it). Record them as
# ``operator.iadd`` & co. so that the graph keeps eager semantics.
def _make_inplace(op):
    def impl(self, other):
        return self.tracer.create_proxy("call_function", op, (self, other), {})

    impl.__name__ = op.__name__
    return impl


#: Python's augmented assignments, recorded as ``operator.iadd`` & co.
INPLACE_OPERATORS = tuple(
    getattr(operator, name)
    for name in (
        "iadd",
        "isub",
        "imul",
        "itruediv",
        "ifloordiv",
        "imod",
        "ipow",
        "iand",
        "ior",
        "ixor",
        "ilshift",
        "irshift",
        "imatmul",
    )
)

for _op in INPLACE_OPERATORS:
    setattr(CustomProxy, f"__{_op.__name__}__", _make_inplace(_op))

_STATIC_TENSOR_ATTRIBUTES = frozenset(
    {
        "dtype",
        "device",
        "ndim",
        "is_cuda",
        "is_cpu",
        "is_sparse",
        "is_quantized",
        "is_meta",
        "layout",
        "is_floating_point",
        "is_complex",
        "requires_grad",
        "is_leaf",
        "itemsize",
    }
)


class CustomParameterProxy(CustomProxy):
    """Proxy of a parameter or a buffer (a ``get_attr`` node); its shape is static."""

    def __init__(self, tracer, node, name: str, param: torch.Tensor):
        super().__init__(node, tracer)
        self.param = param
        self.name = name

    def __repr__(self) -> str:
        return f"CustomParameterProxy({self.name})"


class _ScalarProxy(CustomProxy):
    """Base of proxies of Python scalars (SymInt, SymFloat, SymBool)."""

    def __bool__(self) -> bool:
        return self.tracer.to_bool(self)

    def __index__(self) -> int:
        return self.tracer.to_int(self)

    def __int__(self) -> int:
        return self.tracer.to_int(self)

    def __float__(self) -> float:
        return float(self.tracer.to_int(self))

    def __len__(self) -> int:
        raise TypeError(f"object of type {type(self).__name__} has no len()")

    def __iter__(self):
        raise TypeError(f"{type(self).__name__} is not iterable")

    def __hash__(self) -> int:
        return id(self)

    # text: the expression in the user's names, fixed only if used as a value
    def __str__(self) -> str:
        return symbolic_text(self)

    def __repr__(self) -> str:
        return symbolic_text(self)

    def __format__(self, spec: str) -> str:
        return symbolic_text(self, spec)

    # x += 1 on a dimension is a new value, never a mutation.
    def __iadd__(self, other):
        return self + other

    def __isub__(self, other):
        return self - other

    def __imul__(self, other):
        return self * other

    def __ifloordiv__(self, other):
        return self // other


class CustomProxyInt(_ScalarProxy):
    """Proxy of a symbolic integer (a dynamic dimension or an expression of some)."""


class CustomProxyFloat(_ScalarProxy):
    """Proxy of a symbolic float."""

    def __float__(self) -> float:
        return self.tracer.to_float(self)


class CustomProxyBool(_ScalarProxy):
    """Proxy of a symbolic boolean (a comparison of dimensions)."""


class CustomProxyShape(tuple):
    """The shape of a tensor with dynamic dimensions: a tuple of ints and CustomProxyInt.

    It behaves like ``torch.Size``: ``len``, iteration, slicing, ``*shape``,
    concatenation with tuples and lists, ``numel()``.
    """

    def __new__(cls, items, tracer=None):
        self = super().__new__(cls, items)
        self.tracer = tracer
        return self

    def __getitem__(self, key):
        item = tuple.__getitem__(self, key)
        if isinstance(key, slice):
            return CustomProxyShape(item, self.tracer)
        return item

    def __add__(self, other):
        return CustomProxyShape(tuple(self) + tuple(other), self.tracer)

    def __radd__(self, other):
        return CustomProxyShape(tuple(other) + tuple(self), self.tracer)

    def numel(self):
        """Product of the dimensions (symbolic when one is dynamic)."""
        result = 1
        for d in self:
            result = result * d
        return result

    # text: torch.Size's with the user's names, fixed only if used as a value
    def __str__(self) -> str:
        return self.__format__("")

    def __repr__(self) -> str:
        return self.__format__("")

    def __format__(self, spec: str) -> str:
        if self.tracer is None:
            return format(tuple(self), spec)
        return shape_text(self, self.tracer, spec)


class CustomAttribute(Attribute):
    """Attribute of a proxy (``x.T``, ``x.add_``...) whose node is created on first use."""

    @property
    def node(self):
        if self._node is None:
            self._node = self.tracer.create_proxy(
                "call_function", getattr, (self.root, self.attr), {}
            ).node
        return self._node

    def __call__(self, *args, **kwargs):
        return self.tracer.create_proxy("call_method", self.attr, (self.root, *args), kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self.tracer.proxy(self.node).__getattr__(name)

    @property
    def val(self) -> Any:
        return self.node.meta.get("val")


def proxy_class_for(val: Any) -> type[CustomProxy]:
    """The proxy class matching a fake value."""
    if isinstance(val, torch.SymBool):
        return CustomProxyBool
    if isinstance(val, torch.SymInt):
        return CustomProxyInt
    if isinstance(val, torch.SymFloat):
        return CustomProxyFloat
    return CustomProxy
