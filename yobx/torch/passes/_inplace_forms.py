"""How to functionalize an in-place node: its mutated argument and its functional twin.

``inplace_form(node)`` recognizes every way a graph writes into a tensor: aten overloads
whose schema marks an argument as written, methods and functions ending with ``_``,
augmented assignments, ``operator.setitem``, ``inplace=True`` functions and modules,
``out=`` arguments. It is the mutation half of the aliasing table of
:mod:`yobx.torch.passes.aliasing`.
"""

from __future__ import annotations

import functools
import inspect
import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from ._targets import (
    DTYPE_PRESERVING,
    INPLACE_MODULES,
    INPLACE_OPERATORS,
    METADATA_INPLACE,
    NON_VALUE_INPLACE,
    aten_packet,
    callable_name,
    example_value,
    is_tensor,
    module_of,
)


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


#: ``Tensor.__setitem__`` before any trace patches it
_TENSOR_SETITEM = torch.Tensor.__setitem__


def _is_setitem_gate(target: Any) -> bool:
    """Whether ``target`` is a trace's gate of ``Tensor.__setitem__``: the node a
    traced value written into a tensor the model created (``acc[3] = x.mean()``)
    records, as ``__torch_function__`` receives the patched method."""
    gated = getattr(target, "__yobx_gate__", None)
    return gated is not None and gated[0] is _TENSOR_SETITEM


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
        packet = aten_packet(packet_name)
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
    packet = aten_packet(packet_name[:-1])
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
    packet = aten_packet(base)
    if packet is not None:
        return "call_function", packet
    return None


def inplace_form(node: Node) -> InplaceForm | None:
    """Returns how to functionalize a node if it is in-place, None if it is not."""
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return _aten_inplace_form(node)
    if node.op == "call_module":
        module = module_of(node)
        if module is None or not getattr(module, "inplace", False):
            return None
        factory = INPLACE_MODULES.get(type(module))
        if factory is None or not node.args:
            return InplaceForm("unsupported", reason=f"module {type(module).__name__} inplace")
        function, extra = factory(module)
        return InplaceForm(
            "twin", mutated=node.args[0], target=function, args=(node.args[0], *extra)
        )
    if node.op not in ("call_function", "call_method"):
        return None
    target = node.target
    if target is operator.setitem or _is_setitem_gate(target):
        base_kind = is_tensor(node.args[0])
        if base_kind is False:
            return None
        if base_kind is None:
            return InplaceForm("unsupported", reason="setitem on a value not known as a tensor")
        return InplaceForm("setitem", mutated=node.args[0], args=tuple(node.args))
    if target in INPLACE_OPERATORS:
        kind = is_tensor(node.args[0])
        twin = INPLACE_OPERATORS[target]
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
    name = node.target if node.op == "call_method" else callable_name(node)
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
