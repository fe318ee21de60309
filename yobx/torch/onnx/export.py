"""``to_onnx``: capture, clean, lower, translate, optimize and check a model."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import onnx
import onnx_ir as ir
import torch

from yobx.torch.chrome_trace import write_stage_profile
from yobx.torch.frozen_gc import frozen_during_call
from yobx.torch.onnx import capture as capture_module
from yobx.torch.onnx import mistakes
from yobx.torch.onnx.declared import (
    adopt_lowering_guards,
    check_declared_dimensions,
    declared_dimensions,
    refuse_translation_guards,
    remove_numeric_dim_params,
)
from yobx.torch.onnx.dimensions import (
    DimensionRenamer,
    dynamic_dimensions,
    rename_dimensions,
)
from yobx.torch.onnx.errors import OnnxExportError
from yobx.torch.onnx.lowering import lower_to_aten
from yobx.torch.onnx.opsets import DEFAULT_OPSET, check_opset, convert_opset, supported_opsets
from yobx.torch.onnx.optimize import (
    arrange_branches,
    check_optimize_level,
    fuse_for_onnxruntime,
    optimize_model,
)
from yobx.torch.onnx.runtime_checks import (
    RUNTIME_CHECKS_KEY,
    ModelCheck,
    add_runtime_checks,
    checks_to_json,
)
from yobx.torch.onnx.save import (
    EXTERNAL_DATA_THRESHOLD,
    check_model,
    model_to_proto,
    save_ir_model,
)
from yobx.torch.onnx.translate import build_model
from yobx.torch.onnx.value_checks import gate_value_checks
from yobx.torch.onnx.version_guards import check_version_lowering_guards, version_snapshots
from yobx.torch.onnx.weight_layout import store_weights_transposed
from yobx.torch.onnx.weights import (
    AppliedWeights,
    WeightNames,
    apply_weights,
    mark_pending,
    weight_bytes,
    weights_kept_apart,
)
from yobx.torch.passes import MUTATIONS_KEY
from yobx.torch.quiet_logs import quieted
from yobx.torch.stages import Stage, StageRecorder
from yobx.torch.tracing.dynamic_shapes import UNBOUNDED

#: the metadata key of an ONNX input naming the placeholder it feeds (its target): the
#: input's name may differ (a cache's tensors, dimensions renamed, a builtin's name)
PLACEHOLDER_KEY = "yobx.placeholder"


@dataclasses.dataclass
class ExportResult:
    """What :func:`to_onnx` produced.

    The ONNX model is held as an ``onnx_ir`` model (:attr:`model`), whose initializers
    wrap the model's parameters without copying them; :attr:`model_proto` serializes
    it on first use (models under 2 GB with their weights). A model exported from the
    meta device has no weight data until :meth:`apply_weights`.

    :param model: the ONNX model as an ``onnx_ir`` model
    :param graph_module: the captured torch-level graph (after the passes)
    :param guards: the assumptions the capture made
    :param stages: per-stage timings, in order
    :param input_names: ONNX input names (the flat inputs)
    :param output_names: ONNX output names (the flat outputs)
    :param dynamic_dimensions: names of the dynamic dimensions of inputs and outputs
    :param dimension_names: ShapeEnv symbol name -> the user's dimension name
    :param validation: the validation report when ``validate=True``
    :param filename: where the model was saved, if it was
    :param constraints: facts on dynamic dimensions the capture adopted from the example
        (also in the model's ``metadata_props["yobx.constraints"]``): the model is
        right for inputs satisfying them
    :param range_constraints: the range of every named dimension
    :param weight_names: the state-dict names of the initializers
    :param files: the files :meth:`save` wrote (the model, its external data)
    :param runtime_checks: the conditions the ONNX model checks on its inputs' sizes
        (declared ranges, ``torch._check`` calls, adopted constraints), each failing
        onnxruntime with an error naming it when broken; empty with
        ``to_onnx(runtime_checks=False)``
    """

    model: ir.Model
    graph_module: torch.fx.GraphModule
    guards: list[Any]
    stages: list[Stage]
    input_names: list[str]
    output_names: list[str]
    dynamic_dimensions: list[str]
    dimension_names: dict[str, str]
    validation: Any = None
    filename: str | None = None
    constraints: list[Any] = dataclasses.field(default_factory=list)
    range_constraints: dict[str, tuple] = dataclasses.field(default_factory=dict)
    weight_names: WeightNames = dataclasses.field(default_factory=WeightNames)
    files: list[str] = dataclasses.field(default_factory=list)
    runtime_checks: list[ModelCheck] = dataclasses.field(default_factory=list)
    #: why the model holds the example's side only though versions were captured
    version_fallback: str = ""
    _captured: Any = dataclasses.field(default=None, repr=False)
    _proto: onnx.ModelProto | None = dataclasses.field(default=None, repr=False)
    #: inside :meth:`computing_as` (the quantized products computing exactly), the copy
    #: of the saved file onnxruntime loads instead of it; "" until made
    _exact_file: str | None = dataclasses.field(default=None, repr=False)

    @property
    def model_proto(self) -> onnx.ModelProto:
        """The model as an ``onnx.ModelProto`` with inferred shapes, built on first use.

        :raises WeightsNotAppliedError: weights of a meta model were not applied
        :raises ValueError: the weights exceed 2 GB (use :attr:`model` or the file)
        """
        if self._proto is None:
            self._proto = model_to_proto(self.model)
        return self._proto

    @property
    def versions(self) -> list[Any]:
        """The versions of the capture the model chooses between (an ``If`` on the
        inputs' sizes), each with the conditions selecting it; empty for one capture
        (see :mod:`yobx.torch.tracing.constraints.versions`)."""
        tracer = getattr(self._captured, "tracer", None)
        return list(getattr(tracer, "versions", []) or [])

    @property
    def version_notes(self) -> list[str]:
        """Why undecided decisions stayed constraints instead of versions."""
        tracer = getattr(self._captured, "tracer", None)
        notes = list(getattr(tracer, "version_notes", []) or [])
        return [self.version_fallback, *notes] if self.version_fallback else notes

    @property
    def input_placeholders(self) -> dict[str, str]:
        """ONNX input name -> the placeholder (its target in :attr:`graph_module`)
        it feeds: the flat position of the input among the model's arguments, which
        :func:`yobx.torch.tracing.inputs.placeholder_names` lists."""
        return {
            value.name: value.meta[PLACEHOLDER_KEY]
            for value in self.model.graph.inputs
            if PLACEHOLDER_KEY in value.meta
        }

    @property
    def n_graph_nodes(self) -> int:
        """Number of computing nodes in the captured graph."""
        return sum(
            n.op in ("call_function", "call_method", "call_module")
            for n in self.graph_module.graph.nodes
        )

    @property
    def n_onnx_nodes(self) -> int:
        """Number of nodes in the main ONNX graph."""
        return len(self.model.graph)

    @property
    def weight_bytes(self) -> int:
        """Total size of the initializers in bytes."""
        return weight_bytes(self.model)

    @property
    def duration_s(self) -> float:
        """Total time of all stages in seconds."""
        return sum(stage.duration_s for stage in self.stages)

    def _stage(self, name: str) -> Any:
        """A stage after the export (weights, save, validate...), among its stages."""
        recorder = StageRecorder()
        recorder.stages = self.stages
        return recorder(name)

    def apply_weights(self, source: Any, strict: bool = True) -> AppliedWeights:
        """Gives the initializers their data from ``source``, read when saving.

        :param source: a state dict, a ``.safetensors`` file, a list of shard files, a
            Hugging Face ``model.safetensors.index.json``, or a directory holding one
        :param strict: every weight of the checkpoint's kind must be found and every
            name of the source must be a parameter or buffer of the model
        :return: which initializer took which tensor, and what was left
        :raises WeightsMismatchError: missing or unexpected names, other shapes or
            dtypes (nothing is changed then)
        :raises WeightSourceError: the source cannot be read (missing file, bad index)

        Buffers computed in ``__init__`` (non-persistent, absent from checkpoints) are
        taken from the source when it has them, else they keep the values the model
        computed; see :func:`yobx.torch.onnx.weights.empty_weights`.
        """
        with self._stage("weights") as info:
            applied = apply_weights(self.model, self.weight_names, source, strict=strict)
            info["applied"] = len(applied.applied)
        self._proto = None
        return applied

    def quantize(self, block_size: int = 32, accuracy_level: int = 0) -> int:
        """Quantizes the weights of the linear layers to 4 bits (onnxruntime's
        ``MatMulNBits``, blocks of ``block_size``, symmetric), as
        ``to_onnx(quantize="int4")`` does; after :meth:`apply_weights` for a model
        exported on the meta device. :meth:`validate` then compares onnxruntime with
        the eager model on the dequantized weights (see :mod:`yobx.torch.onnx.quantize`).

        :param accuracy_level: the type the products compute in
            (:data:`~yobx.torch.onnx.quantize.ACCURACY_LEVELS`; 4: int8 activations,
            faster, not exact; the validation checks the graph at level 0)

        :return: how many matrix multiplications were quantized
        :raises OnnxExportError: weights without data, or quantized already
        """
        from yobx.torch.onnx.quantize import (
            check_block_size,
            nested_quantized_nodes,
            quantize_model,
        )

        with self._stage("quantize") as info:
            self.model, count = quantize_model(
                self.model,
                check_block_size(block_size),
                self.weight_names.names,
                accuracy_level=accuracy_level,
            )
            info["quantized"] = count
        self._proto = None
        nested = nested_quantized_nodes(self.model)
        if nested:
            warnings.warn(
                f"{nested} of the {count} quantized matrix multiplications are in versions "
                f"of the capture nested two levels deep or more (ExportResult.versions); "
                f"onnxruntime does not prepack their 4-bit weights there and they run "
                f"about ten times slower; narrowing='constraints' (one version, its "
                f"constraints checked) avoids it",
                stacklevel=2,
            )
        return count

    def save(self, filename: str | os.PathLike, external_data: bool | None = None) -> None:
        """Saves the model, streaming the weights tensor by tensor.

        :param filename: the ONNX file
        :param external_data: ``True`` puts every initializer above 1 KB in
            ``<filename>.data`` (offsets of large tensors aligned for memory mapping),
            ``False`` keeps everything in one file (under 2 GB), ``None`` decides by
            size (outside past 2 GB)
        :raises WeightsNotAppliedError: a meta model whose weights were not applied
        """
        with self._stage("save") as info:
            self.files = save_ir_model(self.model, filename, external_data)
            info["bytes"] = sum(os.path.getsize(f) for f in self.files)
        self.filename = os.fspath(filename)

    def session_source(self) -> onnx.ModelProto | str:
        """What onnxruntime should load: the saved file when the weights are outside it,
        else the proto; a ``ValueError`` past 2 GB when the model was not saved."""
        if self.filename is not None and len(self.files) > 1:
            if self._exact_file is not None:
                return self._exact_copy()
            return self.filename
        if self.weight_bytes >= EXTERNAL_DATA_THRESHOLD:
            if self.filename is None:
                raise ValueError(
                    "a model past 2 GB runs from its file: call save(path) (or give "
                    "to_onnx a filename) before validating it"
                )
            return self.filename
        return self.model_proto

    @contextlib.contextmanager
    def computing_as(self, model: torch.nn.Module) -> Iterator[None]:
        """A context in which the eager ``model`` and this ONNX model compute the same
        (:func:`yobx.torch.onnx.quantize.computing_as`: a quantized model's weights
        dequantized in ``model``, its products at the exact accuracy level); what
        onnxruntime loads inside (:meth:`session_source`, :attr:`model_proto`) is the
        model as it computes there, and as it is saved again after."""
        from yobx.torch.onnx.quantize import computing_as

        self._proto = None
        try:
            with computing_as(model, self.model):
                self._exact_file = ""
                yield
        finally:
            self._proto = None
            if self._exact_file:
                os.remove(self._exact_file)
            self._exact_file = None

    def _exact_copy(self) -> str:
        """The saved model's graph as it computes inside :meth:`computing_as`, written
        beside its file (it reads the same external data file), once."""
        from yobx.torch.onnx.quantize import exact_products

        if not self._exact_file:
            proto = onnx.load(self.filename, load_external_data=False)
            exact = ir.serde.deserialize_model(proto)
            root, extension = os.path.splitext(self.filename)
            self._exact_file = f"{root}.exact{extension}"
            with exact_products(exact):
                onnx.save(ir.serde.serialize_model(exact), self._exact_file)
        return self._exact_file

    def validate(
        self,
        model: torch.nn.Module,
        args: tuple = (),
        kwargs: Mapping[str, Any] | None = None,
        validation_inputs: Sequence[Any] = (),
    ) -> Any:
        """Compares onnxruntime with eager ``model`` on the example inputs and on other
        sizes of the dynamic dimensions (as ``to_onnx(validate=True)``); useful after
        :meth:`apply_weights` and :meth:`save`, with the model holding the weights.

        :param model: the eager model, holding the weights
        :param args: positional inputs (the example the model was exported with)
        :param kwargs: keyword inputs
        :param validation_inputs: more input sets, as for :func:`to_onnx`
        :raises ValueError: this result does not keep its capture
        :raises OnnxExportError: ``model`` has weights on the meta device
        :return: the :class:`~yobx.torch.onnx.validation.ValidationReport`, also kept in
            :attr:`validation`
        """
        from yobx.torch.onnx.validation import validate_export

        if self._captured is None:
            raise ValueError("this result does not keep its capture: it cannot validate")
        _refuse_meta_model(model, "validate it")
        with self._stage("validate") as info:
            self.validation = validate_export(
                model, args, kwargs or {}, self, self._captured, given=validation_inputs
            )
            info["max_abs_error"] = self.validation.max_abs_error
        return self.validation


#: metadata_props key holding the fingerprint of the captured graph
GRAPH_FINGERPRINT_KEY = "yobx.graph_fingerprint"
#: metadata_props key holding the constraints the model assumes of its inputs (JSON)
CONSTRAINTS_KEY = "yobx.constraints"
#: metadata_props key of the ranges of the dynamic dimensions, by the user's names
#: (JSON: ``{"seq": [2, 32], "batch": [2, null]}``, null when unbounded)
DIMENSION_RANGES_KEY = "yobx.dimension_ranges"


def constraints_to_json(constraints: list[Any]) -> str:
    """The constraints as a JSON list of ``{"expression", "kind", "location"}``."""
    import json

    return json.dumps(
        [{"expression": c.expression, "kind": c.kind, "location": c.location} for c in constraints]
    )


def save_model(
    model: onnx.ModelProto | ir.Model,
    filename: str | os.PathLike,
    external_data: bool | None = None,
) -> None:
    """Saves a model, with its weights in ``<filename>.data`` past 2 GB (or as
    ``external_data`` says); an ``onnx_ir`` model is streamed tensor by tensor.

    :raises WeightsNotAppliedError: weights of a meta model were not applied
    """
    if isinstance(model, onnx.ModelProto):
        model = ir.from_proto(model)
    save_ir_model(model, filename, external_data)


def _on_meta(model: torch.nn.Module) -> bool:
    """Whether a weight of the model is on the meta device (eager cannot run it)."""
    return any(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])


def _refuse_meta_model(model: torch.nn.Module, action: str) -> None:
    on_meta = [
        name
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]
        if tensor.device.type == "meta"
    ]
    if on_meta:
        raise OnnxExportError(
            f"cannot {action}: eager PyTorch cannot run a model with weights on the meta "
            f"device ({on_meta[0]!r} and {len(on_meta) - 1} more); export without "
            "validate=True, then apply_weights, save, and validate with a model holding "
            "the weights (yobx.torch.onnx.weights.load_weights_into)"
        )


def _pass_counts(captured: Any) -> dict[str, int]:
    """[passes, issue 11] The counts of the default passes, which the capture ran once."""
    return {name: int(result) for name, result in captured.passes.items()}


#: the name of a cache's tensor: ``<prefix>.<layer>.key|value``, or an encoder-decoder
#: cache's ``<prefix>.<layer>.decoder|encoder.key|value``
_LAYER_TENSOR = re.compile(r"^(.+)\.(\d+)\.(decoder\.|encoder\.)?(key|value)$")


def _rename_cache_inputs(model_ir: ir.Model, model: Any, args: tuple, kwargs: Any) -> None:
    """The tensors of a cache input are ``past_key_values.<layer>.key|value``."""
    from yobx.torch.onnx.cache_names import onnx_input_names

    renamed = onnx_input_names(model, args, kwargs)
    outputs = {value.name for value in model_ir.graph.outputs}
    for value in model_ir.graph.inputs:
        if value.name in renamed:
            if renamed[value.name] in outputs:
                raise OnnxExportError(f"input name {renamed[value.name]!r} is also an output")
            value.name = renamed[value.name]
    _interleave_layers(model_ir.graph.inputs)


def _interleave_layers(values: Any) -> None:
    """A cache's tensors one layer after another (``past_key_values.0.key``,
    ``past_key_values.0.value``, ``past_key_values.1.key``...; an encoder-decoder's
    ``.0.decoder.key``, ``.0.decoder.value``, ``.0.encoder.key``, ``.0.encoder.value``,
    ``.1.decoder.key``...), as Hugging Face's ONNX exports and runtimes list them;
    pytree flattens a DynamicCache keys first. The other values keep their places; the
    cache's tensors fill the places its tensors had, in the new order."""
    matches = [_LAYER_TENSOR.match(v.name) for v in values]
    positions = [i for i, match in enumerate(matches) if match]

    def rank(i: int) -> tuple:
        prefix, layer, part, kind = matches[i].groups()  # type: ignore[union-attr]
        return prefix, int(layer), part == "encoder.", kind == "value"

    ranked = sorted(positions, key=rank)
    if ranked == positions:
        return
    order = list(range(len(values)))
    for position, source in zip(positions, ranked):
        order[position] = source
    reordered = [values[i] for i in order]
    values.clear()
    values.extend(reordered)


def _keep_argument_names(model_ir: ir.Model, graph_module: torch.fx.GraphModule) -> None:
    """An input keeps the name the user wrote: torch.fx names the placeholder of an
    argument called like a Python builtin ``input_1`` (``input``, ``id``...), its target
    stays ``input``."""
    taken = {v.name for v in [*model_ir.graph.inputs, *model_ir.graph.outputs]}
    by_name = {v.name: v for v in model_ir.graph.inputs}
    for node in graph_module.graph.nodes:
        if node.op != "placeholder" or node.name == node.target or node.name not in by_name:
            continue
        if isinstance(node.target, str) and node.target.isidentifier() and node.target not in taken:
            by_name[node.name].name = node.target
            taken.add(node.target)


@contextlib.contextmanager
def _quiet_constant_folding() -> Iterator[None]:
    """Silences the optimizer's per-node warnings ("Skipping constant folding for op
    Split with multiple outputs", once per node): nothing a user can act on."""
    with quieted("onnxscript.optimizer._constant_folding"):
        yield


def _checked_inputs(
    model: Any, args: tuple, kwargs: Mapping[str, Any] | None, validate: bool
) -> tuple[tuple, dict]:
    """``args`` as a tuple, ``kwargs`` as a dict, once the model is known exportable."""
    kwargs = dict(kwargs or {})
    args = mistakes.check_positional_inputs(args)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    mistakes.refuse_numpy_inputs(args, kwargs)
    mistakes.refuse_training_mode(model)
    if validate:
        _refuse_meta_model(model, "validate the export")
    return args, kwargs


def _export_result(
    model: torch.nn.Module,
    ir_model: ir.Model,
    captured: Any,
    stages: list[Stage],
    runtime_checks: list[ModelCheck],
) -> ExportResult:
    """What :func:`to_onnx` returns, before saving and validation."""
    return ExportResult(
        model=ir_model,
        runtime_checks=runtime_checks,
        graph_module=captured.graph_module,
        guards=captured.guards,
        stages=stages,
        input_names=[v.name for v in ir_model.graph.inputs],
        output_names=[v.name for v in ir_model.graph.outputs],
        dynamic_dimensions=dynamic_dimensions(ir_model),
        dimension_names=dict(captured.dimension_names),
        constraints=list(captured.constraints),
        range_constraints=dict(captured.range_constraints),
        weight_names=WeightNames.of(model, ir_model),
        _captured=captured,
    )


def _capture(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    dynamic_shapes: Any,
    module_leaves: Any,
    tracer: str,
    narrowing: str = "versions",
    max_versions: int | None = None,
) -> Any:
    """The ``capture`` stage: the model's graph, with the tracer asked for; a capture
    that fails on a model eager PyTorch cannot run either says so."""
    if tracer not in ("custom", "fx"):
        raise ValueError(f"unknown tracer {tracer!r}, expected 'custom' or 'fx'")
    try:
        if tracer == "custom":
            return capture_module.capture(
                model,
                args,
                kwargs,
                dynamic_shapes,
                module_leaves,
                narrowing=narrowing,
                max_versions=max_versions,
            )
        return capture_module.capture_with_symbolic_trace(model, args, kwargs, dynamic_shapes)
    except Exception:
        if not _on_meta(model):
            mistakes.raise_if_eager_fails(model, args, kwargs)
        raise


def _lower(captured: Any, direct: bool, info: dict) -> Any:
    """The ``lower`` stage: the captured graph in aten operators; the guards the
    lowering adds are judged against what the capture knew."""
    dims = getattr(captured.tracer, "dims", None)
    known = dims.snapshot() if dims is not None else None
    snapshots = version_snapshots(captured.tracer)
    lowered = lower_to_aten(captured.graph_module, opset=DEFAULT_OPSET, direct=direct)
    info["aten_nodes"] = len(lowered.graph_module.graph.nodes)
    info["direct"] = lowered.n_direct
    info["recorded"] = lowered.n_recorded
    adopt_lowering_guards(captured, lowered, known)
    # each version's branch was lowered alone: its decisions, checked where it is chosen
    check_version_lowering_guards(captured, lowered, snapshots, known)
    return lowered


def _translate(
    captured: Any, lowered: Any, model: Any, args: tuple, kwargs: dict, info: dict
) -> tuple[ir.Model, DimensionRenamer, dict[str, ir.Value]]:
    """The ``translate`` stage: the ONNX model, its outputs named after the model's
    output structure, its cache inputs after the layers, its dimensions after the
    user's names; returns the renamer and the ONNX input of each placeholder (by its
    target, which the runtime checks name)."""
    output = next(n for n in captured.graph_module.graph.nodes if n.op == "output")
    output_names = capture_module.output_names(
        captured.out_spec, len(output.args[0]), output.meta.get(MUTATIONS_KEY, ())
    )
    mistakes.refuse_constant_outputs(output.args[0], output_names)
    n_guards = len(captured.shape_env.guards) if captured.shape_env is not None else 0
    ir_model = build_model(lowered, output_names, opset=DEFAULT_OPSET)
    refuse_translation_guards(captured.shape_env, n_guards)
    by_name = dict(zip(lowered.input_names, ir_model.graph.inputs))
    inputs = {
        node.target: by_name[node.name]
        for node in captured.graph_module.graph.nodes
        if node.op == "placeholder" and node.name in by_name
    }
    for target, value in inputs.items():
        value.meta[PLACEHOLDER_KEY] = target
    _rename_cache_inputs(ir_model, model, args, kwargs)
    _keep_argument_names(ir_model, captured.graph_module)
    renamer = _renamer(captured)
    rename_dimensions(ir_model, renamer)
    # parameters on the meta device: the graph is exported, the data comes later
    info["pending_weights"] = mark_pending(ir_model)
    info["onnx_nodes"] = len(ir_model.graph)
    return ir_model, renamer, inputs


def _renamer(captured: Any) -> DimensionRenamer:
    """The names of the ONNX model's dimensions: the user's, from the capture."""
    dims = getattr(captured.tracer, "dims", None)
    if dims is None:
        return DimensionRenamer(dict(captured.dimension_names), captured.shape_env)
    data_dependent = {k: v for k, v in captured.dimension_names.items() if k not in dims.names}
    return DimensionRenamer.for_capture(dims, data_dependent)


def _optimize(ir_model: ir.Model, opset: int) -> list[str]:
    """The ``optimize`` stage: onnxscript's optimizer, then the opset asked for; returns
    the names of the weights (the initializers before the optimizer lifts constants)."""
    # parameters and buffers stay initializers named after the state dict
    weights = list(ir_model.graph.initializers)
    with _quiet_constant_folding(), weights_kept_apart(ir_model, weights):
        optimize_model(ir_model)
        if opset != DEFAULT_OPSET:
            convert_opset(ir_model, opset)
    return weights


def _check(ir_model: ir.Model, declared: Any, renamer: Any, captured: Any, lowered: Any) -> None:
    """The ``check`` stage: declared dimensions kept, metadata written, model valid."""
    remove_numeric_dim_params(ir_model)
    check_declared_dimensions(ir_model, declared, renamer, captured, lowered)
    if captured.fingerprint:
        # ONNX values are named after the graph's nodes: tools matching them by name
        # (yobx.torch.inspect) check that they look at the same capture.
        ir_model.metadata_props[GRAPH_FINGERPRINT_KEY] = captured.fingerprint
    if captured.range_constraints:
        # a declared maximum (Dim("seq", max=32)) is part of what the model accepts
        ir_model.metadata_props[DIMENSION_RANGES_KEY] = json.dumps(
            {
                name: [int(low), None if high == float("inf") or high >= UNBOUNDED else int(high)]
                for name, (low, high) in sorted(captured.range_constraints.items())
            }
        )
    if captured.constraints:
        # what the model assumes of its inputs, for tools reading it (the runtime
        # checks, when there are, enforce it)
        ir_model.metadata_props[CONSTRAINTS_KEY] = constraints_to_json(captured.constraints)
    # on the graph without its weights: nothing is copied, whatever the size
    check_model(ir_model)


def _fuse(ir_model: ir.Model, weights: list[str], dimensions: tuple) -> dict[str, int]:
    """The ``fuse`` stage of ``optimize="ort"``: onnxscript's fusions for onnxruntime;
    returns how many times each applied.

    :param weights: the initializers kept out of the fusions' reach (the constants
        the optimizer lifted stay visible: the fusions read them)
    :param dimensions: ``(declared, renamer, captured, lowered)``, to check again that
        the declared dimensions are still dynamic
    """
    with _quiet_constant_folding():
        with weights_kept_apart(ir_model, weights):
            fusions = fuse_for_onnxruntime(ir_model)
        remove_numeric_dim_params(ir_model)
        check_declared_dimensions(ir_model, *dimensions)
    return fusions


def _add_checks(
    stage: StageRecorder, ir_model: ir.Model, captured: Any, inputs: dict[str, ir.Value]
) -> list[ModelCheck]:
    """The ``runtime_checks`` stage: the model checks its constraints on its inputs
    (:mod:`yobx.torch.onnx.runtime_checks`)."""
    with stage("runtime_checks") as info:
        checks = add_runtime_checks(ir_model, captured.tracer, inputs)
        if checks:
            ir_model.metadata_props[RUNTIME_CHECKS_KEY] = checks_to_json(checks)
        info["checks"] = len(checks)
    return checks


def _optimize_and_check(
    stage: StageRecorder,
    ir_model: ir.Model,
    opset: int,
    optimize: str,
    dimensions: tuple,
    checked_inputs: dict[str, ir.Value] | None,
) -> list[ModelCheck]:
    """The ``optimize`` and ``check`` stages, then ``fuse`` with ``optimize="ort"``, and
    the ``runtime_checks`` stage after the optimizations (which would fold or fuse
    through the gates of the inputs) when ``checked_inputs`` is given; returns the
    runtime checks added.

    :param dimensions: ``(declared, renamer, captured, lowered)``: what the checks of
        the declared dimensions need
    :param checked_inputs: the ONNX input of each placeholder, None for no check
    """
    captured = dimensions[2]
    checks: list[ModelCheck] = []
    with stage("optimize") as info:
        weights = _optimize(ir_model, opset)
        if optimize != "ort":
            # versions share most of their nodes: computed once, out of the If nodes
            info.update(arrange_branches(ir_model))
        # linear layers read their weights [in, out], as quantizers expect them
        info["weights_transposed"] = store_weights_transposed(ir_model, weights)
        info["onnx_nodes"] = len(ir_model.graph)
    if checked_inputs is not None and optimize != "ort":
        checks = _add_checks(stage, ir_model, captured, checked_inputs)
    with stage("check"):
        _check(ir_model, *dimensions)
    if optimize == "ort":
        # after the check: the ONNX checker does not know onnxruntime's operators
        # (validate=True runs the fused model); after the conversion too, the converter
        # does not know them either
        with stage("fuse") as info:
            info["fusions"] = _fuse(ir_model, weights, dimensions)
            # after the fusions, which look for their patterns in whole versions
            info.update(arrange_branches(ir_model))
            info["weights_transposed"] = store_weights_transposed(ir_model, weights)
            info["onnx_nodes"] = len(ir_model.graph)
        if checked_inputs is not None:
            checks = _add_checks(stage, ir_model, captured, checked_inputs)
    return checks


def _save(result: ExportResult, filename: str | os.PathLike) -> int:
    """The ``save`` stage: writes the model (and its external data); returns the bytes
    written."""
    result.files = save_ir_model(result.model, filename)
    result.filename = os.fspath(filename)
    return sum(os.path.getsize(f) for f in result.files)


def _validate(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    result: ExportResult,
    verbose: int,
    declared: Any,
    given: Sequence[Any] = (),
) -> Any:
    """The ``validate`` stage: onnxruntime against eager PyTorch (imported only then)."""
    from yobx.torch.onnx.validation import validate_export

    return validate_export(
        model,
        args,
        kwargs,
        result,
        result._captured,
        verbose=verbose,
        declared=declared,
        given=given,
    )


def _fallback_note(exc: Exception) -> str:
    """Why the model holds the example's side only (:attr:`ExportResult.version_fallback`):
    the error, and the one that caused it at the root (a pass's error wraps it)."""
    root = exc
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__

    def first_line(error: BaseException) -> str:
        lines = str(error).strip().splitlines()
        return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"

    cause = f", caused by {first_line(root)}" if root is not exc else ""
    return (
        f"the versions could not be exported ({first_line(exc)}{cause}); exported the "
        f"example's side, its constraints checked by the model"
    )


@frozen_during_call  # full collections walk only the export's objects
def to_onnx(
    model: torch.nn.Module,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    filename: str | os.PathLike | None = None,
    opset: int | None = None,
    module_leaves: Any = None,
    validate: bool = False,
    validation_inputs: Sequence[Any] = (),
    verbose: int = 0,
    profile: str | None = None,
    tracer: str = "custom",
    progress: Callable[[Stage], None] | None = None,
    optimize: str = "default",
    direct_lowering: bool = True,
    runtime_checks: bool = True,
    narrowing: str = "versions",
    max_versions: int | None = None,
    quantize: str | None = None,
    quantize_block_size: int = 32,
    quantize_accuracy_level: int = 0,
) -> ExportResult:
    """Exports ``model`` to ONNX.

    The model is captured with :class:`yobx.torch.tracing.CustomTracer`, cleaned with
    yobx's passes, lowered to aten in one pass over the captured graph (the model is not
    traced again), translated with onnxscript's torch_lib, optimized with onnxscript's
    optimizer, checked with :func:`onnx.checker.check_model` and shape inference.

    :param model: the model
    :param args: positional example inputs
    :param kwargs: keyword example inputs
    :param dynamic_shapes: torch.export-style dynamic shapes, per argument name,
        ``{axis: Dim or "name"}``; the names become ONNX dimension names
    :param filename: saves the model there (weights external past 2 GB)
    :param opset: ONNX opset, from 18 (the default) to the newest onnxscript's
        version converter supports (:func:`supported_opsets`); the model imports
        exactly this opset
    :param module_leaves: forwarded to the tracer
    :param validate: compares onnxruntime with eager PyTorch on the example inputs and
        on inputs with other sizes for each dynamic dimension
    :param validation_inputs: more input sets to compare on (each a dict of keyword
        arguments, a tuple of positional ones, or a pair ``(args, kwargs)``); implies
        ``validate``. The inputs of other sizes the validation makes are random: give
        the ones whose values must agree with each other (a vision-language model's
        image tokens and images, a grid of patches and the patches)
    :param verbose: prints the stages
    :param profile: writes a Chrome trace of the stages there
    :param progress: called with each :class:`Stage` when it ends
    :param tracer: ``"custom"`` (CustomTracer) or ``"fx"`` (``torch.fx.symbolic_trace``
        with fake propagation, for models without shape-dependent code)
    :param optimize: ``"default"`` (onnxscript's optimizer, a standard ONNX model) or ``"ort"``:
        then onnxscript's fusions for onnxruntime (attention, RMS and skip normalizations,
        rotary embeddings, GELU...: :func:`onnxscript.rewriter.ort_fusions.optimize_for_ort`),
        faster in onnxruntime but using its contrib operators, so that only onnxruntime runs
        the model; the fusions applied are counted in the ``fuse`` stage's ``fusions``
    :param direct_lowering: common operators go to aten with the capture's values
        (:mod:`yobx.torch.onnx.direct_lowering`); ``False``: all through make_fx
    :param runtime_checks: the ONNX model checks the constraints it assumes of its
        inputs' sizes (declared ranges, ``torch._check`` calls, constraints adopted from
        the example): onnxruntime fails, naming the constraint, instead of returning
        values outside them (:mod:`yobx.torch.onnx.runtime_checks`); ``False`` leaves
        the checks out, and the model is then silently wrong outside its constraints
    :param narrowing: what an undecided decision on dynamic dimensions becomes (see
        :class:`~yobx.torch.tracing.CustomTracer`): ``"versions"`` captures both sides
        and the model chooses between them with an ``If`` on the input sizes
        (:attr:`ExportResult.versions`), ``"constraints"`` keeps the example's side
    :param max_versions: the most versions ``narrowing="versions"`` captures (None:
        :data:`~yobx.torch.tracing.core.tracer.DEFAULT_MAX_VERSIONS`, 8); each costs about
        one capture, one lowering and one validation more (the 8-layer Llama decode
        step of ``_scripts/bench_decode_latency.py`` has 8; with 4, the sides at sizes
        0 and 1 only, it exports in about half the time, and a mask longer or shorter
        than the cache is refused by the model's checks instead of computed)
    :param quantize: ``"int4"``: the weights of the linear layers become 4-bit
        (onnxruntime's ``MatMulNBits``, see :mod:`yobx.torch.onnx.quantize`); the
        validation then compares with the eager model on the dequantized weights.
        Needs the weights (a model exported on the meta device: :meth:`ExportResult.
        apply_weights`, then :meth:`ExportResult.quantize`)
    :param quantize_block_size: the number of weights sharing a scale (a power of
        two, from 16)
    :param quantize_accuracy_level: the type the quantized products compute in
        (:data:`~yobx.torch.onnx.quantize.ACCURACY_LEVELS`: 0, the default, the
        inputs' float type, exact on the dequantized weights; 4, int8 activations,
        faster (a Llama decode step 13.4 -> 8.2 ms at batch 1,
        ``_scripts/bench_decode_latency.py``), not exact: the validation checks the
        same graph at level 0)
    :return: an :class:`ExportResult`
    :raises ValueError: an unsupported ``opset``, ``optimize``, ``tracer`` or
        ``quantize``
    """
    from yobx.torch.onnx.quantize import check_quantize

    opset = check_opset(opset)
    quantize = check_quantize(quantize, quantize_block_size, quantize_accuracy_level)
    optimize = check_optimize_level(optimize)
    validation_inputs = list(validation_inputs)
    validate = validate or bool(validation_inputs)
    args, kwargs = _checked_inputs(model, args, kwargs, validate)
    stage = StageRecorder(verbose, progress, label="to_onnx")

    captures: list[Any] = []

    def build(narrowing: str) -> tuple[ExportResult, Any]:
        with stage("capture") as info:
            captured = _capture(
                model, args, kwargs, dynamic_shapes, module_leaves, tracer, narrowing, max_versions
            )
            captures.append(captured)
            info["nodes"] = len(captured.graph_module.graph.nodes)
        declared = declared_dimensions(model, args, kwargs, dynamic_shapes, captured.graph_module)
        with stage("passes") as info:
            info.update(_pass_counts(captured))
            mistakes.refuse_kept_writes(captured)
            # the model's checks on values: gates of the outputs, or none when asked
            info["value_checks"] = gate_value_checks(captured.graph_module, runtime_checks)
            if info["value_checks"] and not runtime_checks:
                capture_module.remove_dead_code(captured.graph_module)
        with stage("lower") as info:
            lowered = _lower(captured, direct_lowering, info)
        with stage("translate") as info:
            ir_model, renamer, inputs = _translate(captured, lowered, model, args, kwargs, info)
        dimensions = (declared, renamer, captured, lowered)
        checks = _optimize_and_check(
            stage, ir_model, opset, optimize, dimensions, inputs if runtime_checks else None
        )
        return _export_result(model, ir_model, captured, stage.stages, checks), declared

    try:
        result, declared = build(narrowing)
    except Exception as exc:
        if narrowing != "versions" or not captures or not captures[0].tracer.versions:
            raise
        # the choice between versions did not export (the lowering of a branch calling
        # the model's modules through torch.cond is still limited): the example's side
        # alone, its constraints checked, says so rather than refusing the model
        stage.stages.clear()
        result, declared = build("constraints")
        result.version_fallback = _fallback_note(exc)
    if quantize is not None:
        result.quantize(quantize_block_size, quantize_accuracy_level)
    if filename is not None:
        with stage("save") as info:
            info["bytes"] = _save(result, filename)
    if validate:
        with stage("validate") as info:
            result.validation = _validate(
                model, args, kwargs, result, verbose, declared, validation_inputs
            )
            info["max_abs_error"] = result.validation.max_abs_error
    if profile is not None:
        write_stage_profile(result.stages, profile)
    return result


__all__ = [
    "DEFAULT_OPSET",
    "ExportResult",
    "OnnxExportError",
    "Stage",
    "check_opset",
    "save_model",
    "supported_opsets",
    "to_onnx",
]
