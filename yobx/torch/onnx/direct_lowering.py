"""Direct lowering: the aten node of a common torch-level node, written without make_fx.

:func:`~yobx.torch.onnx.lowering.lower_to_aten` interprets the captured graph inside
``make_fx``: every operator goes through torch's dispatcher, the proxy mode, the
decompositions and a fake kernel (or a shape rule), and the proxy mode then measures
the fake output again (contiguity for every memory format). For the common operators,
all of that only rediscovers two things the lowering already knows: which aten overload
make_fx records (one, fixed by the operator and the kinds of its arguments) and the
output's fake value (the capture computed it exactly: ``node.meta["val"]``, in the same
fake mode, on the same symbols).

:func:`aten_call` says which aten call a node is when it is one of those (the rules
are in :mod:`yobx.torch.onnx.direct_rules` and :mod:`yobx.torch.onnx.direct_nn_rules`),
and :func:`emit` writes it into make_fx's graph with the capture's value, tracked as
make_fx tracks its own outputs (sizes, strides, element count and storage offset bound
lazily to ``sym_*`` nodes), so that every later operator, lowered either way, finds it.
The aten node is the one make_fx would record (the same overload, arguments in the same
form), and torch_lib translates it as before. ``to_onnx(direct_lowering=False)`` lowers
everything through make_fx, which the tests compare with (``clone`` nodes may differ:
make_fx copies for an eval dropout, and where it gave a value other strides than the
capture).

A node the capture found to return its argument itself (an eval dropout, ``to`` its own
dtype) takes that argument's lowered value (:func:`identity_value`). Anything else
keeps the make_fx path: other argument forms (keywords away from their defaults, Python
scalars on the left, symbolic scalars as operands), tensors that make_fx holds as
constants, sizes only known at run time, and graphs that write into a tensor (the
in-place forms the passes leave): a value shared with the capture must not be mutated
by the lowering.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental import proxy_tensor
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.multiprocessing.reductions import StorageWeakRef

from yobx.torch.onnx.direct_arguments import AtenCall
from yobx.torch.onnx.direct_nn_rules import module_call
from yobx.torch.onnx.direct_rules import (
    FUNCTION_RULES,
    METHOD_RULES,
    function_with_sizes,
    with_sizes,
)
from yobx.torch.tracing.shape_rules import ShapeRuleMismatch

aten = torch.ops.aten


def aten_call(
    node: torch.fx.Node, args: tuple, kwargs: dict, module: Any = None
) -> AtenCall | None:
    """The aten call make_fx records for ``node`` with the interpreted ``args`` and
    ``kwargs``, when the node is a common operator in a form written directly.

    :param node: a torch-level node (``call_function``, ``call_method`` or
        ``call_module``)
    :param args: its interpreted positional arguments (the lowering's values)
    :param kwargs: its interpreted keyword arguments
    :param module: the called submodule of a ``call_module`` node
    :return: ``(op, args, kwargs)``, or None when make_fx must lower the node
    """
    if node.op == "call_function":
        if node.target is torch.reshape:
            return _reshape(node, args, kwargs)
        try:
            rule = FUNCTION_RULES.get(node.target)
        except TypeError:  # an unhashable callable (a functools.partial of a list...)
            return None
        return None if rule is None else rule(args, kwargs)
    if node.op == "call_method":
        if node.target == "reshape":
            return _reshape(node, args, kwargs)
        rule = METHOD_RULES.get(node.target)
        return None if rule is None else rule(args, kwargs)
    if node.op == "call_module" and module is not None:
        return module_call(module, args, kwargs)
    return None


def _reshape(node: torch.fx.Node, args: tuple, kwargs: dict) -> AtenCall | None:
    """``reshape`` is a ``view`` when the capture's result shares its input's storage;
    otherwise torch records a copy first (make_fx)."""
    if not args or not is_view_of(node, node.args[0]):
        return None
    if node.op == "call_function":
        return function_with_sizes(aten.view.default, "shape")(args, kwargs)
    return with_sizes(aten.view.default)(args, kwargs)


def capture_value(node: torch.fx.Node, fake_mode: Any) -> FakeTensor | None:
    """The capture's fake value of ``node`` when the lowering can take it as is: a
    plain fake tensor of the lowering's fake mode, with no size only known at run time
    (those are bound to new symbols by make_fx's path)."""
    value = node.meta.get("val")
    if type(value) is not FakeTensor or value.fake_mode is not fake_mode:
        return None
    if node.meta.get("unbacked_bindings") or value.requires_grad:
        return None
    return value


def identity_value(node: torch.fx.Node, args: tuple) -> torch.Tensor | None:
    """The lowering's value of the node's first argument when the capture found the node
    to return that argument itself (``dropout`` in eval mode, ``contiguous()`` of a
    contiguous tensor, ``to`` its own dtype...): the lowering takes it as well, with no
    node (make_fx writes a ``clone`` for an eval dropout, which the ONNX optimizer
    removes). Only in graphs that write nothing, where an operator returning its
    argument does not change it."""
    if not node.args or not isinstance(node.args[0], torch.fx.Node) or not args:
        return None
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or node.args[0].meta.get("val") is not value:
        return None
    return args[0] if isinstance(args[0], torch.Tensor) else None


def is_view_of(node: torch.fx.Node, source: Any) -> bool:
    """Whether the capture's value of ``node`` shares the storage of the capture's
    value of ``source`` (``reshape`` was a view, not a copy)."""
    value = node.meta.get("val")
    base = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not (isinstance(value, torch.Tensor) and isinstance(base, torch.Tensor)):
        return False
    return StorageWeakRef(value.untyped_storage()) == StorageWeakRef(base.untyped_storage())


def check_value(value: torch.Tensor, expected: Any, what: str) -> None:
    """Raises :class:`~yobx.torch.tracing.shape_rules.ShapeRuleMismatch` when the
    capture's value of a node written directly has another shape or dtype than torch's
    fake kernel gives on the lowering's arguments (``YOBX_CHECK_SHAPE_RULES``).

    Strides may differ: an argument lowered by make_fx may have another layout than
    the capture gave it (a convolution's memory format is decided without guards in
    the capture), and ONNX has no layouts; every value the lowering computes from a
    direct one is what the capture computed from it.
    """
    if not isinstance(expected, torch.Tensor):
        raise ShapeRuleMismatch(f"direct lowering of {what}: torch gives {expected!r}")
    problems = []
    if value.dim() != expected.dim() or not all(
        statically_known_true(a == b) for a, b in zip(value.shape, expected.shape)
    ):
        problems.append(f"shape {tuple(value.shape)} instead of {tuple(expected.shape)}")
    if value.dtype != expected.dtype:
        problems.append(f"dtype {value.dtype} instead of {expected.dtype}")
    if problems:
        raise ShapeRuleMismatch(f"direct lowering of {what}: " + "; ".join(problems))


def _proxies(tracer: Any, values: Any) -> Any:
    """The make_fx proxies of tensors and symbolic scalars in ``values``; None when a
    tensor is not tracked or is a constant make_fx propagates (checked first: fetching
    a symbolic scalar's proxy may write its ``sym_size`` node)."""
    flat, spec = pytree.tree_flatten(values)
    slots = {}
    for index, value in enumerate(flat):
        if isinstance(value, torch.Tensor):
            slot = proxy_tensor.get_proxy_slot(value, tracer, None)
            if slot is None or slot.constant is not None:
                return None
            slots[index] = slot.proxy
    fetch = proxy_tensor.fetch_sym_proxy(tracer)
    for index, value in enumerate(flat):
        if index in slots:
            flat[index] = slots[index]
        elif isinstance(value, proxy_tensor.py_sym_types):
            flat[index] = fetch(value)
    return pytree.tree_unflatten(flat, spec)


def _sym_proxy(tracer: Any, op: Any, proxy: Any, index: int | None, size: Any) -> Any:
    args = (proxy,) if index is None else (proxy, index)
    size_proxy = tracer.create_proxy("call_function", op, args, {})
    size_proxy.node.meta["val"] = size
    return size_proxy


def _bind_lazily(tracer: Any, size: Any, op: Any, proxy: Any, index: int | None = None) -> None:
    if isinstance(size, torch.SymInt):
        with proxy_tensor._enable_thunkify(tracer):
            thunk = proxy_tensor.thunkify(tracer, _sym_proxy, tracer, op, proxy, index, size)
            proxy_tensor.set_proxy_slot(size, tracer, thunk)


def _track(value: FakeTensor, proxy: Any, tracer: Any) -> None:
    """make_fx's ``track_tensor``: the proxy of ``value``, and of each of its symbolic
    sizes, strides, element count and storage offset a ``sym_*`` node made when first
    used; but the element count is computed outside make_fx's graph. Inside,
    ``value.numel()`` multiplies the sizes with symbolic arithmetic that make_fx records
    as graph nodes (dead, removed later): half the cost of a node written directly."""
    for index, size in enumerate(value.shape):
        _bind_lazily(tracer, size, aten.sym_size.int, proxy, index)
    for index, stride in enumerate(value.stride()):
        _bind_lazily(tracer, stride, aten.sym_stride.int, proxy, index)
    with proxy_tensor.disable_proxy_modes_tracing():
        numel = value.numel()
    _bind_lazily(tracer, numel, aten.sym_numel.default, proxy)
    _bind_lazily(tracer, value.storage_offset(), aten.sym_storage_offset.default, proxy)
    proxy_tensor.set_proxy_slot(value, tracer, proxy_tensor._ProxyTensor(proxy, None))


def emit(tracer: Any, call: AtenCall, value: FakeTensor) -> bool:
    """Writes the aten ``call`` into make_fx's graph with ``value`` as its fake value,
    tracked as make_fx tracks its outputs; False (nothing written) when an argument is
    not a tracked tensor."""
    op, args, kwargs = call
    proxies = _proxies(tracer, (args, kwargs))
    if proxies is None:
        return False
    proxy = tracer.create_proxy(
        "call_function",
        op,
        *proxies,
        name=tracer.graph._target_to_str(op.overloadpacket.__name__),
    )
    _track(value, proxy, tracer)
    # the capture's value as it is: translation reads dtype and shape from "val"; the
    # proxy mode's copy and its "tensor_meta" (contiguity in every memory format) are
    # what this path saves
    proxy.node.meta["val"] = value
    return True
