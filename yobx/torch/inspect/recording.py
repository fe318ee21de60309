"""Recorded runs: run inputs through eager modules, an FX graph and ONNX, keeping every call.

Recording is opt-in and single-threaded: one :func:`record_run` at a time in the process
(a second one in another thread waits for the first to finish, one nested in the same
thread raises), and only calls made by the thread that started it are recorded. Hooks and
the active recorder are removed in ``finally``, also when a run raises.
"""

from __future__ import annotations

import contextlib
import inspect as pyinspect
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ..chrome_trace import JSONTraceHandler, current_rss_bytes
from ..tracing.constraints.runtime_checks import RUNTIME_CHECK
from ..tracing.inputs import bound_parameters
from .results import TraceCall, TraceStage
from .trace_result import TraceResult
from .values import SummaryCache, summarize
from .varying_sizes import varying_dynamic_shapes

#: Stages :func:`record_run` knows how to record, in pipeline order.
KNOWN_STAGES = ("eager", "graph", "onnx")

_CALL_OPS = ("call_function", "call_method", "call_module")

_RECORD_LOCK = threading.Lock()
# The recorder of the run in progress. Read without the lock by the decorators: a plain
# attribute read keeps them free when nothing is recorded.
_ACTIVE: Recorder | None = None


class Recorder:
    """State of the recording in progress: where calls go and how values are summarised."""

    def __init__(
        self,
        result: TraceResult,
        keep_tensors: bool,
        max_calls: int | None,
        handler: JSONTraceHandler | None,
    ):
        self.result = result
        self.thread_id = threading.get_ident()
        self.cache = SummaryCache(keep_tensors)
        self.max_calls = max_calls
        self.handler = handler
        self.current_stage: TraceStage | None = None
        self.current_run = 0
        #: Module id -> qualified name in the recorded model, to name decorated methods.
        self.module_names: dict[int, str] = {}

    def summarize(self, value: Any) -> Any:
        """Summary of a value, sharing summaries of unchanged tensors."""
        return summarize(value, self.cache)

    def stage(self, name: str) -> TraceStage:
        """The stage ``name`` of the result, created if needed."""
        return self.result.stage(name, max_calls=self.max_calls)

    def add(self, stage: TraceStage, call: TraceCall) -> None:
        """Record a call in a stage and, when profiling, as a complete trace event."""
        if not stage.append(call):
            return
        if self.handler is not None and call.start_ns is not None and call.duration_ns is not None:
            self.handler.process_complete_event(
                call.name,
                f"{stage.name},{call.kind}",
                call.start_ns,
                call.duration_ns,
                args={"target": call.target, "run": call.run, "index": call.index},
            )

    def is_recording_thread(self) -> bool:
        """Whether the caller runs on the thread that started the recording."""
        return threading.get_ident() == self.thread_id


def active_recorder() -> Recorder | None:
    """The recorder in progress if the calling thread is the recording one, else None."""
    recorder = _ACTIVE
    if recorder is None or not recorder.is_recording_thread():
        return None
    return recorder


# Parameter names ----------------------------------------------------------------------


def _signature_names(func: Callable, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    try:
        bound = bound_parameters(func, args, kwargs)
    except (TypeError, ValueError):  # no signature (a builtin), or arguments that do not bind
        return None
    named: dict[str, Any] = {}
    for parameter, value in bound:
        if parameter.kind == parameter.VAR_POSITIONAL:
            named.update({f"{parameter.name}[{i}]": v for i, v in enumerate(value)})
        elif parameter.kind == parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[parameter.name] = value
    return named


def _positional(args: tuple, kwargs: dict, first: str = "arg") -> dict[str, Any]:
    named = {f"{first}{i}" if first else f"arg{i}": a for i, a in enumerate(args)}
    named.update(kwargs)
    return named


def _function_params(target: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Name the arguments of a function call after its schema or signature."""
    try:
        from torch.fx.operator_schemas import normalize_function

        normalized = normalize_function(target, args, kwargs, normalize_to_only_use_kwargs=True)
    except Exception:
        normalized = None
    if normalized is not None:
        names = list(normalized.kwargs)[: len(args)]
        if len(names) == len(args) and not set(names) & set(kwargs):
            named = dict(zip(names, args))
            named.update(kwargs)
            return named
    named = _signature_names(target, args, kwargs)
    return named if named is not None else _positional(args, kwargs)


def _method_params(args: tuple, kwargs: dict) -> dict[str, Any]:
    named = {"self": args[0]} if args else {}
    named.update({f"arg{i}": a for i, a in enumerate(args[1:], start=1)})
    named.update(kwargs)
    return named


def _module_params(module: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    named = _signature_names(module.forward, args, kwargs)
    return named if named is not None else _positional(args, kwargs)


def _qualified_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    try:
        from torch.fx.node import _get_qualified_name

        return _get_qualified_name(target).replace("_operator.", "operator.", 1)
    except Exception:
        return getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))


# Eager stage --------------------------------------------------------------------------


def _leaf_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [
        (name, module)
        for name, module in model.named_modules()
        if name and next(iter(module.children()), None) is None
    ]


@contextlib.contextmanager
def _eager_hooks(model: torch.nn.Module, recorder: Recorder, stage: TraceStage):
    """Hooks recording every leaf module call; removed on exit whatever happens."""
    handles = []
    pending: dict[int, list[tuple[dict[str, Any], int]]] = {}

    def make_hooks(name: str, module: torch.nn.Module):
        target = type(module).__name__

        def pre_hook(mod, args, kwargs):
            if not recorder.is_recording_thread():
                return None
            params = {
                k: recorder.summarize(v) for k, v in _module_params(mod, args, kwargs).items()
            }
            # Taken last so that summarising the inputs is not part of the duration.
            pending.setdefault(id(mod), []).append((params, time.perf_counter_ns()))
            return None

        def post_hook(mod, args, kwargs, output):
            end = time.perf_counter_ns()
            stack = pending.get(id(mod))
            if not stack or not recorder.is_recording_thread():
                return None
            params, start = stack.pop()
            call = TraceCall(
                name,
                target,
                params,
                recorder.summarize(output),
                end - start,
                "module",
                run=recorder.current_run,
                start_ns=start,
            )
            recorder.add(stage, call)
            return None

        return pre_hook, post_hook

    try:
        for name, module in _leaf_modules(model):
            pre_hook, post_hook = make_hooks(name, module)
            handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
            handles.append(module.register_forward_hook(post_hook, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
        pending.clear()


# Graph stage --------------------------------------------------------------------------


class _RecordingInterpreter(torch.fx.Interpreter):
    """Runs a GraphModule node by node, timing and recording each call node."""

    def __init__(self, module: torch.fx.GraphModule, recorder: Recorder, stage: TraceStage):
        super().__init__(module)
        self.recorder = recorder
        self.stage = stage
        self._node_info: dict[torch.fx.Node, tuple[str, tuple[str, ...]]] = {}
        self._module_outputs = _module_output_nodes(module.graph)

    def _info(self, node: torch.fx.Node) -> tuple[str, tuple[str, ...]]:
        info = self._node_info.get(node)
        if info is None:
            if node.op == "call_module":
                submodule = self.module.get_submodule(node.target)
                info = (type(submodule).__name__, (node.target,))
            elif node.op == "call_method":
                info = (f"Tensor.{node.target}", ())
            else:
                info = (_qualified_name(node.target), ())
            if node in self._module_outputs:
                info = (info[0], (*info[1], self._module_outputs[node]))
            self._node_info[node] = info
        return info

    def _params(self, node: torch.fx.Node, args: tuple, kwargs: dict) -> dict[str, Any]:
        if node.op == "call_module":
            return _module_params(self.module.get_submodule(node.target), args, kwargs)
        if node.op == "call_method":
            return _method_params(args, kwargs)
        return _function_params(node.target, args, kwargs)

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op not in _CALL_OPS or n.meta.get(RUNTIME_CHECK):
            # the graph checking its inputs runs, unrecorded: not a call of the model
            return super().run_node(n)
        set_node = getattr(self, "_set_current_node", None)
        with set_node(n) if set_node is not None else contextlib.nullcontext():
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            recorder = self.recorder
            params = {k: recorder.summarize(v) for k, v in self._params(n, args, kwargs).items()}
            start = time.perf_counter_ns()
            output = getattr(self, n.op)(n.target, args, kwargs)
            end = time.perf_counter_ns()
        target, aliases = self._info(n)
        call = TraceCall(
            n.name,
            target,
            params,
            recorder.summarize(output),
            end - start,
            n.op,
            run=recorder.current_run,
            aliases=aliases,
            start_ns=start,
        )
        if n in self._module_outputs:
            call.weak_aliases = (self._module_outputs[n],)
        recorder.add(self.stage, call)
        return output


def _module_output_nodes(graph: torch.fx.Graph) -> dict[torch.fx.Node, str]:
    """The last node run inside each module according to ``meta["nn_module_stack"]``.

    When a tracer inlines a leaf module (``Linear`` becomes ``F.linear``), that node
    usually computes the module's output: it lets eager calls be matched to graph nodes.
    """
    last: dict[str, torch.fx.Node] = {}
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack") if node.op in _CALL_OPS else None
        if not stack:
            continue
        innermost = list(stack.values())[-1]
        path = innermost[0] if isinstance(innermost, tuple) else None
        if isinstance(path, str) and path:
            last[path] = node
    return {node: path for path, node in last.items() if node.op != "call_module"}


def _placeholder_values(gm: torch.fx.GraphModule, args: tuple, kwargs: dict) -> tuple:
    """Positional placeholder values for ``Interpreter.run`` from a model-style call."""
    if not kwargs:
        return args
    try:
        bound = bound_parameters(gm.forward, args, kwargs, defaults=True)
    except TypeError as e:
        signature = pyinspect.signature(gm.forward)
        raise TypeError(f"inputs do not match the graph's signature {signature}: {e}") from e
    values: list[Any] = []
    for parameter, value in bound:
        if parameter.kind == pyinspect.Parameter.VAR_POSITIONAL:
            values.extend(value)
        else:
            values.append(value)
    return tuple(values)


def trace_graph_module(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    dynamic_shapes: Any = None,
    runtime_checks: bool = True,
) -> torch.fx.GraphModule:
    """Capture ``model`` with yobx's ``CustomTracer``.

    :param model: the model (a GraphModule is returned as it is)
    :param args: positional example inputs
    :param kwargs: keyword example inputs
    :param dynamic_shapes: torch.export's format, given to the tracer
    :param runtime_checks: the graph checks its inputs' sizes (``CustomTracer``'s
        option); ``to_onnx`` captures without, and versions that compute alike then
        share a branch: the graph compared with its ONNX model must be captured the
        same way for their values to be matched by name
    :raises TypeError: the inputs do not match ``model.forward``'s signature
    """
    if isinstance(model, torch.fx.GraphModule):
        return model
    from yobx.torch.tracing import CustomTracer

    named = _signature_names(model.forward, args, kwargs)
    if named is None:
        raise TypeError(f"inputs do not match {type(model).__name__}.forward's signature")
    tracer = CustomTracer(runtime_checks=runtime_checks)
    graph = tracer.trace(model, concrete_args=named, dynamic_shapes=dynamic_shapes)
    return torch.fx.GraphModule(tracer.traced_model, graph)


# Runs ---------------------------------------------------------------------------------


def _input_sets(args: tuple, kwargs: dict, inputs: Sequence[Any] | None) -> list[tuple]:
    runs: list[tuple[tuple, dict]] = []
    if args or kwargs or not inputs:
        runs.append((tuple(args), dict(kwargs)))
    for item in inputs or ():
        if isinstance(item, dict):
            runs.append(((), dict(item)))
        elif (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], (tuple, list))
            and isinstance(item[1], dict)
        ):
            runs.append((tuple(item[0]), dict(item[1])))
        elif isinstance(item, (tuple, list)):
            runs.append((tuple(item), {}))
        else:
            runs.append(((item,), {}))
    return runs


def _resolve_stages(
    stages: Sequence[str] | None, is_graph_module: bool, onnx_model: Any
) -> list[str]:
    if stages is None:
        resolved = ["graph"] if is_graph_module else ["eager", "graph"]
        if onnx_model is not None:
            resolved.append("onnx")
        return resolved
    resolved = [stages] if isinstance(stages, str) else list(stages)
    unknown = [s for s in resolved if s not in KNOWN_STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; valid stages are {list(KNOWN_STAGES)}")
    if "onnx" in resolved and onnx_model is None:
        raise ValueError("stage 'onnx' needs an ONNX model: pass onnx_model=")
    return resolved


def record_run(
    model_or_graph_module: torch.nn.Module,
    *args: Any,
    stages: Sequence[str] | None = None,
    graph_module: torch.fx.GraphModule | None = None,
    onnx_model: Any = None,
    inputs: Sequence[Any] | None = None,
    max_calls: int | None = None,
    keep_tensors: bool = True,
    profile: str | None = None,
    dynamic_shapes: Any = None,
    **kwargs: Any,
) -> TraceResult:
    """Run inputs through the pipeline and record every call with its values and duration.

    Stages, in this order:

    * ``eager``: every leaf module of the model (via forward hooks), with its inputs named
      after ``forward``'s parameters and its outputs;
    * ``graph``: every ``call_function``/``call_method``/``call_module`` node of the FX
      graph (``graph_module``, the model itself when it is a GraphModule, or a new trace);
    * ``onnx``: every node of the top-level ONNX graph, its outputs read back from
      onnxruntime and named after the FX node of the same name where there is one.

    Functions decorated with :func:`trace_func` add their calls while the recording runs.

    :param model_or_graph_module: the model, or a GraphModule (then only ``graph`` and
        ``onnx`` are recorded by default)
    :param args: positional inputs of the first run
    :param stages: stages to record, default ``eager``, ``graph`` and ``onnx`` if given
    :param graph_module: the traced graph of the model; traced with ``CustomTracer``
        (or ``torch.fx.symbolic_trace`` when unavailable) if missing
    :param onnx_model: ``onnx.ModelProto``, path, or an object with ``.model_proto``
    :param inputs: more input sets, each a tuple of positional inputs, a dict of keyword
        inputs or an ``(args, kwargs)`` pair
    :param max_calls: record at most that many calls per stage (the rest still runs)
    :param keep_tensors: keep copies of the tensors so that summaries give the full value
        (needed by :func:`compare` to measure differences beyond digests)
    :param profile: write a Chrome trace file with one event per stage, run and call,
        and memory/node-count counters
    :param dynamic_shapes: passed to the tracer when the graph has to be traced; by
        default, every axis whose size differs between the input sets is dynamic
    :param kwargs: keyword inputs of the first run
    :return: the :class:`TraceResult`; if a run raises, the exception propagates with
        the partial result in its ``yobx_trace_result`` attribute
    :raises TypeError, ValueError: not a module, an unknown stage, ``onnx`` without model

    Example (record the eager modules and the traced graph, then compare them)::

        >>> import torch
        >>> from yobx.torch.inspect import record_run
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> result = record_run(model, torch.randn(2, 4))
        >>> result.keys()
        ['eager', 'graph']
        >>> result.compare("eager", "graph").first_divergence is None
        True
    """
    model = model_or_graph_module
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"record_run expects a torch.nn.Module, got {type(model).__name__}")
    is_graph_module = isinstance(model, torch.fx.GraphModule)
    stage_names = _resolve_stages(stages, is_graph_module, onnx_model)
    runs = _input_sets(args, kwargs, inputs)
    if "graph" in stage_names and graph_module is None:
        # Traced before recording starts: decorated functions called with proxies while
        # tracing must not be recorded.
        first_args, first_kwargs = runs[0]
        if dynamic_shapes is None:
            # the graph runs every input set: the axes whose size differs are dynamic
            named_runs = [_signature_names(model.forward, a, k) for a, k in runs]
            if all(named is not None for named in named_runs):
                dynamic_shapes = varying_dynamic_shapes(named_runs)
        graph_module = trace_graph_module(
            model, first_args, first_kwargs, dynamic_shapes, runtime_checks=onnx_model is None
        )
    result = TraceResult()
    handler = JSONTraceHandler(profile, process_name="yobx record_run") if profile else None
    recorder = Recorder(result, keep_tensors, max_calls, handler)
    recorder.module_names = {id(m): n for n, m in model.named_modules()}
    _record_stages(recorder, stage_names, model, runs, graph_module, onnx_model)
    return result


def _record_stages(
    recorder: Recorder,
    stage_names: list[str],
    model: torch.nn.Module,
    runs: list[tuple[tuple, dict]],
    graph_module: torch.fx.GraphModule | None,
    onnx_model: Any,
) -> None:
    """Records every stage into ``recorder.result``, one recording at a time in the
    process; the profile is written even when a run raises (the exception then carries
    the partial result in ``yobx_trace_result``)."""
    global _ACTIVE
    result, handler = recorder.result, recorder.handler
    if not _RECORD_LOCK.acquire(blocking=False):
        if _ACTIVE is not None and _ACTIVE.is_recording_thread():
            raise RuntimeError("record_run cannot be nested in another record_run")
        _RECORD_LOCK.acquire()
    failed = False
    try:
        _ACTIVE = recorder
        result.inputs = [(recorder.summarize(list(a)), recorder.summarize(k)) for a, k in runs]
        if handler is not None:
            handler.set_thread_name("record_run")
        for stage_name in stage_names:
            stage = recorder.stage(stage_name)
            recorder.current_stage = stage
            with _stage_event(handler, stage):
                _record_stage(stage_name, model, runs, recorder, stage, graph_module, onnx_model)
            recorder.current_stage = None
    except BaseException as e:
        failed = True
        with contextlib.suppress(Exception):
            e.yobx_trace_result = result
        raise
    finally:
        _ACTIVE = None
        recorder.cache.clear()
        _RECORD_LOCK.release()
        if handler is not None:
            # A partial profile helps to see where a failing run stopped; writing it must
            # not hide the run's own exception.
            try:
                result.profile_path = handler.write()
            except OSError:
                if not failed:
                    raise


@contextlib.contextmanager
def _stage_event(handler: JSONTraceHandler | None, stage: TraceStage):
    if handler is None:
        yield
        return
    start = time.perf_counter_ns()
    handler.record_rss(start, current_rss_bytes())
    try:
        yield
    finally:
        end = time.perf_counter_ns()
        handler.process_complete_event(
            f"stage:{stage.name}", "stage", start, end - start, args={"calls": len(stage)}
        )
        handler.record_rss(end, current_rss_bytes())
        handler.process_counter_event("calls", "stage", end, {stage.name: len(stage)})


@contextlib.contextmanager
def _run_event(recorder: Recorder, stage: TraceStage, run: int):
    recorder.current_run = run
    start = time.perf_counter_ns()
    try:
        yield
    finally:
        end = time.perf_counter_ns()
        stage.run_durations_ns.append(end - start)
        if recorder.handler is not None:
            recorder.handler.process_complete_event(
                f"{stage.name} run {run}", "run", start, end - start, args={"run": run}
            )


def _record_stage(
    stage_name: str,
    model: torch.nn.Module,
    runs: list[tuple[tuple, dict]],
    recorder: Recorder,
    stage: TraceStage,
    graph_module: torch.fx.GraphModule | None,
    onnx_model: Any,
) -> None:
    if stage_name == "eager":
        with _eager_hooks(model, recorder, stage), torch.no_grad():
            for run, (args, kwargs) in enumerate(runs):
                with _run_event(recorder, stage, run):
                    output = model(*args, **kwargs)
                stage.outputs.append(recorder.summarize(output))
    elif stage_name == "graph":
        gm = graph_module
        recorder.result.graph_module = gm
        interpreter = _RecordingInterpreter(gm, recorder, stage)
        with torch.no_grad():
            for run, (args, kwargs) in enumerate(runs):
                with _run_event(recorder, stage, run):
                    output = interpreter.run(*_placeholder_values(gm, args, kwargs))
                stage.outputs.append(recorder.summarize(output))
    elif stage_name == "onnx":
        from .onnx_stage import capture_mismatch, load_onnx_model, record_onnx_stage

        gm = getattr(recorder.result, "graph_module", None) or graph_module
        fx_names = _fx_names(gm if gm is not None else model)
        proto = load_onnx_model(onnx_model)
        note = capture_mismatch(proto, gm)
        if note is not None:
            stage.notes.append(note)
        record_onnx_stage(
            proto, model, runs, recorder, stage, fx_names, _run_event, match_names=note is None
        )


def _fx_names(model: torch.nn.Module) -> set[str]:
    if isinstance(model, torch.fx.GraphModule):
        return {n.name for n in model.graph.nodes}
    return set()
