"""Proxies that know the (fake) value of the node they stand for.

Every proxy created by :class:`yobx.torch.tracing.CustomTracer` wraps a node whose
``meta["val"]`` holds a fake tensor, a SymInt/SymFloat/SymBool, or a tuple of those.
The proxy uses it to behave like the value would: a tensor proxy answers ``.shape``,
``.dtype``, ``len()`` and ``isinstance(x, torch.Tensor)``; an integer proxy decides
comparisons soundly through the tracer.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.fx.proxy import Attribute, Proxy

from ..errors import TracingError
from ..symbolic.symbolic_text import shape_text, symbolic_text
from .proxy_dispatch import proxy_torch_function

if TYPE_CHECKING:
    # the contract, not the tracer's module: the tracer imports this one
    from .tracer_contract import TracerHost

# torch.cat as imported, not the recording replacement installed while tracing
_TORCH_CAT = torch.cat


def find_proxy(*values: Any) -> Proxy | None:
    """Returns the first proxy found in (nested tuples, lists, dicts of) ``values``,
    depth first, in order."""
    stack = list(reversed(values))
    while stack:
        v = stack.pop()
        if isinstance(v, Proxy):
            return v
        if isinstance(v, (tuple, list)):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        elif isinstance(v, slice):
            stack.extend((v.step, v.stop, v.start))
    return None


class CustomProxy(Proxy):
    """Proxy of a tensor (or of any non-scalar value) whose node carries ``meta["val"]``."""

    #: the tracer recording the node (torch.fx types it as any tracer)
    tracer: TracerHost

    @classmethod
    def __torch_function__(cls, orig_method, types, args=None, kwargs=None):
        """torch.fx's, with a direct path for plain arguments (see :mod:`.proxy_dispatch`)."""
        return proxy_torch_function(cls, orig_method, types, args, kwargs)

    @property
    def val(self) -> Any:
        """The fake value of the node (FakeTensor, SymInt, tuple...)."""
        return self.node.meta.get("val")

    @property
    def known(self) -> bool:
        """Whether the value is known (False for an input traced without an example and
        what it computes, as with torch.fx)."""
        return "val" in self.node.meta

    @staticmethod
    def cat(tensors: Any, dim: int = 0) -> Any:
        """``torch.cat(tensors, dim)`` recorded in the graph of the first proxy found."""
        proxy = find_proxy(tensors)
        if proxy is None:
            return _TORCH_CAT(tensors, dim)
        return proxy.tracer.create_proxy("call_function", _TORCH_CAT, (tensors,), {"dim": dim})

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
        fields = getattr(type(val), "__match_args__", ()) if isinstance(val, tuple) else ()
        if name in fields:
            # a field of a named tuple (``x.topk(k).values``, ``x.max(0).indices``): the
            # item it names, a proxy of what it holds as ``t[0]`` would be (``len``,
            # ``isinstance`` and the passes then see a tensor, not an attribute)
            return operator.getitem(self, fields.index(name))
        return CustomAttribute(self, name)

    def size(self, dim: int | None = None) -> Any:
        """Same as ``torch.Tensor.size``: static dimensions are ints, dynamic ones
        :class:`CustomProxyInt`, the whole shape a ``torch.Size`` or a
        :class:`CustomProxyShape`; a node when the value is unknown."""
        if not self.known:
            args = (self,) if dim is None else (self, dim)
            return self.tracer.create_proxy("call_method", "size", args, {})
        shape = self.tracer.shape_of(self)
        return shape if dim is None else shape[dim]

    def dim(self) -> Any:
        """Rank of the tensor: an int (always static), a node when the value is
        unknown."""
        if not self.known:
            return self.tracer.create_proxy("call_method", "dim", (self,), {})
        return self.val.dim()

    def numel(self) -> Any:
        """Number of elements: an int, a :class:`CustomProxyInt` for dynamic shapes
        (a node when the value is unknown)."""
        return self.tracer.create_proxy("call_method", "numel", (self,), {})

    def __len__(self) -> int:
        if not self.known:
            raise self.tracer.missing_example_error(self, "len() needs a Python int:")
        length = self.length()
        if isinstance(length, int):
            return length
        # Python requires an int here: the dimension would become a constant
        return int(self.tracer.python_number(length, "len() (x.shape[0] would stay symbolic)"))

    def length(self) -> Any:
        """``len(x)``: an int when static, the symbolic first dimension otherwise.

        Inside the traced code, ``len`` itself is replaced so that ``n = len(x)`` stays
        symbolic (as ``torch.fx.wrap("len")`` would); Python's ``__len__`` must return
        an int.
        """
        if not self.known:
            return self.tracer.create_proxy("call_function", len, (self,), {})
        val = self.val
        if isinstance(val, (tuple, list)):
            return len(val)
        if isinstance(val, torch.Tensor):
            if val.dim() == 0:
                raise TypeError("len() of a 0-d tensor")
            return self.tracer.shape_of(self)[0]
        raise TracingError.at(self.tracer.location(), f"len() of {type(val).__name__}")

    def __iter__(self):
        if not self.known:
            raise self.tracer.missing_example_error(self, "iterating over a value")
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
        if not self.known:
            raise self.tracer.missing_example_error(self, "`in`")
        val = self.val
        if isinstance(val, (tuple, list)):
            return any(item is v for v in val)
        raise TracingError.at(self.tracer.location(), "`in` on a traced tensor is data-dependent")


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
    """Proxy of a parameter or a buffer (a ``get_attr`` node); its shape is static.

    Shape questions are answered from the parameter itself, also for a proxy built by
    hand outside a trace.

    :param tracer: the tracer owning the graph
    :param node: the ``get_attr`` node
    :param name: the attribute's qualified name
    :param param: the parameter or buffer
    """

    def __init__(self, tracer, node, name: str, param: torch.Tensor):
        super().__init__(node, tracer)
        self.param = param
        self.name = name

    @property
    def shape(self) -> torch.Size:
        """The parameter's shape."""
        return self.param.shape

    @property
    def ndim(self) -> int:
        """The parameter's rank."""
        return self.param.dim()

    @property
    def dtype(self) -> torch.dtype:
        """The parameter's dtype."""
        return self.param.dtype

    def size(self, dim: int | None = None) -> Any:
        """The parameter's shape, or one of its dimensions."""
        return self.param.shape if dim is None else self.param.shape[dim]

    def dim(self) -> int:
        """The parameter's rank."""
        return self.param.dim()

    def numel(self) -> int:
        """The parameter's number of elements."""
        return self.param.numel()

    def nelement(self) -> int:
        """The parameter's number of elements."""
        return self.param.numel()

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

    # round(h * 0.75), math.ceil(n / p): symbolic, as torch's SymFloat computes them
    # (math.ceil reaches here when torch.fx did not autowrap it in the caller's globals)
    def __round__(self, ndigits: int | None = None):
        return self._call(round, *(() if ndigits is None else (ndigits,)))

    def __ceil__(self):
        return self._call(math.ceil)

    def __floor__(self):
        return self._call(math.floor)

    def __trunc__(self):
        return self._call(math.trunc)

    def _call(self, function, *args):
        return self.tracer.create_proxy("call_function", function, (self, *args), {})

    # np.sqrt(n / d) (Cosmos' position norm): numpy hands a number it does not know to
    # this hook; without it, it called the proxy's ``sqrt`` method, which fails
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        function = _UFUNCS.get(ufunc.__name__)
        if method != "__call__" or kwargs or function is None:
            # anything else is computed by numpy on the example's value: the value is
            # fixed as float() or int() fixes it (refused for a dimension declared
            # dynamic, with the user's line)
            plain = [_example_number(i) if isinstance(i, _ScalarProxy) else i for i in inputs]
            return getattr(ufunc, method)(*plain, **kwargs)
        return self.tracer.create_proxy("call_function", function, inputs, {})

    def __len__(self) -> int:
        raise TypeError(f"object of type {type(self).__name__} has no len()")

    def __iter__(self):
        raise TypeError(f"{type(self).__name__} is not iterable")

    def __hash__(self) -> int:
        return id(self)

    # `seq_len == self.cached_len` while the cache is empty: a number never equals None,
    # a string or a list, as Python answers (no node: nothing to record or decide)
    def __eq__(self, other):
        if _not_a_number(other):
            return False
        return super().__eq__(other)

    def __ne__(self, other):
        if _not_a_number(other):
            return True
        return super().__ne__(other)

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


#: numpy's elementwise functions on a number -> the Python function the tracer keeps
#: symbolic (``math.sqrt`` becomes ``torch._sym_sqrt`` on a symbolic number)
_UFUNCS: dict[str, Any] = {
    **{
        name: getattr(math, name)
        for name in ("sqrt", "exp", "log", "log2", "sin", "cos", "tan", "sinh", "cosh", "tanh")
    },
    "arcsin": math.asin,
    "arccos": math.acos,
    "arctan": math.atan,
    "floor": math.floor,
    "ceil": math.ceil,
    "trunc": math.trunc,
    "absolute": operator.abs,
    "negative": operator.neg,
    "add": operator.add,
    "subtract": operator.sub,
    "multiply": operator.mul,
    "true_divide": operator.truediv,
    "divide": operator.truediv,
    "floor_divide": operator.floordiv,
    "power": operator.pow,
    "maximum": torch.sym_max,
    "minimum": torch.sym_min,
}


def _example_number(proxy: _ScalarProxy) -> Any:
    if isinstance(proxy, CustomProxyBool):
        return bool(proxy)
    return int(proxy) if isinstance(proxy, CustomProxyInt) else float(proxy)


def _not_a_number(value: Any) -> bool:
    """Whether ``value`` is neither a number, a symbolic number, a tensor nor a proxy:
    what a number compares equal to by identity only."""
    if isinstance(value, Proxy):
        # apart: model code's isinstance answers for a proxy's value when the classes
        # include torch.Tensor (a proxy of a size is no tensor)
        return False
    return not isinstance(
        value, (numbers.Number, torch.SymInt, torch.SymFloat, torch.SymBool, torch.Tensor)
    )


class CustomProxyInt(_ScalarProxy):
    """Proxy of a symbolic integer (a dynamic dimension or an expression of some).

    Inside a trace its node carries a SymInt and comparisons are decided soundly by the
    tracer. A proxy built by hand on a node without value says what is known of it:

    :param node: the node
    :param tracer: the tracer owning the graph
    :param concrete_val: the value on the example inputs, when known
    :param only_positive: the value is at least 1 (a size that is never empty)
    :param can_be_null: the value may be 0

    With no value on the node, a comparison with a number these facts settle is a
    Python bool (``n > 0``, ``n >= 1`` and ``n != 0`` are True for ``only_positive``;
    ``n == 0`` is False unless ``can_be_null``; ``n < 0`` is always False); any other
    comparison is a node, as in torch.fx.
    """

    def __init__(
        self,
        node,
        tracer=None,
        concrete_val: int | None = None,
        only_positive: bool = False,
        can_be_null: bool = True,
    ):
        super().__init__(node, tracer)
        self._concrete_val = concrete_val
        self.only_positive = only_positive
        self.can_be_null = can_be_null and not only_positive

    @property
    def concrete_val(self) -> int | None:
        """The value on the example inputs (None when unknown)."""
        val = self.val
        if isinstance(val, torch.SymInt):
            return int(val.node.hint) if val.node.hint is not None else None
        if isinstance(val, int):
            return val
        return self._concrete_val

    def _settled(self, op: str, other: Any) -> bool | None:
        """A comparison with a number decided by ``only_positive``/``can_be_null``
        (the value is an integer, at least 0, at least 1 when it cannot be null)."""
        if self.known or not isinstance(other, (int, float)) or isinstance(other, bool):
            return None
        low = 0 if self.can_be_null else 1
        if op in ("==", "!="):
            if other < low or other != int(other):
                return op == "!="
            return None
        below = {"<": other <= low, "<=": other < low}
        above = {">": other < low, ">=": other <= low}
        if op in below:
            return False if below[op] else None
        return True if above[op] else None

    def __eq__(self, other):
        settled = self._settled("==", other)
        return super().__eq__(other) if settled is None else settled

    def __ne__(self, other):
        settled = self._settled("!=", other)
        return super().__ne__(other) if settled is None else settled

    def __lt__(self, other):
        settled = self._settled("<", other)
        return super().__lt__(other) if settled is None else settled

    def __le__(self, other):
        settled = self._settled("<=", other)
        return super().__le__(other) if settled is None else settled

    def __gt__(self, other):
        settled = self._settled(">", other)
        return super().__gt__(other) if settled is None else settled

    def __ge__(self, other):
        settled = self._settled(">=", other)
        return super().__ge__(other) if settled is None else settled

    # `[0] * batch_size` (Chroma): a list as long as a size (see loops.SymbolicRepeat);
    # Python asks the integer's __rmul__ before repeating the list
    def __mul__(self, other):
        if type(other) in (list, tuple):
            return _repeat(self, other)
        return super().__mul__(other)

    def __rmul__(self, other):
        if type(other) in (list, tuple):
            return _repeat(self, other)
        return super().__rmul__(other)

    __hash__ = _ScalarProxy.__hash__


def _repeat(count: CustomProxyInt, items: list | tuple) -> Any:
    if not items:
        return type(items)()
    return count.tracer.repeated_list(items, count)


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

    #: the tracer of the proxies it holds (None: a shape of static sizes only)
    tracer: TracerHost | None

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

    @classmethod
    def from_proxy(cls, proxy: Any) -> CustomProxyShape | torch.Size:
        """The shape of a traced tensor (``torch.Size`` when static), or the items of a
        traced shape (the value of ``x.size()``) as a :class:`CustomProxyShape`."""
        if isinstance(proxy, CustomProxyShape):
            return proxy
        if isinstance(proxy, torch.Size):
            return proxy
        val = proxy.node.meta.get("val") if isinstance(proxy, Proxy) else None
        if isinstance(val, torch.Tensor):
            return proxy.tracer.shape_of(proxy)
        if isinstance(val, (tuple, list, torch.Size)):
            return cls([proxy[i] for i in range(len(val))], proxy.tracer)
        where = proxy.tracer.location() if isinstance(proxy, CustomProxy) else "from_proxy"
        raise TracingError.at(
            where,
            f"CustomProxyShape.from_proxy needs the proxy of a traced tensor or "
            f"shape, got {type(val if isinstance(proxy, Proxy) else proxy).__name__}",
        )

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
    """Attribute of a proxy whose node is created on first use: a method (``x.add_``,
    recorded as ``call_method`` when called), or any attribute of a value without a
    fake value (tensor properties such as ``x.T`` of a known tensor are nodes at once).

    :param root: the proxy the attribute is read from
    :param attr: the attribute's name
    """

    @property
    def node(self):
        """The ``getattr`` node, created when first asked for."""
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
        """The fake value of the ``getattr`` node (creates the node)."""
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
