"""Recursive tracing: the model with :class:`~yobx.torch.tracing.RobustTracer`, then
every failing module on its own with the real inputs it received in one eager run of
the model; the result is a :class:`~yobx.torch.tracing.robust.collection.GraphCollection`.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from ..core.tracer import CustomTracer
from ..inputs import bound_parameters
from .collection import GraphCollection, ModuleEntry, ModuleFailure
from .recorded_calls import RecordedCall, example_call, failure_location, record_calls
from .robust import RobustTracer, is_container


def _concrete_args_of(module: torch.nn.Module, call: RecordedCall) -> dict[str, Any]:
    """Names the recorded positional and keyword inputs after ``module.forward``'s parameters.

    :raises TypeError: when ``forward`` takes ``*args`` and received some
    """
    named: dict[str, Any] = {}
    for parameter, value in bound_parameters(module.forward, call.args, call.kwargs):
        if parameter.kind == inspect.Parameter.VAR_POSITIONAL:
            if value:
                raise TypeError(
                    f"{type(module).__name__}.forward takes *{parameter.name}: its inputs "
                    f"cannot be named, it is not traced on its own"
                )
        elif parameter.kind == inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[parameter.name] = value
    return named


def _children_through_containers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """Direct children, looking through ModuleList/ModuleDict."""
    result = []
    for child in module.children():
        if is_container(child):
            result.extend(_children_through_containers(child))
        else:
            result.append(child)
    return result


def _mark_containers(collection: GraphCollection, model: torch.nn.Module) -> None:
    """Containers get the status ``container`` when one of their descendants was reached."""
    for path, module in model.named_modules():
        if not is_container(module) or collection.get_entry(module) is not None:
            continue
        statuses = [
            collection.status(m) for m in module.modules() if collection.status(m) is not None
        ]
        if any(s != "unvisited" for s in statuses):
            collection.set_entry(ModuleEntry(path, module, "container"))
        elif statuses:
            collection.set_entry(ModuleEntry(path, module, "unvisited"))


def _join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if prefix and path else prefix or path


def recursive_trace(
    model: torch.nn.Module,
    concrete_args: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
) -> GraphCollection:
    """Traces ``model`` with :class:`RobustTracer`, then every failing module on its own.

    The model runs once eagerly first (forward hooks record the inputs every module
    receives, the hooks are removed and the buffers restored afterwards). Each
    failing module is then traced with the real inputs of its first call, so that its
    children are traced with concrete-aware shapes too, and so on recursively. When
    the failure comes from the module's own code, its direct children that are not
    leaves are traced on their own instead.

    Submodules are traced with static shapes (``dynamic_shapes=None``): their graphs
    are exact for the recorded inputs; only the root graph keeps ``dynamic_shapes``.

    :param model: the model
    :param concrete_args: example input per parameter name
    :param dynamic_shapes: dynamic dimensions of the root's inputs (torch.export's format)
    :return: the root graph, graphs of the traceable parts of failing modules, and one
        status per module
    :raises TypeError: ``model`` is not a ``torch.nn.Module``

    Example (a value-dependent branch in a submodule)::

        >>> import torch
        >>> from yobx.torch.tracing import recursive_trace
        >>> class Branchy(torch.nn.Module):
        ...     def forward(self, x):
        ...         return x * 2 if x.sum().item() > 0 else x
        >>> class Model(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.linear = torch.nn.Linear(3, 3)
        ...         self.branchy = Branchy()
        ...     def forward(self, x):
        ...         return self.branchy(self.linear(x))
        >>> collection = recursive_trace(Model(), concrete_args={"x": torch.randn(2, 3)})
        >>> collection.get_entry(collection.model.branchy).status
        'failed'
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"recursive_trace expects a torch.nn.Module, got {type(model).__name__}")
    args, kwargs = example_call(model.forward, concrete_args)
    recording = record_calls(model, args, kwargs)
    collection = GraphCollection(model)
    paths = {m: p for p, m in model.named_modules()}
    _trace_recursively(
        collection, model, paths, concrete_args, dynamic_shapes, recording, (args, kwargs)
    )
    _mark_containers(collection, model)
    return collection


def _trace_recursively(
    collection: GraphCollection,
    module: torch.nn.Module,
    paths: dict[torch.nn.Module, str],
    concrete_args: dict[str, Any] | None,
    dynamic_shapes: Any,
    recording: dict[torch.nn.Module, list[RecordedCall]],
    inputs: tuple[tuple, dict],
) -> None:
    path = paths.get(module, "")
    known = collection.get_entry(module)
    entry = collection.set_entry(
        ModuleEntry(
            path=path,
            module=module,
            status="failed" if known is not None and known.status == "failed" else "traced",
            failure=None if known is None else known.failure,
            inputs=inputs,
        )
    )
    tracer = RobustTracer(recording=recording)
    try:
        graph = tracer.trace(module, concrete_args, dynamic_shapes)
    except Exception as e:
        entry.status = "failed"
        entry.failure = entry.failure or ModuleFailure(
            path, type(module).__name__, type(e).__name__, str(e), failure_location(e)
        )
        return
    own_failure = tracer.failure(module)
    opaque = own_failure is not None or tracer.is_registered_leaf(module)
    if not opaque or module is collection.model:
        # a nested module that cannot be traced into keeps no graph: its children do
        entry.graph, entry.traced_model, entry.guards = graph, tracer.traced_model, tracer.guards
        entry.opaque = opaque
    if own_failure is not None:
        entry.status = "failed"
        entry.failure = entry.failure or dataclasses.replace(own_failure, path=path)
    elif tracer.is_registered_leaf(module):
        entry.status = "leaf"
        return

    _record_submodules(collection, tracer, module, path)
    to_trace = [m for m in tracer.called_modules() if m is not module and tracer.is_failed(m)]
    if own_failure is not None:
        # the module's own code fails: its children are the traceable parts
        to_trace += _children_to_trace(collection, tracer, module, paths, recording)
    for sub in to_trace:
        known = collection.get_entry(sub)
        if known is not None and known.graph is not None:
            continue
        calls = recording.get(sub)
        if not calls:
            continue
        try:
            sub_args = _concrete_args_of(sub, calls[0])
        except TypeError as e:
            entry_sub = collection.get_entry(sub) or collection.set_entry(
                ModuleEntry(paths.get(sub, ""), sub, "failed")
            )
            entry_sub.failure = entry_sub.failure or ModuleFailure(
                entry_sub.path, type(sub).__name__, type(e).__name__, str(e), ""
            )
            continue
        _trace_recursively(
            collection, sub, paths, sub_args, None, recording, (calls[0].args, calls[0].kwargs)
        )


def _record_submodules(
    collection: GraphCollection, tracer: RobustTracer, module: torch.nn.Module, path: str
) -> None:
    """Entries for the modules the trace of ``module`` called (failed, leaf or inlined)
    and for those it never called."""
    for sub, (rel, is_leaf) in tracer.called_modules().items():
        if sub is module:
            continue
        failure = tracer.failure(sub)
        sub_path = _join(path, rel)
        status = "failed" if failure is not None else "leaf" if is_leaf else "inlined"
        if failure is not None:
            failure = dataclasses.replace(failure, path=sub_path)
        collection.set_entry(ModuleEntry(sub_path, sub, status, failure))
    for rel, sub in tracer.unvisited_modules().items():
        collection.set_entry(ModuleEntry(_join(path, rel), sub, "unvisited"))


def _children_to_trace(
    collection: GraphCollection,
    tracer: RobustTracer,
    module: torch.nn.Module,
    paths: dict[torch.nn.Module, str],
    recording: dict[torch.nn.Module, list[RecordedCall]],
) -> list[torch.nn.Module]:
    """The children of a module whose own code fails that are worth tracing alone; the
    others get their entry here (failed, unvisited or leaf)."""
    to_trace = []
    for child in _children_through_containers(module):
        child_path = paths.get(child, "")
        failure = tracer.failure(child)
        if failure is not None:
            failure = dataclasses.replace(failure, path=child_path)
            collection.set_entry(ModuleEntry(child_path, child, "failed", failure))
            to_trace.append(child)
        elif child not in recording:
            collection.set_entry(ModuleEntry(child_path, child, "unvisited"))
        elif tracer.is_registered_leaf(child) or CustomTracer.is_leaf_module(
            tracer, child, child_path
        ):
            collection.set_entry(ModuleEntry(child_path, child, "leaf"))
        else:
            to_trace.append(child)
    return to_trace


__all__ = ["recursive_trace"]
