"""Inputs whose memory layout the values of a traced graph depend on.

Every tensor input of a trace gets a fake value laid out contiguously, whatever the
example's strides. What a graph computes does not depend on how its inputs are laid
out, except when it

* reads a layout: ``stride()``, ``is_contiguous()``, ``as_strided(...)``,
  ``storage_offset()`` of the input or of a tensor computed from it (an elementwise
  result follows the layout of its inputs);
* writes into the input through a tensor the trace found to share its memory:
  ``x.contiguous()`` and ``x.reshape(...)`` return the input itself or a view of it
  when it is contiguous, a copy otherwise; eager writes through the one, not the other
  (a write into the input itself or through a view, ``x[0]`` or ``x.t()``, does not
  depend on the layout).

For those inputs, the trace refuses an example that is not contiguous (its values
would be computed for another layout than the example's) and the graph checks, each
time it runs, that the input is contiguous (:func:`check_contiguous`, inserted after
the placeholders, removed before ONNX, whose inputs are always dense).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import Node
from torch.fx.proxy import Proxy
from torch.multiprocessing.reductions import StorageWeakRef

from ...passes._side_effects import writes
from ..errors import TracingError
from .runtime_checks import RUNTIME_CHECK

#: methods and functions whose result depends on the layout of their first argument
_LAYOUT_METHODS = frozenset(
    {"stride", "is_contiguous", "as_strided", "as_strided_", "storage_offset", "data_ptr"}
)
_LAYOUT_FUNCTIONS = frozenset(
    {
        torch.as_strided,
        torch.Tensor.stride,
        torch.Tensor.is_contiguous,
        torch.Tensor.as_strided,
        torch.Tensor.storage_offset,
        torch.ops.aten.sym_stride.int,
        torch.ops.aten.sym_stride.default,
        torch.ops.aten.as_strided.default,
        torch.ops.aten.sym_storage_offset.default,
    }
)


class InputLayoutError(ValueError):
    """A traced graph runs on an input laid out otherwise than it was traced with."""


@torch.fx.node.has_side_effect
def check_contiguous(tensor: Any, name: str, reason: str) -> None:
    """Raises :class:`InputLayoutError` when ``tensor`` is not contiguous.

    :param tensor: the graph's input
    :param name: its name, for the message
    :param reason: what in the graph depends on its layout (with the user's line)
    """
    if isinstance(tensor, Proxy):
        # the graph is traced again (torch.fx.symbolic_trace of the GraphModule)
        tensor.tracer.create_proxy("call_function", check_contiguous, (tensor, name, reason), {})
        return
    if not isinstance(tensor, torch.Tensor) or isinstance(tensor, FakeTensor):
        return  # fake values (a lowering re-running the graph) have the traced layout
    if not tensor.is_contiguous():
        raise InputLayoutError(
            f"input {name!r} is not contiguous (strides {tuple(tensor.stride())}) but the "
            f"graph was traced with a contiguous one and {reason}: pass {name}.contiguous()"
        )


def layout_dependent_inputs(
    graph: torch.fx.Graph, reads: Sequence[tuple[Node, str]] = ()
) -> dict[Node, tuple[str, str]]:
    """The tensor placeholders the graph's values depend on the layout of, each with
    what depends on it (``"it writes into it"``) and the user's ``file:line`` doing it.

    :param reads: the tensors whose layout the traced code read, with the line reading
        it (:func:`reads_layout` while tracing: a read folded into a constant leaves
        no node in the graph)
    """
    placeholders = [
        n
        for n in graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
    ]
    if not placeholders:
        return {}
    reasons: dict[Node, tuple[str, str]] = {}
    readers = [
        (n.args[0], _at(n))
        for n in graph.nodes
        if n.args and isinstance(n.args[0], Node) and reads_layout(n.op, n.target)
    ]
    for tensor, location in (*reads, *readers):
        if tensor.graph is not graph or getattr(tensor, "_erased", False):
            continue
        for placeholder in _ancestors(tensor, set(placeholders)):
            reasons.setdefault(
                placeholder, ("it reads the layout of a tensor computed from it", location)
            )
    _input_writes(graph, placeholders, reasons)
    return reasons


def reads_layout(kind: str, target: Any) -> bool:
    """Whether an operation's result depends on the layout of its first argument."""
    if kind == "call_method":
        return target in _LAYOUT_METHODS
    return kind == "call_function" and _is_in(target, _LAYOUT_FUNCTIONS)


def _is_in(target: Any, table: frozenset) -> bool:
    try:
        return target in table
    except TypeError:  # an unhashable callable
        return False


def _ancestors(node: Node, placeholders: set[Node]) -> list[Node]:
    """The placeholders ``node`` is computed from."""
    found, seen, stack = [], {node}, [node]
    while stack:
        current = stack.pop()
        if current in placeholders:
            found.append(current)
        for parent in current.all_input_nodes:
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return found


def _input_writes(graph: torch.fx.Graph, placeholders: list[Node], reasons: dict) -> None:
    """Inputs written through a tensor that shares their memory only because they are
    contiguous (a ``contiguous()`` or ``reshape`` the trace found to return the input
    or a view of it). A write into the input itself, or through a view (``x[0]``,
    ``x.t()``), writes into it whatever its layout: the graph does so too.

    Only the few layout-conditional nodes are looked at, then the tensors sharing their
    memory down their users: no storage is read for the other nodes of the graph.
    """
    conditional = [n for n in graph.nodes if _aliases_if_contiguous(n)]
    if not conditional:
        return
    storages: dict[StorageWeakRef | None, Node] = {}
    for input_node in placeholders:
        storages.setdefault(_storage(input_node), input_node)
    storages.pop(None, None)
    for start in conditional:
        storage = _storage(start)
        placeholder = None if storage is None else storages.get(storage)
        if placeholder is None or placeholder in reasons:
            continue
        seen, stack = {start}, [start]
        while stack and placeholder not in reasons:
            alias = stack.pop()
            for user in alias.users:
                if any(w is alias for w in writes(user)):
                    reasons[placeholder] = (
                        "it writes into it through a tensor that shares its memory only "
                        "when it is contiguous",
                        _at(user),
                    )
                    break
                if user in seen:
                    continue
                shared = _storage(user)  # StorageWeakRef == None raises
                if shared is not None and shared == storage:
                    seen.add(user)
                    stack.append(user)


#: operations returning their input or a view of it when it is laid out for it, a copy
#: otherwise
_CONDITIONAL_ALIAS_METHODS = frozenset({"contiguous", "reshape", "reshape_as", "flatten", "ravel"})
_CONDITIONAL_ALIAS_FUNCTIONS = frozenset(
    {
        torch.reshape,
        torch.flatten,
        torch.ravel,
        torch.Tensor.contiguous,
        torch.Tensor.reshape,
        torch.Tensor.reshape_as,
        torch.Tensor.flatten,
        torch.Tensor.ravel,
    }
)


def _aliases_if_contiguous(node: Node) -> bool:
    if node.op == "call_method":
        if node.target == "to":
            return "memory_format" in node.kwargs
        return node.target in _CONDITIONAL_ALIAS_METHODS
    return node.op == "call_function" and _is_in(node.target, _CONDITIONAL_ALIAS_FUNCTIONS)


def _storage(node: Node) -> StorageWeakRef | None:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return StorageWeakRef(value.untyped_storage())
    except (NotImplementedError, RuntimeError):  # no storage (sparse, nested...)
        return None


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _at(node: Node) -> str:
    """``file:line`` of the user's line that made ``node`` (empty if unknown)."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""


def check_examples(reasons: dict[Node, tuple[str, str]], examples: dict[Node, Any]) -> None:
    """Raises :class:`~.errors.TracingError` when the example of a layout-dependent
    input is not contiguous: the graph would compute for another layout."""
    for placeholder, (what, location) in reasons.items():
        example = examples.get(placeholder)
        if isinstance(example, torch.Tensor) and not example.is_contiguous():
            name = placeholder.target
            raise TracingError.at(
                location,
                f"the example of input {name!r} is not contiguous (strides "
                f"{tuple(example.stride())}) and the graph depends on its layout ({what}): "
                f"its values would be computed for a contiguous one; pass "
                f"{name}.contiguous() as the example",
            )


def insert_layout_checks(graph: torch.fx.Graph, reasons: dict[Node, tuple[str, str]]) -> int:
    """Inserts a :func:`check_contiguous` of each input of ``reasons`` after the
    placeholders; returns how many."""
    anchor = next((n for n in graph.nodes if n.op != "placeholder"), None)
    if anchor is None:
        return 0
    with graph.inserting_before(anchor):
        for placeholder, (what, location) in reasons.items():
            reason = f"{what} at {location}" if location else what
            # a placeholder's target is its name
            name = cast(str, placeholder.target)
            node = graph.call_function(check_contiguous, (placeholder, name, reason))
            node.meta["val"] = None
            node.meta[RUNTIME_CHECK] = True
    return len(reasons)
