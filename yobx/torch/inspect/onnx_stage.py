"""The ``onnx`` stage of a recorded run: intermediate results read back from onnxruntime.

Every output of every top-level node becomes an extra graph output of a copy of the
model, so onnxruntime returns it; the per-node kernel times come from onnxruntime's own
profiler. Values inside subgraphs (``If``/``Loop`` bodies) and inside local functions are
not reachable this way: the calling node is recorded with its outputs.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch
import torch.utils._pytree as pytree
from onnx import numpy_helper

from .results import TraceCall, TraceStage


def load_onnx_model(onnx_model: Any) -> onnx.ModelProto:
    """An ``onnx.ModelProto`` from a proto, a path, or an object with ``.model_proto``."""
    if isinstance(onnx_model, onnx.ModelProto):
        return onnx_model
    if isinstance(onnx_model, (str, os.PathLike)):
        if not os.path.exists(onnx_model):
            raise FileNotFoundError(f"ONNX model {os.fspath(onnx_model)!r} does not exist")
        return onnx.load(os.fspath(onnx_model))
    proto = getattr(onnx_model, "model_proto", None)
    if isinstance(proto, onnx.ModelProto):
        return proto
    import onnx_ir  # a dependency (onnxscript's)

    if isinstance(onnx_model, onnx_ir.Model):
        return onnx_ir.serde.serialize_model(onnx_model)
    raise TypeError(
        f"cannot read an ONNX model from {type(onnx_model).__name__}: "
        "give an onnx.ModelProto, a path, or an object with a model_proto attribute"
    )


def capture_mismatch(proto: onnx.ModelProto, graph_module: Any) -> str | None:
    """Explains why ONNX values cannot be matched to the graph's nodes by name, if so.

    ``yobx.torch.to_onnx`` stores the fingerprint of the graph it captured; a graph
    captured differently (other dynamic shapes, other model) reuses node names for
    other computations, and matching by name would compare unrelated values.
    """
    from yobx.torch.onnx.export import GRAPH_FINGERPRINT_KEY
    from yobx.torch.tracing import graph_fingerprint

    stored = {p.key: p.value for p in proto.metadata_props}.get(GRAPH_FINGERPRINT_KEY)
    if stored is None or not isinstance(graph_module, torch.fx.GraphModule):
        return None
    if stored == graph_fingerprint(graph_module.graph):
        return None
    return (
        "the ONNX model was exported from another capture of the model (its graph "
        "fingerprint differs, e.g. other dynamic shapes): its values are not matched to "
        "graph nodes by name, only final outputs are compared; export it with the same "
        "inputs and dynamic shapes to compare node by node"
    )


def with_intermediate_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` whose graph also outputs every top-level node's outputs.

    Nodes without a name, or with a name already used, get a unique one so that
    onnxruntime's profile can be matched back to them.

    :return: the copy and the names of the nodes in graph order
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(copy)
        known_types = {vi.name: vi for vi in inferred.graph.value_info}
    except Exception:
        # Custom domains or invalid shapes: outputs without a type are accepted as well.
        known_types = {}
    existing = {o.name for o in copy.graph.output}
    used_names: set[str] = set()
    node_names = []
    for index, node in enumerate(copy.graph.node):
        if not node.name or node.name in used_names:
            node.name = f"{node.op_type}_yobx_{index}"
        used_names.add(node.name)
        node_names.append(node.name)
        for output in node.output:
            if output and output not in existing:
                info = onnx.ValueInfoProto()
                if output in known_types:
                    info.CopyFrom(known_types[output])
                else:
                    info.name = output
                copy.graph.output.append(info)
                existing.add(output)
    return copy, node_names


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        try:
            import ml_dtypes
        except ImportError as e:
            raise TypeError("feeding bfloat16 inputs to onnxruntime needs ml_dtypes") from e

        return tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _to_torch(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biufc" or value.dtype == np.bool_:
            # A copy when read-only (initializers): torch warns on non-writable arrays.
            array = np.ascontiguousarray(value)
            return torch.from_numpy(array if array.flags.writeable else array.copy())
        if value.dtype.itemsize == 2 and "bfloat16" in str(value.dtype):
            return torch.from_numpy(value.view(np.uint16)).view(torch.bfloat16)
    if isinstance(value, list):
        return [_to_torch(v) for v in value]
    return value


def onnx_feeds(
    input_names: list[str], model: torch.nn.Module, args: tuple, kwargs: dict
) -> dict[str, np.ndarray]:
    """Map a model-style call to the ONNX inputs: by name first, else by flattened order."""
    from yobx.torch.tracing.inputs import bind_arguments

    try:
        named = bind_arguments(model.forward, args, kwargs)
    except TypeError:
        named = None
    if named and input_names and all(isinstance(named.get(n), torch.Tensor) for n in input_names):
        return {n: _to_numpy(named[n]) for n in input_names}
    source = list(named.values()) if named else [args, kwargs]
    flat = [v for v in pytree.tree_leaves(source) if isinstance(v, torch.Tensor)]
    if len(flat) != len(input_names):
        raise ValueError(
            f"the ONNX model expects inputs {input_names} but the call gives {len(flat)} "
            "tensors whose names do not match"
        )
    return {n: _to_numpy(t) for n, t in zip(input_names, flat)}


def _kernel_times(profile_file: str) -> list[dict[str, tuple[float, float]]]:
    """Per run (``model_run`` event), node name -> (offset from run start, duration) in us."""
    with open(profile_file) as f:
        events = json.load(f)
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: float(e["ts"]))
    per_run: list[dict[str, tuple[float, float]]] = [{} for _ in runs]
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        ts = float(event["ts"])
        node_name = event["name"][: -len("_kernel_time")]
        for index, run in enumerate(runs):
            if float(run["ts"]) <= ts <= float(run["ts"]) + float(run["dur"]):
                per_run[index][node_name] = (ts - float(run["ts"]), float(event["dur"]))
                break
    return per_run


def _profiling_session(model: onnx.ModelProto) -> tuple[Any, str]:
    """An onnxruntime session profiling every node (no fusion: every node of the model
    runs as itself, so its kernel time is its own), and its profile directory."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_profiling = True
    profile_dir = tempfile.mkdtemp(prefix="yobx_ort_")
    options.profile_file_prefix = os.path.join(profile_dir, "ort")
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session, profile_dir


def _node_params(
    node: onnx.NodeProto,
    values: dict[str, Any],
    initializers: dict[str, onnx.TensorProto],
    initializer_summaries: dict[str, Any],
    recorder: Any,
) -> dict[str, Any]:
    """The summaries of a node's inputs, by name; an initializer is summarized once."""
    params = {}
    for input_name in node.input:
        if not input_name:
            continue
        if input_name in values:
            params[input_name] = recorder.summarize(values[input_name])
        elif input_name in initializers:
            if input_name not in initializer_summaries:
                array = numpy_helper.to_array(initializers[input_name])
                initializer_summaries[input_name] = recorder.summarize(_to_torch(array))
            params[input_name] = initializer_summaries[input_name]
    return params


def _call_name(
    node: onnx.NodeProto, node_name: str, fx_names: set[str], match_names: bool
) -> tuple[str, tuple[str, ...]]:
    """The name of a node's call (the FX node it computes, when there is one) and its
    aliases; ``onnx:<value>`` without aliases when names must not match."""
    matched = [o for o in node.output if o in fx_names]
    if not matched and node_name in fx_names:
        matched = [node_name]
    name = matched[0] if matched else (node.output[0] if node.output else node_name)
    aliases = (*node.output, node_name)
    if not match_names:
        name, aliases = f"onnx:{name}", ()
    return name, aliases


def record_onnx_stage(
    onnx_model: Any,
    model: torch.nn.Module,
    runs: list[tuple[tuple, dict]],
    recorder: Any,
    stage: TraceStage,
    fx_names: set[str],
    run_event: Callable,
    match_names: bool = True,
) -> None:
    """Run every input set with onnxruntime and record one call per top-level node.

    With ``match_names=False`` (the ONNX model comes from another capture, see
    :func:`capture_mismatch`) calls are named ``onnx:<value>`` and carry no alias, so
    that no comparison pairs them with a graph node by name.
    """
    import time

    import onnxruntime  # noqa: F401 - without it, fail before reading the model

    proto = load_onnx_model(onnx_model)
    copy, node_names = with_intermediate_outputs(proto)
    session, profile_dir = _profiling_session(copy)
    input_names = [i.name for i in session.get_inputs()]
    output_names = [o.name for o in session.get_outputs()]
    original_outputs = [o.name for o in proto.graph.output]
    initializers = {init.name: init for init in copy.graph.initializer}

    run_values: list[tuple[int, dict[str, Any]]] = []
    for run, (args, kwargs) in enumerate(runs):
        feeds = onnx_feeds(input_names, model, args, kwargs)
        with run_event(recorder, stage, run):
            start = time.perf_counter_ns()
            results = session.run(None, feeds)
        values = {name: _to_torch(v) for name, v in feeds.items()}
        values.update({name: _to_torch(v) for name, v in zip(output_names, results)})
        run_values.append((start, values))
        outputs = [values[n] for n in original_outputs]
        stage.outputs.append(recorder.summarize(outputs[0] if len(outputs) == 1 else outputs))
    profile_file = session.end_profiling()
    try:
        kernel_times = _kernel_times(profile_file)
    finally:
        os.remove(profile_file)
        os.rmdir(profile_dir)

    initializer_summaries: dict[str, Any] = {}
    for run, (run_start, values) in enumerate(run_values):
        times = kernel_times[run] if run < len(kernel_times) else {}
        recorder.current_run = run
        for node, node_name in zip(copy.graph.node, node_names):
            params = _node_params(node, values, initializers, initializer_summaries, recorder)
            outputs = [recorder.summarize(values.get(o)) for o in node.output]
            name, aliases = _call_name(node, node_name, fx_names, match_names)
            target = (
                node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            )
            offset_us, duration_us = times.get(node_name, (None, None))
            recorder.add(
                stage,
                TraceCall(
                    name,
                    target,
                    params,
                    outputs[0] if len(outputs) == 1 else tuple(outputs),
                    None if duration_us is None else round(duration_us * 1000),
                    "onnx",
                    run=run,
                    aliases=aliases,
                    start_ns=None if offset_us is None else run_start + round(offset_us * 1000),
                    output_names=tuple(node.output),
                ),
            )
