"""Classification of FX nodes shared by the passes: tensor-ness, aliasing, in-place forms.

Everything here answers questions conservatively: ``None`` (or an *opaque* kind) means
"cannot be proven", and the passes treat it as such instead of guessing.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

aten = torch.ops.aten
INT64_MAX = 9223372036854775807

# torch.Tensor methods and functions returning something that is not a tensor.
NON_TENSOR_METHODS = frozenset(
    {
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "item",
        "tolist",
        "stride",
        "storage_offset",
        "element_size",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "data_ptr",
        "get_device",
        "__len__",
        "sym_size",
        "sym_numel",
        "sym_stride",
    }
)
NON_TENSOR_ATTRIBUTES = frozenset(
    {"shape", "dtype", "device", "ndim", "is_cuda", "layout", "requires_grad", "names"}
)
VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH"})

# Functions whose schema claims a fresh result but which may return their input itself.
ALIASING_DESPITE_SCHEMA = frozenset(
    {
        "dropout",
        "feature_dropout",
        "alpha_dropout",
        "feature_alpha_dropout",
        "dropout1d",
        "dropout2d",
        "dropout3d",
        "type_as",
        "einsum",
        "atleast_1d",
        "atleast_2d",
        "atleast_3d",
    }
)

# In-place methods which do not change values but metadata or autograd state.
NON_VALUE_INPLACE = frozenset({"requires_grad_", "share_memory_", "retain_grad_", "detach_"})
# In-place methods changing the tensor's metadata (shape, strides, storage).
METADATA_INPLACE = frozenset(
    {
        "squeeze_",
        "unsqueeze_",
        "transpose_",
        "t_",
        "swapdims_",
        "swapaxes_",
        "as_strided_",
        "resize_",
        "resize_as_",
        "set_",
    }
)
# Functional twins whose result keeps the dtype of ``self`` whatever the other arguments.
DTYPE_PRESERVING = frozenset(
    {
        "copy",
        "fill",
        "zero",
        "index_put",
        "masked_fill",
        "masked_scatter",
        "index_fill",
        "index_copy",
        "scatter",
        "scatter_add",
        "scatter_reduce",
        "index_add",
        "clamp",
        "clip",
        "slice_scatter",
        "select_scatter",
    }
)

_INPLACE_OPERATORS = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod,
    operator.ipow: operator.pow,
    operator.iand: operator.and_,
    operator.ior: operator.or_,
    operator.ixor: operator.xor,
    operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
    operator.imatmul: operator.matmul,
}
_FUNCTIONAL_OPERATORS = frozenset(
    {
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.floordiv,
        operator.mod,
        operator.pow,
        operator.and_,
        operator.or_,
        operator.xor,
        operator.lshift,
        operator.rshift,
        operator.matmul,
        operator.neg,
        operator.invert,
        operator.pos,
        operator.abs,
        operator.eq,
        operator.ne,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
    }
)

# Activation modules with an ``inplace`` flag and their functional form.
_INPLACE_MODULES = {
    torch.nn.ReLU: lambda m: (torch.nn.functional.relu, ()),
    torch.nn.ReLU6: lambda m: (torch.nn.functional.relu6, ()),
    torch.nn.LeakyReLU: lambda m: (torch.nn.functional.leaky_relu, (m.negative_slope,)),
    torch.nn.ELU: lambda m: (torch.nn.functional.elu, (m.alpha,)),
    torch.nn.CELU: lambda m: (torch.nn.functional.celu, (m.alpha,)),
    torch.nn.SELU: lambda m: (torch.nn.functional.selu, ()),
    torch.nn.SiLU: lambda m: (torch.nn.functional.silu, ()),
    torch.nn.Mish: lambda m: (torch.nn.functional.mish, ()),
    torch.nn.Hardswish: lambda m: (torch.nn.functional.hardswish, ()),
    torch.nn.Hardsigmoid: lambda m: (torch.nn.functional.hardsigmoid, ()),
    torch.nn.Hardtanh: lambda m: (torch.nn.functional.hardtanh, (m.min_val, m.max_val)),
    torch.nn.Threshold: lambda m: (torch.nn.functional.threshold, (m.threshold, m.value)),
}
# Modules always returning a new tensor.
_FRESH_MODULES = (
    torch.nn.Linear,
    torch.nn.Bilinear,
    torch.nn.modules.conv._ConvNd,
    torch.nn.modules.batchnorm._NormBase,
    torch.nn.LayerNorm,
    torch.nn.GroupNorm,
    torch.nn.RMSNorm,
    torch.nn.Embedding,
    torch.nn.GELU,
    torch.nn.Tanh,
    torch.nn.Sigmoid,
    torch.nn.Softmax,
    torch.nn.LogSoftmax,
    torch.nn.Softplus,
    torch.nn.modules.pooling._MaxPoolNd,
    torch.nn.modules.pooling._AvgPoolNd,
)


def example_value(node: Any) -> Any:
    """Returns the value recorded on a node by the tracer (``meta["val"]``) or None."""
    if not isinstance(node, Node):
        return node
    for key in ("val", "example_value"):
        if key in node.meta:
            return node.meta[key]
    return None


def source_line(node: Node) -> str:
    """Returns the user's source line a node comes from, as recorded by the tracer."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return "unknown source line (the tracer did not record a stack trace)"
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    files = [i for i, line in enumerate(lines) if line.startswith("File ")]
    if not files:
        return lines[-1]
    last = files[-1]
    return " ".join(lines[last : last + 2])


def describe(node: Node) -> str:
    """Returns a one-line description of a node for error messages."""
    return f"node {node.name!r} ({node.op} {target_name(node)}) at {source_line(node)}"


def target_name(node: Node) -> str:
    """Returns a readable name for the target of a node."""
    target = node.target
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    return f"{module}.{name}" if module else name


def _callable_name(node: Node) -> str | None:
    """Name used to look an operation up among aten ops, or None for non-torch callables."""
    target = node.target
    if node.op == "call_method":
        return target
    if node.op != "call_function":
        return None
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.split("::")[-1]
    name = getattr(target, "__name__", None)
    if name is None:
        return None
    if getattr(torch.Tensor, name, None) is target:
        return name
    if getattr(torch, name, None) is target or getattr(torch.nn.functional, name, None) is target:
        return name
    if getattr(torch.special, name, None) is target or getattr(torch.linalg, name, None) is target:
        return name
    return None


@functools.cache
def _aten_packet(name: str) -> Any:
    try:
        return getattr(aten, name)
    except (AttributeError, RuntimeError):
        return None


def _overload_schemas(packet: Any) -> list[Any]:
    """Schemas of the functional overloads taking a tensor (or tensors) first."""
    schemas = []
    for name in packet.overloads():
        schema = getattr(packet, name)._schema
        if schema.is_mutable or not schema.arguments:
            continue
        if str(schema.arguments[0].type).startswith("Tensor"):
            schemas.append(schema)
    return schemas


@functools.cache
def aten_returns_fresh(name: str) -> bool | None:
    """Tells if every overload of ``aten.<name>`` returns new tensors (None if unknown)."""
    if name in ALIASING_DESPITE_SCHEMA:
        return False
    packet = _aten_packet(name)
    if packet is None:
        return None
    schemas = _overload_schemas(packet)
    if not schemas:
        return None
    return all(r.alias_info is None for s in schemas for r in s.returns)


@functools.cache
def aten_returns_tensor(name: str) -> bool | None:
    """Tells if every overload of ``aten.<name>`` returns a single tensor (None if unknown)."""
    packet = _aten_packet(name)
    if packet is None:
        return None
    schemas = _overload_schemas(packet)
    single = [len(s.returns) == 1 and str(s.returns[0].type) == "Tensor" for s in schemas]
    if not single:
        return None
    if all(single):
        return True
    # overloads disagree (torch.max(x) vs torch.max(x, 0)): unknown without meta["val"]
    return False if not any(single) else None


def is_tensor(node: Any) -> bool | None:
    """Tells if a node produces a tensor: True, False, or None when it cannot be proven."""
    if not isinstance(node, Node):
        return isinstance(node, torch.Tensor)
    val = example_value(node)
    if val is not None:
        return isinstance(val, torch.Tensor)
    if "tensor_meta" in node.meta and node.meta["tensor_meta"] is not None:
        return hasattr(node.meta["tensor_meta"], "shape")
    if node.type in ("torch.Tensor", "Tensor"):
        # annotation kept as a string (``from __future__ import annotations``)
        return True
    if isinstance(node.type, type):
        if issubclass(node.type, torch.Tensor):
            return True
        if node.type in (int, float, bool, tuple, list, torch.Size):
            return False
    if node.op == "get_attr":
        owner = node.graph.owning_module
        if owner is not None:
            try:
                attr = owner.get_submodule("") if not node.target else _fetch_attr(owner, node)
            except AttributeError:
                return None
            return isinstance(attr, torch.Tensor)
        return None
    if node.op == "call_module":
        module = _module_of(node)
        if isinstance(module, (*_FRESH_MODULES, torch.nn.Identity, torch.nn.Dropout)):
            return True
        if module is not None and type(module) in _INPLACE_MODULES:
            return True
        return None
    if node.op == "call_method":
        if node.target in NON_TENSOR_METHODS:
            return False
        if node.target in ("split", "chunk", "unbind", "tensor_split"):
            return False
        if node.args and is_tensor(node.args[0]) is True:
            ret = aten_returns_tensor(node.target.rstrip("_"))
            if ret is not None:
                return ret
        return None
    if node.op != "call_function":
        return None
    target = node.target
    if target is builtins.getattr:
        attr = node.args[1]
        if attr in NON_TENSOR_ATTRIBUTES:
            return False
        if attr in VIEW_ATTRIBUTES or attr in ("data", "grad", "real", "imag"):
            return is_tensor(node.args[0])
        return None
    if target is operator.getitem:
        base = node.args[0]
        if is_tensor(base) is True or _returns_only_tensors(base):
            return True
        return None
    if target in _FUNCTIONAL_OPERATORS or target in _INPLACE_OPERATORS:
        kinds = [is_tensor(a) for a in node.args]
        if any(k is True for k in kinds):
            return True
        if all(k is False for k in kinds):
            return False
        return None
    if isinstance(target, torch._ops.OpOverload):
        returns = target._schema.returns
        return len(returns) == 1 and str(returns[0].type) == "Tensor"
    name = _callable_name(node)
    if name is not None:
        return aten_returns_tensor(name)
    return None


def _returns_only_tensors(node: Any) -> bool:
    """Tells if a node returns a tuple or list made of tensors only (sort, split...)."""
    if not isinstance(node, Node) or node.op not in ("call_function", "call_method"):
        return False
    if isinstance(node.target, torch._ops.OpOverload):
        schemas = [node.target._schema]
    else:
        name = _callable_name(node)
        packet = _aten_packet(name) if name is not None else None
        if packet is None or (node.op == "call_method" and is_tensor(node.args[0]) is not True):
            return False
        schemas = _overload_schemas(packet)
    return bool(schemas) and all(
        r and all(str(t.type) in ("Tensor", "Tensor[]") for t in r)
        for r in (s.returns for s in schemas)
    )


def _fetch_attr(owner: torch.nn.Module, node: Node) -> Any:
    value: Any = owner
    for part in node.target.split("."):
        value = getattr(value, part)
    return value


def _module_of(node: Node) -> torch.nn.Module | None:
    owner = node.graph.owning_module
    if owner is None:
        return None
    try:
        return owner.get_submodule(node.target)
    except AttributeError:
        return None


@dataclass
class InplaceForm:
    """Describes an in-place node and how to compute the new value of what it mutates.

    :param kind: ``"twin"`` (call ``op``/``target`` on the same arguments with ``self``
        current), ``"setitem"`` (``base[index] = value``), ``"out"`` (the ``out=`` tensor
        receives the result of ``target`` called without ``out``), ``"unsupported"``
    :param mutated: the node whose storage is written
    :param op: FX op of the functional twin (``call_function`` or ``call_method``)
    :param target: functional twin
    :param args: arguments of the functional twin (may contain nodes of the graph)
    :param kwargs: keyword arguments of the functional twin
    :param cast: the twin may promote the dtype and must be cast back to the mutated dtype
    :param reason: why the form is unsupported
    """

    kind: str
    mutated: Any = None
    op: str = "call_function"
    target: Any = None
    args: tuple = ()
    kwargs: dict | None = None
    cast: bool = False
    reason: str = ""


def _needs_cast(twin_name: str, self_node: Any, others: list[Any]) -> bool:
    """Tells if the functional twin may return another dtype than the mutated tensor."""
    if twin_name in DTYPE_PRESERVING:
        return False
    self_val = example_value(self_node)
    for other in others:
        if not isinstance(other, Node):
            continue
        kind = is_tensor(other)
        if kind is False:
            continue
        other_val = example_value(other)
        if (
            isinstance(self_val, torch.Tensor)
            and isinstance(other_val, torch.Tensor)
            and self_val.dtype == other_val.dtype
        ):
            continue
        return True
    return False


def _flat_nodes(args: Any) -> list[Node]:
    nodes: list[Node] = []
    torch.fx.node.map_arg(args, nodes.append)
    return nodes


def _aten_inplace_form(node: Node) -> InplaceForm | None:
    target: torch._ops.OpOverload = node.target
    schema = target._schema
    written = [
        (i, a)
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]
    if not written:
        return None
    packet_name = schema.name.split("::")[-1]
    if len(written) > 1 or (written[0][0] != 0 and not written[0][1].kwarg_only):
        names = ", ".join(a.name for _, a in written)
        return InplaceForm("unsupported", reason=f"{target} mutates {names}")
    argument = written[0][1]
    if argument.kwarg_only:
        # out= variant: the functional overload takes the same arguments minus out.
        out = node.kwargs.get(argument.name)
        packet = _aten_packet(packet_name)
        twin = _find_overload(packet, schema, skip={argument.name}) if packet else None
        if twin is None or not isinstance(out, Node):
            return InplaceForm("unsupported", reason=f"no functional form for {target}")
        kwargs = {k: v for k, v in node.kwargs.items() if k != argument.name}
        return InplaceForm(
            "out", mutated=out, target=twin, args=tuple(node.args), kwargs=kwargs, cast=True
        )
    if packet_name in NON_VALUE_INPLACE:
        return None
    if not packet_name.endswith("_"):
        return InplaceForm("unsupported", reason=f"no functional form for {target}")
    if packet_name in METADATA_INPLACE:
        return InplaceForm("unsupported", reason=f"{target} changes metadata, not values")
    packet = _aten_packet(packet_name[:-1])
    twin = None
    if packet is not None:
        overload = schema.overload_name or "default"
        twin = getattr(packet, overload, None) if overload in packet.overloads() else None
    if twin is None or any(r.alias_info is not None for r in twin._schema.returns):
        return InplaceForm("unsupported", reason=f"no functional form for {target}")
    self_node = node.args[0]
    others = _flat_nodes((node.args[1:], node.kwargs))
    return InplaceForm(
        "twin",
        mutated=self_node,
        target=twin,
        args=tuple(node.args),
        kwargs=dict(node.kwargs),
        cast=_needs_cast(packet_name[:-1], self_node, others),
    )


def _find_overload(packet: Any, schema: Any, skip: set[str]) -> Any:
    wanted = [(a.name, str(a.type)) for a in schema.arguments if a.name not in skip]
    for name in packet.overloads():
        overload = getattr(packet, name)
        args = [(a.name, str(a.type)) for a in overload._schema.arguments]
        if args == wanted and not overload._schema.is_mutable:
            return overload
    return None


def _method_twin(name: str) -> tuple[str, Any] | None:
    """Finds the functional twin of in-place method ``name`` (``add_`` -> ``add``)."""
    base = name[:-1]
    if callable(getattr(torch.Tensor, base, None)):
        return "call_method", base
    packet = _aten_packet(base)
    if packet is not None:
        return "call_function", packet
    return None


def inplace_form(node: Node) -> InplaceForm | None:
    """Returns how to functionalize a node if it is in-place, None if it is not."""
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return _aten_inplace_form(node)
    if node.op == "call_module":
        module = _module_of(node)
        if module is None or not getattr(module, "inplace", False):
            return None
        factory = _INPLACE_MODULES.get(type(module))
        if factory is None or not node.args:
            return InplaceForm("unsupported", reason=f"module {type(module).__name__} inplace")
        function, extra = factory(module)
        return InplaceForm(
            "twin", mutated=node.args[0], target=function, args=(node.args[0], *extra)
        )
    if node.op not in ("call_function", "call_method"):
        return None
    target = node.target
    if target is operator.setitem:
        base_kind = is_tensor(node.args[0])
        if base_kind is False:
            return None
        if base_kind is None:
            return InplaceForm("unsupported", reason="setitem on a value not known as a tensor")
        return InplaceForm("setitem", mutated=node.args[0], args=tuple(node.args))
    if target in _INPLACE_OPERATORS:
        kind = is_tensor(node.args[0])
        twin = _INPLACE_OPERATORS[target]
        if kind is False:
            return InplaceForm("number", target=twin, args=tuple(node.args))
        if kind is None:
            return InplaceForm("unsupported", reason="augmented assignment on an unknown type")
        return InplaceForm(
            "twin",
            mutated=node.args[0],
            target=twin,
            args=tuple(node.args),
            cast=_needs_cast("", node.args[0], list(node.args[1:])),
        )
    name = node.target if node.op == "call_method" else _callable_name(node)
    if name is not None and name.endswith("_") and not name.startswith("_"):
        if name in NON_VALUE_INPLACE:
            return None
        if name in METADATA_INPLACE:
            return InplaceForm("unsupported", reason=f"{name} changes metadata, not values")
        twin = _inplace_function_twin(node, name)
        if twin is None:
            return InplaceForm("unsupported", reason=f"no functional form for {name}")
        if not node.args or not isinstance(node.args[0], Node):
            return InplaceForm("unsupported", reason=f"{name} without a tensor argument")
        others = _flat_nodes((node.args[1:], node.kwargs))
        return InplaceForm(
            "twin",
            mutated=node.args[0],
            op=twin[0],
            target=twin[1],
            args=tuple(node.args),
            kwargs=dict(node.kwargs),
            cast=_needs_cast(name[:-1], node.args[0], others),
        )
    if node.op == "call_function":
        form = _inplace_flag_form(node)
        if form is not None:
            return form
    out = node.kwargs.get("out")
    if isinstance(out, Node):
        kwargs = {k: v for k, v in node.kwargs.items() if k != "out"}
        return InplaceForm(
            "out", mutated=out, op=node.op, target=target, args=node.args, kwargs=kwargs
        )
    return None


def _inplace_function_twin(node: Node, name: str) -> tuple[str, Any] | None:
    if node.op == "call_method":
        return _method_twin(name)
    target = node.target
    base = name[:-1]
    if getattr(torch.Tensor, name, None) is target:
        twin = getattr(torch.Tensor, base, None)
        if twin is not None:
            return "call_function", twin
        return _method_twin(name)
    for namespace in (torch, torch.nn.functional, torch.special):
        if getattr(namespace, name, None) is target and callable(getattr(namespace, base, None)):
            return "call_function", getattr(namespace, base)
    return None


@functools.lru_cache(maxsize=1024)
def _signature(target: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def _inplace_flag_form(node: Node) -> InplaceForm | None:
    """Handles functions called with ``inplace=True`` such as ``F.relu(x, inplace=True)``."""
    target = node.target
    if not callable(target) or isinstance(target, torch._ops.OpOverloadPacket):
        return None
    if "inplace" not in node.kwargs and len(node.args) < 2:
        return None
    try:
        signature = _signature(target)
    except TypeError:  # unhashable callable
        signature = None
    if signature is None or "inplace" not in signature.parameters:
        return None
    try:
        bound = signature.bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    flag = bound.arguments.get("inplace", False)
    if flag is False:
        return None
    if not isinstance(flag, bool):
        return InplaceForm("unsupported", reason="inplace flag is not a constant")
    bound.arguments["inplace"] = False
    first = next(iter(bound.arguments.values()))
    if not isinstance(first, Node):
        return InplaceForm("unsupported", reason="inplace function without a tensor argument")
    return InplaceForm(
        "twin", mutated=first, target=target, args=tuple(bound.args), kwargs=bound.kwargs
    )
