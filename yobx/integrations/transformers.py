"""yobx as a backend of ``transformers.exporters``.

transformers 5 ships an export API common to its backends: an exporter
(:class:`transformers.exporters.HfExporter`) exports a model from its forward kwargs
(``export``) or one component per stage of generation (``export_for_generation``), and
the :class:`transformers.exporters.ExportedModel` it returns runs, saves
(``save_pretrained``) and loads (``from_pretrained``) the exported graphs through the
runner registered for its format. Importing this module registers
:class:`YobxExporter` under ``export_format="yobx"`` with transformers' own ONNX runner
(:class:`~transformers.exporters.runners.runner_onnx.OnnxModelRunner`): the programs are
``onnx_ir`` models produced by :func:`yobx.torch.onnx.to_onnx`, run by onnxruntime::

    import yobx.integrations.transformers  # registers the backend
    from transformers.exporters import ExportedModel
    from yobx.integrations.transformers import YobxExporter, YobxExportConfig

    exported = YobxExporter().export(model, inputs, YobxExportConfig())
    exported(**inputs).logits                  # onnxruntime
    exported.save_pretrained("exported")       # model.onnx, its metadata, the config
    ExportedModel.from_pretrained("exported")  # (after importing this module)

What differs from transformers' ``OnnxExporter``:

* the dimensions are dynamic by default and named by their role (``batch``, ``seq``,
  ``past``, ``total`` for a mask over the cache and the new tokens...), and
  a decision on them is never narrowed to the example: the model keeps both sides
  (``narrowing="versions"``), and checks the constraints it assumes of its inputs'
  sizes (``runtime_checks``);
* ``export_for_generation`` captures the ``decode`` component from two new tokens
  (``multi_token_decode=True`` by default): the same graph runs one token or several
  on a cache, a decision on a single token kept as a version at ``seq == 1``; from a
  one-token example, the sequence stays dynamic too where the model's code allows it
  (a ``contiguous()`` of the attention output is no decision).

The ONNX inputs take the names transformers' runner binds (the path of each tensor in
the forward kwargs: ``input_ids``, ``cache.layers.0.keys``...), and the outputs come
in the order of the model's output structure, which the runner rebuilds (a
``CausalLMOutputWithPast`` holding a ``DynamicCache``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import types
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
import torch.utils._pytree as pytree
from transformers.exporters.auto import register_backend
from transformers.exporters.base import ExportedComponent, ExportedModel, HfExporter
from transformers.exporters.configs import ExportConfigMixin, ExportFormat
from transformers.exporters.exporter_dynamo import (
    _pytree_flatten,
    is_cache_object,
    patch_model_config,
    register_cache_pytrees_for_model,
    register_pytree_node,
)
from transformers.exporters.metadata import (
    ExportMetadata,
    build_export_metadata,
    record_output_structure,
)
from transformers.exporters.runners.runner_onnx import OnnxModelRunner
from transformers.exporters.utils import (
    decompose_for_generation,
    get_leaf_tensors,
    prepare_for_export,
)

from yobx.integrations.prefill_program import prefill_from_decode
from yobx.models.roles import ROLE_AXES, attention_mask_length
from yobx.torch.frozen_gc import frozen_during_call
from yobx.torch.onnx.export import to_onnx
from yobx.torch.onnx.generate import end_tokens, mask_positions, next_tokens
from yobx.torch.onnx.lazy_torch_lib import import_torch_lib
from yobx.torch.onnx.optimize import OPTIMIZE_LEVELS
from yobx.torch.pytree_paths import flatten_with_paths
from yobx.torch.tracing.constraints.versions import covers
from yobx.torch.tracing.inputs import (
    bind_arguments,
    cache_dynamic_shapes,
    placeholder_names,
    structure_dynamic_shapes,
)

#: the format this backend registers, the ``export_format`` of its configuration
EXPORT_FORMAT = "yobx"

#: the axes of the keys and values of a cache: (batch, heads, past, head_dim)
CACHE_ROLES = {0: "batch", 2: "past"}
#: the axes of an encoder's outputs and of the cross-attention cache of an
#: encoder-decoder model, over the encoder's sequence
ENCODER_ROLES = {0: "batch", 1: "encoder_seq"}
CROSS_CACHE_ROLES = {0: "batch", 2: "encoder_seq"}


@dataclasses.dataclass
class YobxExportConfig(ExportConfigMixin):
    """The configuration of :class:`YobxExporter`.

    :param dynamic: dynamic dimensions named by their role
        (``yobx.models.roles.ROLE_AXES``; the keys and values of a cache ``batch`` and
        ``past``, an attention mask ``seq``, or ``total`` when the inputs hold a
        cache; for an encoder-decoder's decoder steps, the encoder's outputs, the
        attention mask and the cross-attention cache over ``encoder_seq``; a tensor
        of ``input_ids``' shape under another name, ``batch`` and ``seq``; a list of
        state tensors outside a cache, ``batch`` where their first axis is that long);
        ``False``: every size static
    :param dynamic_shapes: the dimensions as :func:`yobx.torch.onnx.to_onnx` takes them
        (per forward kwarg, ``{axis: name or Dim}``), instead of the roles
    :param opset_version: the ONNX opset (yobx's default when None)
    :param optimize: ``"default"`` (a standard ONNX model) or ``"ort"`` (onnxruntime's
        fused operators)
    :param runtime_checks: the model checks the constraints it assumes of its inputs'
        sizes (see :func:`~yobx.torch.onnx.to_onnx`)
    :param narrowing: ``"versions"`` (a decision on a dynamic size keeps both sides)
        or ``"constraints"`` (the example's side, checked)
    :param quantizer: a quantizer of the converted ONNX model (transformers'
        ``OnnxRuntimeQuantizer``...); the quantizers of the FX graph do not apply
    """

    export_format: ExportFormat | str = EXPORT_FORMAT
    dynamic: bool = True
    dynamic_shapes: dict[str, Any] | None = None
    opset_version: int | None = None
    optimize: str = "default"
    runtime_checks: bool = True
    narrowing: str = "versions"
    quantizer: Any = None

    def __post_init__(self):
        if self.optimize not in OPTIMIZE_LEVELS:
            raise ValueError(f"optimize must be one of {OPTIMIZE_LEVELS}, got {self.optimize!r}")
        if self.narrowing not in ("versions", "constraints"):
            raise ValueError(
                f"narrowing must be 'versions' or 'constraints', got {self.narrowing!r}"
            )
        if self.quantizer is not None and getattr(self.quantizer, "quantizes_fx_graph", False):
            raise ValueError(
                f"{type(self.quantizer).__name__} quantizes the FX graph, which yobx does "
                "not export through: use a quantizer of the ONNX model "
                "(transformers.exporters.OnnxRuntimeQuantizer)"
            )


class YobxExporter(HfExporter):
    """Exports a transformers model to ONNX with :func:`yobx.torch.onnx.to_onnx`, as a
    backend of ``transformers.exporters`` (see the module's documentation)::

        exported = YobxExporter().export(model, {"input_ids": ids}, YobxExportConfig())
        components = YobxExporter().export_for_generation(
            model, {"input_ids": ids, "attention_mask": mask}, YobxExportConfig()
        )
    """

    export_format = EXPORT_FORMAT
    config_class = YobxExportConfig
    #: the result of the decode step's ``to_onnx`` (its versions tell which sizes it
    #: covers), kept while export_for_generation needs it
    _last_result: Any = None
    _keep_result: bool = False
    program_suffix = ".onnx"
    requires_trust_remote_code = False
    required_packages = ["torch", "onnx", "onnxscript", "onnxruntime"]

    def export_program(
        self,
        model: Any,
        sample_inputs: MutableMapping[str, Any],
        config: YobxExportConfig,
    ) -> tuple[ir.Model, ExportMetadata]:
        """One ONNX graph of ``model`` called with ``sample_inputs`` (forward kwargs)."""
        if config.quantizer is not None:
            config.quantizer.validate_environment(ExportFormat.ONNX)
        model, sample_inputs, output_flags = prepare_for_export(model, sample_inputs)
        _register_transformers_pytrees(model)
        with torch.no_grad(), patch_model_config(model, output_flags):
            # eager first, on a copy: a step appends to the cache it is given, and the
            # outputs give the structure the runner rebuilds
            eager_inputs = copy.deepcopy(dict(sample_inputs))
            outputs = _with_filled_cache(model(**eager_inputs), eager_inputs)
            tensors = _output_names(outputs)
            result = to_onnx(
                _TensorOutputs(model),
                kwargs=copy.deepcopy(dict(sample_inputs)),
                dynamic_shapes=_dynamic_shapes(sample_inputs, config),
                opset=config.opset_version,
                optimize=config.optimize,
                runtime_checks=config.runtime_checks,
                narrowing=config.narrowing,
            )
        if self._keep_result:
            # what export_for_generation asks of the decode step before it makes the
            # prefill from it (see _prefill_of)
            self._last_result = result
        program = result.model
        _name_inputs_as_runner_binds(program, result.input_placeholders, model, sample_inputs)
        _name_outputs(program, tensors)
        return self._finish_program(program, model, sample_inputs, config, outputs)

    def _finish_program(
        self,
        program: ir.Model,
        model: Any,
        sample_inputs: MutableMapping[str, Any],
        config: YobxExportConfig,
        outputs: Any,
    ) -> tuple[ir.Model, ExportMetadata]:
        """The metadata of ``program`` (exported from ``model`` called with
        ``sample_inputs``, which returned ``outputs``), its outputs in the order the
        runner reads them, quantized as ``config`` says."""
        tensors = _output_names(outputs)
        spec = pytree.tree_flatten(((), dict(sample_inputs)))[1]
        shim = types.SimpleNamespace(call_spec=types.SimpleNamespace(in_spec=spec, out_spec=spec))
        metadata = build_export_metadata(model, sample_inputs, shim, self.required_packages)
        record_output_structure(metadata, outputs)
        _order_outputs_as_runner_reads(program, len(tensors))
        if config.quantizer is not None:
            program = config.quantizer.quantize(program, sample_inputs, ExportFormat.ONNX)
        return program, metadata

    @frozen_during_call
    def export_for_generation(
        self,
        model: Any,
        sample_inputs: MutableMapping[str, Any],
        config: Any,
        *,
        generation_config: Any = None,
        multi_token_decode: bool = True,
    ) -> Any:
        """transformers' ``export_for_generation``, the ``decode`` component captured
        from two new tokens by default (``multi_token_decode``): its graph runs one
        token or several on a cache, and the decisions a single token would take
        (``if q_length == 1``) keep both sides (a version at ``seq == 1``).

        The ``prefill`` component is made from the decode step's graph, its cache
        empty (:mod:`yobx.integrations.prefill_program`), when that graph takes the
        prefill's inputs and a cache of plain keys and values over ``past``, covers
        ``past = 0``, and one configuration without quantizer applies to both;
        otherwise it is exported as transformers' exporters do.

        The objects that exist before the call stay out of the garbage collector's reach
        during it (:mod:`yobx.torch.frozen_gc`), as in :func:`~yobx.torch.onnx.to_onnx`:
        the prefill's copy of the decode step's graph, made outside ``to_onnx``, took
        0.15 s of a 1.6 s export of a tiny Llama in full collections, 0.03 s without."""
        components = decompose_for_generation(
            model,
            sample_inputs,
            generation_config=generation_config,
            multi_token_decode=multi_token_decode,
        )
        if isinstance(config, dict) or config.quantizer is not None:
            return super().export_for_generation(
                model,
                sample_inputs,
                config,
                generation_config=generation_config,
                multi_token_decode=multi_token_decode,
            )
        exported: dict[str, ExportedComponent] = {}
        decoded = None
        if "decode" in components:
            self._keep_result = True
            try:
                exported["decode"] = self._component("decode", *components["decode"], config)
            finally:
                self._keep_result = False
            # the decode step's capture: which sizes its versions cover
            decoded, self._last_result = self._last_result, None
        for name, (submodel, subinputs) in components.items():
            if name == "prefill" and decoded is not None:
                derived = self._prefill_of(exported["decode"], decoded, submodel, subinputs, config)
                if derived is not None:
                    exported[name] = derived
            if name not in exported:
                exported[name] = self._component(name, submodel, subinputs, config)
        return ExportedModel(
            {name: exported[name] for name in components},
            self.export_format,
            config=getattr(model, "config", None),
            generation_config=generation_config,
        )

    def _component(self, name: str, submodel: Any, subinputs: Any, config: Any) -> Any:
        try:
            return self._export_component(submodel, subinputs, config)
        except Exception as e:
            raise RuntimeError(
                f"{self.__class__.__name__}.export_program failed on component '{name}' "
                f"(submodel={type(submodel).__name__}, input keys={list(subinputs)})."
            ) from e

    def _prefill_of(
        self,
        decode: Any,
        result: Any,
        model: Any,
        sample_inputs: Any,
        config: YobxExportConfig,
    ) -> ExportedComponent | None:
        """The prefill component made from the ``decode`` component, whose ``to_onnx``
        gave ``result`` (None when it cannot be: see :meth:`export_for_generation`)."""
        model, sample_inputs, output_flags = prepare_for_export(model, sample_inputs)
        names = list(get_leaf_tensors(dict(sample_inputs)))
        tokens = sample_inputs.get("input_ids")
        if not isinstance(tokens, torch.Tensor):
            return None
        sizes = {"batch": tokens.shape[0], "seq": tokens.shape[1], "past": 0}
        if not _covers(result, sizes):
            return None
        program = prefill_from_decode(decode.program, names, result.weight_names.names)
        if program is None:
            return None
        with torch.no_grad(), patch_model_config(model, output_flags):
            eager_inputs = copy.deepcopy(dict(sample_inputs))
            outputs = _with_filled_cache(model(**eager_inputs), eager_inputs)
        # the prefill's output names (its tensors' paths) are the decode step's
        expected = [v.name for v in program.graph.outputs]
        _name_outputs(program, _output_names(outputs))
        if [v.name for v in program.graph.outputs] != expected:
            return None
        program, metadata = self._finish_program(program, model, sample_inputs, config, outputs)
        metadata.export_config = json.loads(config.to_json_string())
        return ExportedComponent(program, metadata)

    @classmethod
    def save_program(cls, program: ir.Model, path) -> None:
        """The graph, its weights in ``<name>.onnx.data`` beside it (transformers'
        ONNX layout)."""
        _onnx_exporter().save_program(program, path)

    @classmethod
    def program_files(cls, filename: str) -> list[str]:
        return _onnx_exporter().program_files(filename)

    @classmethod
    def load_program(cls, path) -> ir.Model:
        return _onnx_exporter().load_program(path)


def _onnx_exporter() -> type:
    """transformers' ``OnnxExporter`` class, imported when first needed: its module
    imports torch_lib, translating every function at once unless yobx imported it first
    (:mod:`yobx.torch.onnx.lazy_torch_lib`, half a second of a first export)."""
    import_torch_lib()
    from transformers.exporters.exporter_onnx import OnnxExporter

    return OnnxExporter


class _TensorOutputs(torch.nn.Module):
    """The model returning the tensors of its output, in the order transformers'
    runner rebuilds the output from (the order its pytree flattening lists them):
    the graph's outputs, whatever holds them (a cache whose layers keep a length as
    an int, which the tracer holds as a symbolic value, no tensor)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, **kwargs):
        # transformers' flattening keeps a sliding-window layer's count of positions
        # seen as a constant of the example: the tracer makes it follow the keys
        # (yobx.torch.tracing.inputs.recount_sliding_layers)
        outputs = _with_filled_cache(self.model(**kwargs), kwargs)
        return tuple(tensor for _, tensor in _output_tensors(outputs))


def _with_filled_cache(outputs: Any, inputs: Mapping[str, Any]) -> Any:
    """The model's output, with the cache it was given and filled in place when it
    returns none (BERT-like decoders: ``generate`` reads back the cache it passed, the
    runner reads what the graph returns); the output as it is otherwise."""
    cache = _cache_of(inputs)
    fields = getattr(type(outputs), "__dataclass_fields__", {})
    # transformers 5 names the field `cache` (`past_key_values` before)
    field = next((name for name in ("cache", "past_key_values") if name in fields), None)
    if (
        cache is None
        or field is None
        or getattr(outputs, field, None) is not None
        or not _output_tensors(cache)
    ):
        return outputs
    # as an item: a ModelOutput flattens its items, an attribute set to None is none
    outputs[field] = cache
    return outputs


def _output_tensors(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """``(path, tensor)`` for the tensors of an output structure, in the order of
    transformers' pytree flattening (mappings by key, objects by attribute, sequences
    in order); the path names the ONNX output (``logits``, ``cache.layers.0.keys``)."""
    from yobx.torch.tracing.core.proxies import CustomProxy, _ScalarProxy

    if isinstance(value, CustomProxy):
        return [] if isinstance(value, _ScalarProxy) else [(path or "output", value)]
    if isinstance(value, torch.Tensor):
        return [(path or "output", value)]
    if isinstance(value, (list, tuple)):
        items = [(str(i), item) for i, item in enumerate(value)]
    elif isinstance(value, Mapping):
        items = [(str(k), item) for k, item in value.items()]
    elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module)):
        items = list(vars(value).items())
    else:
        return []
    found = []
    for key, item in items:
        found.extend(_output_tensors(item, f"{path}.{key}" if path else key))
    return found


def _output_names(outputs: Any) -> list[str]:
    """The paths of the tensors of the model's output, checked to be in the order
    transformers' runner rebuilds it from (its pytree flattening)."""
    found = _output_tensors(outputs)
    expected = [id(t) for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]
    if [id(t) for _, t in found] != expected:
        raise ValueError(
            f"the tensors of {type(outputs).__name__} are not found in the order its "
            f"pytree flattening gives them ({len(found)} found, {len(expected)} leaves): "
            "transformers' runner could not rebuild the output"
        )
    return [name for name, _ in found]


def _name_outputs(program: ir.Model, names: list[str]) -> None:
    """The ONNX outputs named after their tensor's path in the model's output, a
    ``present.<layer>.key`` for a cache's keys as Hugging Face's exports name them
    (the mutated buffers, which yobx appends, keep their names)."""
    inputs = {value.name for value in program.graph.inputs}
    for value, name in zip(program.graph.outputs, names):
        if value.is_graph_input():
            continue  # an input returned as it is keeps the input's name
        match = _CACHE_TENSOR.match(name)
        name = f"present.{match[1]}.{_KINDS[match[2]]}" if match else name
        # a tensor the model returns beside its input of that path (a cache's
        # sliding window), as transformers' exporter names them
        value.name = f"output.{name}" if name in inputs else name


#: a tensor of a cache in the output, the Hugging Face name of which is present.<i>.<kind>
_CACHE_TENSOR = re.compile(r"^(?:past_key_values|cache)\.layers\.(\d+)\.(keys|values)$")
_KINDS = {"keys": "key", "values": "value"}


def _register_transformers_pytrees(model: Any) -> None:
    """transformers' flattening of its caches, which the saved output structure names
    (``from_pretrained`` reads it back with it): it replaces yobx's registration of
    ``DynamicCache`` if a trace made one earlier (yobx traces with either)."""
    import torch.fx._pytree as fx_pytree
    from transformers.cache_utils import DynamicCache

    node = pytree.SUPPORTED_NODES.get(DynamicCache)
    if node is not None and node.flatten_fn is not _pytree_flatten:
        pytree._deregister_pytree_node(DynamicCache)
        fx_pytree.SUPPORTED_NODES.pop(DynamicCache, None)
        register_pytree_node(DynamicCache)
    register_cache_pytrees_for_model(model)


def _dynamic_shapes(inputs: Mapping[str, Any], config: YobxExportConfig) -> Any:
    """The dynamic dimensions of the export: the config's, or named by their role."""
    if config.dynamic_shapes is not None:
        return config.dynamic_shapes
    if not config.dynamic:
        return None
    holds_cache = any(is_cache_object(value) for value in inputs.values())
    # an encoder-decoder's decoder step: its attention mask covers the encoder's tokens
    encoded = inputs.get("encoder_outputs") is not None
    shapes: dict[str, Any] = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            roles = dict(ROLE_AXES.get(name, _token_roles(inputs, value)))
            if name == "attention_mask" and value.dim() == 2 and (encoded or holds_cache):
                # over the encoder's tokens, or over the cache and the new tokens
                # ("past + seq" as generation passes it, no version for another length)
                length = attention_mask_length(dict(inputs), _cache_of(inputs))
                roles = dict(ENCODER_ROLES) if encoded else {0: "batch", 1: length}
            elif name == "attention_mask" and value.dim() == 2 and _longer_than_ids(inputs):
                # over the tokens of a state the model keeps in tensors of its own
                # (RWKV's `state`), as long as every token generated: a length of its own
                roles = {0: "batch", 1: "total"}
            if name == "position_ids" and value.dim() == 3:  # (sections, batch, seq)
                roles = {1: "batch", 2: "seq"}
            shapes[name] = {axis: role for axis, role in roles.items() if axis < value.dim()}
        elif is_cache_object(value):
            batch = _batch_size(inputs)
            shapes[name] = cache_dynamic_shapes(value, CACHE_ROLES, CROSS_CACHE_ROLES, batch)
        elif name == "encoder_outputs" and value is not None:
            shapes[name] = structure_dynamic_shapes(
                value, lambda t: dict(ENCODER_ROLES) if t.dim() == 3 else {}
            )
        elif isinstance(value, (list, tuple)) and value and _batch_size(inputs) is not None:
            # a state in tensors the model keeps outside a cache (RWKV's `state`): as a
            # cache's states, a dynamic batch where the first axis is the batch
            shapes[name] = structure_dynamic_shapes(value, _state_axes(_batch_size(inputs)))
        else:
            shapes[name] = None
    return shapes


def _token_roles(inputs: Mapping[str, Any], tensor: torch.Tensor) -> dict[int, str]:
    """The roles of a tensor input known by no name: those of ``input_ids`` when it
    has their shape, one value per token (XLM's ``langs``, which it checks against
    the tokens' shape), none otherwise."""
    ids = inputs.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.dim() == 2 and tensor.shape == ids.shape:
        return dict(ROLE_AXES["input_ids"])
    return {}


def _longer_than_ids(inputs: Mapping[str, Any]) -> bool:
    """Whether the attention mask spans more tokens than ``input_ids``."""
    ids, mask = inputs.get("input_ids"), inputs.get("attention_mask")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or not isinstance(mask, torch.Tensor):
        return False
    return mask.shape[1] != ids.shape[1]


def _state_axes(batch: int | None) -> Callable[[torch.Tensor], dict[int, Any]]:
    """The axes of a state tensor: ``batch`` on a first axis that long, the others as
    torch.export's ``Dim.AUTO``; static otherwise."""

    def axes(tensor: torch.Tensor) -> dict[int, Any]:
        if tensor.dim() == 0 or tensor.shape[0] != batch:
            return {}
        return {0: "batch", **dict.fromkeys(range(1, tensor.dim()), torch.export.Dim.AUTO)}

    return axes


def _batch_size(inputs: Mapping[str, Any]) -> int | None:
    """The batch size of a step's inputs (``input_ids``' first axis), None without
    them."""
    for name in ("input_ids", "inputs_embeds"):
        value = inputs.get(name)
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            return int(value.shape[0])
    return None


def _covers(result: Any, sizes: dict[str, int]) -> bool:
    """Whether the model of ``result`` (``to_onnx``'s) runs inputs of ``sizes`` (by
    dimension name, each one the capture declares): one of its versions takes them."""
    tracer = getattr(result._captured, "tracer", None)
    if tracer is None or not set(sizes) <= set(tracer.dims.by_name):
        return False
    return covers(tracer, sizes, from_zero=True)


def _cache_of(inputs: Mapping[str, Any]) -> Any:
    """The cache among a step's inputs (None when there is none)."""
    return next((value for value in inputs.values() if is_cache_object(value)), None)


def _name_inputs_as_runner_binds(
    program: ir.Model, placeholders: dict[str, str], model: Any, inputs: Mapping[str, Any]
) -> None:
    """Renames the ONNX inputs after the path of their tensor in the forward kwargs
    (``get_leaf_tensors``), the names transformers' runner binds."""
    bound = bind_arguments(model.forward, (), dict(inputs))
    leaves = flatten_with_paths(list(bound.values()))
    targets = placeholder_names(list(bound), [path for path, _ in leaves])
    leaf_of_target = {target: leaf for target, (_, leaf) in zip(targets, leaves)}
    # one tensor may sit at several paths (DeepseekV4's cache layers set `values =
    # keys`): each input takes the next of its tensor's paths, in the order both list
    paths_of_leaf: dict[int, list[str]] = {}
    for path, tensor in get_leaf_tensors(dict(inputs)).items():
        paths_of_leaf.setdefault(id(tensor), []).append(path)
    for value in program.graph.inputs:
        leaf = leaf_of_target.get(placeholders.get(value.name, ""))
        if not paths_of_leaf.get(id(leaf)):
            every = ", ".join(p for paths in paths_of_leaf.values() for p in paths)
            raise ValueError(
                f"ONNX input {value.name!r} is no tensor of the forward kwargs "
                f"({every}): transformers' runner could not feed it"
            )
        value.name = paths_of_leaf[id(leaf)].pop(0)


def _order_outputs_as_runner_reads(program: ir.Model, n: int) -> None:
    """The model's outputs last, in the order of its output structure: the runner
    reads the last ``n`` outputs (``n`` tensors in the structure); the final values of
    mutated buffers, which yobx appends, go first."""
    outputs = program.graph.outputs
    if len(outputs) < n:
        raise ValueError(
            f"the ONNX model has {len(outputs)} outputs, the model's output holds {n} "
            "tensors: transformers' runner could not rebuild it"
        )
    if len(outputs) > n:
        reordered = [*outputs[n:], *outputs[:n]]
        outputs.clear()
        outputs.extend(reordered)


def greedy_generate(
    exported: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 8,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> torch.Tensor:
    """Greedy generation with the components of ``export_for_generation``
    (``prefill`` then ``decode`` steps, run by their runners): the prompt followed by
    the new tokens, as ``model.generate(do_sample=False)`` returns them.

    Positions follow the mask as transformers' ``generate`` computes them (a
    left-padded prompt starts after its padding); a sequence that produced
    ``eos_token_id`` continues with ``pad_token_id`` (the end token by default), as
    with :func:`yobx.torch.onnx.generate.generate`, whose steps it shares.

    :raises ValueError: ``exported`` has no ``prefill`` and ``decode`` components
    """
    missing = {"prefill", "decode"} - set(exported.components)
    if missing:
        raise ValueError(
            f"greedy_generate needs the components 'prefill' and 'decode' of "
            f"export_for_generation, {sorted(missing)} missing from {list(exported.components)}"
        )
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    eos, pad = end_tokens(eos_token_id, pad_token_id)
    runners = exported.runners
    positions = torch.from_numpy(mask_positions(attention_mask.numpy()))
    outputs = _run(runners["prefill"], input_ids, attention_mask, positions, config=exported.config)
    # a model configured without a cache (use_cache=False) runs the whole sequence again
    decode = runners["decode"]
    carried = [
        name for name in _carried_arguments(decode) if getattr(outputs, name, None) is not None
    ]
    # a model taking a cache it neither fills nor returns (OpenAI GPT takes every
    # keyword generate passes) runs the whole sequence again too
    cached = _returned_cache(outputs) is not None or bool(carried)
    tokens, finished = input_ids, np.zeros(input_ids.shape[0], dtype=bool)
    for step in range(max_new_tokens):
        chosen, finished = next_tokens(outputs.logits.numpy(), finished, eos, pad)
        new = torch.from_numpy(chosen)
        tokens = torch.cat([tokens, new[:, None]], dim=1)
        if step + 1 == max_new_tokens or finished.all():
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(new), 1))], 1)
        positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
        if cached:
            step_inputs = (new[:, None], attention_mask, positions[:, -1:], outputs)
        else:
            step_inputs = (tokens, attention_mask, positions)
        outputs = _run(runners["decode"], *step_inputs)
    return tokens


def _cache_argument(runner: Any) -> str | None:
    """The forward kwarg holding the cache the component was exported with."""
    for name, described in runner.metadata.kwargs.items():
        if described.get("container", "").endswith("Cache"):
            return name
    return None


_STEP_INPUTS = ("input_ids", "attention_mask", "position_ids")


def _returned_cache(outputs: Any) -> Any:
    """The cache a step returned, None for an output class without one."""
    try:
        return outputs.past_key_values
    except AttributeError:
        return None


def _carried_arguments(runner: Any) -> list[str]:
    """The forward kwargs of a step other than its tokens, mask, positions and cache:
    a state the model returns under the same name and takes back (RWKV's ``state``)."""
    cache = _cache_argument(runner)
    return [name for name in runner.metadata.kwargs if name not in (*_STEP_INPUTS, cache)]


def _run(
    runner: Any, ids: Any, mask: Any, positions: Any, previous: Any = None, config: Any = None
) -> Any:
    """One step: the inputs the component was exported with, the cache of the
    previous step's outputs, or a new one for the first step when the component
    takes one (a sliding-window layer's tensors are inputs even when it is empty),
    and the states the previous step returned under the names the step takes."""
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    inputs = {name: value for name, value in inputs.items() if name in runner.metadata.kwargs}
    argument = _cache_argument(runner)
    if argument is not None:
        if previous is not None and _returned_cache(previous) is not None:
            inputs[argument] = _returned_cache(previous)
        elif runner.metadata.kwargs[argument]["container"] == "DynamicCache":
            from transformers import DynamicCache

            inputs[argument] = DynamicCache(config=config)
    for name in _carried_arguments(runner) if previous is not None else ():
        if getattr(previous, name, None) is not None:
            inputs[name] = getattr(previous, name)
    return runner(**inputs)


def register() -> None:
    """Registers :class:`YobxExporter` and transformers' ONNX runner under
    ``export_format="yobx"`` (done when this module is imported)."""
    register_backend(YobxExporter, OnnxModelRunner)


register()

__all__ = ["EXPORT_FORMAT", "YobxExportConfig", "YobxExporter", "greedy_generate", "register"]
