"""Recorded lowering: the aten calls of a node found outside make_fx, then written
into its graph.

:mod:`.direct_lowering` writes the aten node of a common operator without running
anything. Every other node goes through make_fx, whose proxy mode records, besides the
node's aten calls, every piece of symbolic arithmetic the calls' decompositions and
fake kernels do on sizes while it is active (``reshape`` of an expanded tensor asks
whether a view is possible: a hundred ``sym_*`` and arithmetic nodes, dead, removed
later), and measures each output again (contiguity in every memory format). With
dynamic dimensions, that is 2 to 20 ms a node: in the ``export_for_generation`` of a
tiny Llama, the mask and ``repeat_kv`` nodes, a tenth of the nodes, took more than
half of the lowering. Recorded, the ``lower`` stage went from 0.80 to 0.58 s.

:func:`record_calls` runs the node on the lowering's fake values with make_fx's proxy
mode off, under a dispatch mode that decomposes exactly as make_fx's does (the
lowering's decomposition table first, then the operators autograd would have
decomposed; the composite operators torch_lib translates are kept by the lowering's
context either way) and records the calls that reach the fake kernels, with their
outputs. The arithmetic on sizes is then plain symbolic arithmetic, memoized
(:mod:`~yobx.torch.tracing.symbolic.symbolic_memo`), and recorded nowhere.
:func:`emit_calls` writes those calls into make_fx's graph, each output tracked as
:func:`~yobx.torch.onnx.direct_lowering.emit` tracks it: the graph holds the calls
make_fx would have recorded, in the same order, with the same arguments (the dead
size arithmetic aside). The graph must write nothing, as for the direct lowering.

Where the recording cannot stand for make_fx, the node goes through make_fx as before,
and nothing was written: an output that is not one tensor (a tuple, a Python scalar, a
size only known at run time), an argument make_fx holds as a constant (its constant
propagation) or does not track, a symbolic size none of the graph's sizes computes,
an operator whose output depends on data.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental import proxy_tensor
from torch.utils._python_dispatch import TorchDispatchMode

from yobx.torch.onnx.direct_arguments import AtenCall
from yobx.torch.onnx.direct_lowering import emit

aten = torch.ops.aten

#: operators make_fx never decomposes (see ``proxy_call``)
_NOT_DECOMPOSED = (aten.size.default, aten.stride.default, aten.storage_offset.default)
#: where make_fx reads a symbolic scalar and no ONNX operator does
_UNREADABLE = (aten.sym_stride.int, aten.sym_storage_offset.default)
#: arguments an aten call may take besides tensors and sizes
_PLAIN = (
    int,
    float,
    bool,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


#: an output freed before the next call (make_fx records it, dead, and removes it)
_FREED = object()


class _Recorder(TorchDispatchMode):
    """Decomposes as make_fx's proxy mode does, and records the calls that remain.

    An output is held weakly until the next call: a factory (``torch.arange``) makes
    its output a variable right after the call, and detaches it (one more call) when
    something else holds it, which make_fx, holding its tensors weakly, never sees.
    """

    def __init__(self, table: Mapping[Any, Callable]):
        super().__init__()
        self.table = table
        self.calls: list[list] = []

    def hold(self) -> None:
        """Holds the outputs recorded so far (:data:`_FREED` for those gone)."""
        for entry in self.calls:
            if isinstance(entry[1], weakref.ref):
                entry[1] = _FREED if entry[1]() is None else entry[1]()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.hold()
        if func is torch.ops.prim.device.default:
            return func(*args, **kwargs)  # as make_fx: a device query, no node
        if func in self.table:
            with self:
                out = self.table[func](*args, **kwargs)
            if out is not NotImplemented:
                return out
        if func not in _NOT_DECOMPOSED and proxy_tensor.autograd_would_have_decomposed(
            func, pytree.tree_leaves((args, kwargs))
        ):
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        held = weakref.ref(out) if isinstance(out, torch.Tensor) else out
        self.calls.append([(func, args, kwargs), held])
        return out


def recordable(node: torch.fx.Node) -> bool:
    """Whether the calls of ``node`` may be recorded: a tensor method, or a function of
    torch or of Python's ``operator`` module (a function of the user's, a leaf the
    capture kept whole, may run anything: a ``torch.cond``, a loop)."""
    if node.op == "call_method":
        return True
    target = node.target
    if node.op != "call_function" or isinstance(target, torch._ops.HigherOrderOperator):
        return False
    module = getattr(target, "__module__", None) or ""
    return module in ("_operator", "operator") or (
        module.split(".")[0] == "torch" and not module.startswith("torch._higher_order_ops")
    )


def record_calls(
    run: Callable[[], Any], table: Mapping[Any, Callable], shape_env: Any
) -> tuple[Any, list[tuple[AtenCall, Any]]] | None:
    """``run()`` with make_fx's proxy mode off: its result and the aten calls it made
    (after the decompositions make_fx would apply, ``table`` first), with their
    outputs; None when it raises or makes a size only known at run time (make_fx then
    runs it again: the unbound symbol is forgotten, as an exception's)."""
    recorder = _Recorder(table)
    pending = shape_env.pending_fresh_unbacked_symbols if shape_env is not None else []
    before = len(pending)
    try:
        with proxy_tensor.disable_proxy_modes_tracing(), recorder:
            result = run()
    except Exception:
        del pending[before:]
        return None
    if len(pending) > before:
        del pending[before:]
        return None
    recorder.hold()
    return result, [(call, out) for call, out in recorder.calls if out is not _FREED]


def _tracked(tracer: Any, leaf: Any, produced: set[int]) -> bool:
    """Whether make_fx's graph can take ``leaf`` as an argument: a tensor it tracks
    (not as a constant) or one an earlier call made, a symbolic size some graph value
    computes, or a plain constant."""
    if isinstance(leaf, torch.Tensor):
        if id(leaf) in produced:
            return True
        slot = proxy_tensor.get_proxy_slot(leaf, tracer, None)
        return slot is not None and slot.constant is None
    if isinstance(leaf, proxy_tensor.py_sym_types):
        node = leaf.node
        if node.constant is not None or node.expr.is_number:
            return True
        # the graph value make_fx gives it (see get_proxy_slot): its own, or the one
        # of a tensor's size or stride with the same symbol; never one torch builds
        # from the symbols of an expression (a sym_sum no translation takes)
        thunk = tracer.symnode_tracker.get(leaf)
        if thunk is None and isinstance(node.expr, sympy.Symbol):
            known = tracer.sympy_expr_tracker.get(node.expr)
            thunk = None if known is None else known.proxy
        return thunk is not None and _read_from_sizes(thunk.force().node)
    return isinstance(leaf, _PLAIN)


def _read_from_sizes(node: torch.fx.Node) -> bool:
    """Whether the symbolic scalar ``node`` computes is read from tensors' sizes only:
    the value torch found may be a tensor's stride or storage offset that equals it,
    which no ONNX operator reads."""
    todo, seen = [node], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.op == "call_function" and current.target in _UNREADABLE:
            return False
        if isinstance(current.meta.get("val"), torch.Tensor):
            continue  # the tensor a size is read from
        todo.extend(current.all_input_nodes)
    return True


def emit_calls(tracer: Any, calls: list[tuple[AtenCall, Any]], result: Any) -> bool:
    """Writes the recorded ``calls`` into make_fx's graph, when the node's ``result``
    is the last call's output and every argument is one the graph has; False, nothing
    written, otherwise (a node making no call, an element of a list, is make_fx's)."""
    if not calls or result is not calls[-1][1]:
        return False
    produced: set[int] = set()
    for (func, args, kwargs), out in calls:
        if type(out) is not FakeTensor or torch.Tag.data_dependent_output in func.tags:
            return False
        if func in (aten.lift_fresh.default, aten.lift_fresh_copy.default):
            return False
        if not all(_tracked(tracer, leaf, produced) for leaf in pytree.tree_leaves((args, kwargs))):
            return False
        produced.add(id(out))
    for call, out in calls:
        if not emit(tracer, call, out):  # checked above: every argument is tracked
            raise AssertionError(f"recorded lowering: {call[0]} could not be written")
    return True
