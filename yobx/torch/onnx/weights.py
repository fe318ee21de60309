"""The weights of an exported model: parameters and buffers as ONNX initializers.

Every parameter and buffer the graph reads becomes an initializer named after its
state-dict name (``model.layers.0.self_attn.q_proj.weight``), and stays one: the
optimizer neither folds it into another constant, nor merges it with an equal one, so
the same graph comes out whether the weights were real or on the meta device, and
:func:`apply_weights` finds every weight by its name.

A model built on the meta device exports its graph without reading a weight; its
initializers hold a :class:`PendingWeight` (dtype and shape, no data) until
:func:`apply_weights` points them at a source (a state dict, safetensors files), read
tensor by tensor when the model is saved.

Buffers computed in ``__init__`` and left out of checkpoints (non-persistent buffers
such as rotary frequency tables) are taken from the source when it has them, and
otherwise from the model: build it with :func:`empty_weights` (parameters on the meta
device, buffers computed as usual on the CPU) and their values are exported as
computed. A model built entirely on the meta device has no value for them, and
:func:`apply_weights` says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import onnx_ir as ir
import torch
from onnx_ir.tensor_adapters import from_torch_dtype, to_torch_dtype

from yobx.torch.onnx.errors import OnnxExportError
from yobx.torch.onnx.weight_sources import WeightEntry, _listing, open_weight_source
from yobx.torch.quiet_logs import quieted

#: model metadata: the JSON list of initializers stored transposed (``[in, out]``,
#: :mod:`yobx.torch.onnx.weight_layout`), each the transpose of the state-dict weight of
#: that name (or, for a copy named ``<name>.transposed``, of ``<name>``)
TRANSPOSED_WEIGHTS_KEY = "yobx.transposed_weights"
#: suffix of the transposed copy of a weight read otherwise too
TRANSPOSED_SUFFIX = ".transposed"
#: model metadata: the quantization applied (``int4, block 32``,
#: :mod:`yobx.torch.onnx.quantize`)
QUANTIZATION_KEY = "yobx.quantization"


def transposed_weights(model: ir.Model) -> dict[str, str]:
    """Initializer name -> the state-dict weight it is the transpose of."""
    names = json.loads(model.metadata_props.get(TRANSPOSED_WEIGHTS_KEY, "[]"))
    return {name: name.removesuffix(TRANSPOSED_SUFFIX) for name in names}


class WeightsNotAppliedError(OnnxExportError):
    """Raised when the data of a weight is needed but the model was exported on the
    meta device and :meth:`ExportResult.apply_weights` was not called."""


class WeightsMismatchError(OnnxExportError):
    """Raised when a weight source does not fit the model: missing or unexpected
    names, other shapes or dtypes."""


class PendingWeight(ir.LazyTensor):
    """An initializer whose data is not known yet: the parameter was on the meta device.

    It has the dtype and the shape of the parameter; reading its data raises
    :class:`WeightsNotAppliedError`.
    """

    def __init__(self, name: str, dtype: ir.DataType, shape: ir.Shape):
        def unavailable() -> ir.TensorProtocol:
            raise WeightsNotAppliedError(
                f"weight {name!r} was on the meta device when the model was exported: "
                "call result.apply_weights(state_dict or safetensors files) first"
            )

        super().__init__(unavailable, dtype=dtype, shape=shape, name=name)


def is_pending(tensor: Any) -> bool:
    """True when ``tensor`` is a weight without data (:class:`PendingWeight`)."""
    return isinstance(tensor, PendingWeight)


def pending_weights(model: ir.Model) -> list[str]:
    """Names of the initializers still waiting for their data."""
    return [name for name, v in model.graph.initializers.items() if is_pending(v.const_value)]


@contextlib.contextmanager
def empty_weights() -> Iterator[None]:
    """Builds modules with their parameters on the meta device and buffers on the CPU.

    Nothing is allocated for the parameters, and buffers computed in ``__init__``
    (rotary tables, masks) keep their values, which checkpoints usually do not hold::

        with empty_weights():
            model = transformers.LlamaForCausalLM(config)
        result = to_onnx(model, ...)
        result.apply_weights("model.safetensors.index.json")
        result.save("model.onnx")
    """
    original = torch.nn.Module.register_parameter

    def register_parameter(module: torch.nn.Module, name: str, param: Any) -> None:
        original(module, name, param)
        param = module._parameters.get(name)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = torch.nn.Parameter(
                param.to("meta"), requires_grad=param.requires_grad
            )

    torch.nn.Module.register_parameter = register_parameter
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


@dataclasses.dataclass
class WeightNames:
    """The state-dict names of the initializers holding parameters and buffers.

    :param names: initializer name -> every name of that tensor in the model (its own
        first, then the names of tied weights sharing it)
    :param known: every parameter and buffer name of the model, used by the graph or not
    :param persistent: the names in ``model.state_dict()`` (checkpoints hold them;
        non-persistent buffers are computed by the model)
    """

    names: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    known: frozenset[str] = frozenset()
    persistent: frozenset[str] = frozenset()

    @classmethod
    def of(cls, module: torch.nn.Module, model: ir.Model) -> WeightNames:
        """The names of ``module``'s parameters and buffers among ``model``'s
        initializers."""
        groups: dict[int, list[str]] = {}
        for name, tensor in [
            *module.named_parameters(remove_duplicate=False),
            *module.named_buffers(remove_duplicate=False),
        ]:
            groups.setdefault(id(tensor), []).append(name)
        group_of = {name: group for group in groups.values() for name in group}
        names = {}
        for name in model.graph.initializers:
            group = group_of.get(name)
            if group is not None:
                names[name] = (name, *(n for n in group if n != name))
        return cls(
            names=names,
            known=frozenset(group_of),
            persistent=frozenset(module.state_dict(keep_vars=True)),
        )


def mark_pending(model: ir.Model) -> int:
    """Replaces the initializers wrapping meta tensors by :class:`PendingWeight`;
    returns how many."""
    count = 0
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        raw = getattr(tensor, "raw", None)
        if isinstance(raw, torch.Tensor) and raw.device.type == "meta":
            value.const_value = PendingWeight(name, tensor.dtype, tensor.shape)
            count += 1
    return count


@contextlib.contextmanager
def weights_kept_apart(model: ir.Model, names: Any) -> Iterator[None]:
    """Hides the data of the initializers ``names`` from the optimizer.

    Without a constant value, an initializer is an opaque input to the optimizer: it
    is not folded into another constant (which would rename it and, on a big model,
    copy it), nor merged with an equal one (the norm weights of a randomly initialized
    model), nor read (a weight on the meta device has no data). onnxruntime folds what
    it wants when it loads the model.
    """
    hidden = {}
    for name in names:
        value = model.graph.initializers.get(name)
        if value is not None and value.const_value is not None:
            hidden[name] = (value, value.const_value)
            value.const_value = None
    try:
        # The deduplication pass warns once per initializer without a value.
        with quieted("onnx_ir.passes.common.initializer_deduplication"):
            yield
    finally:
        for value, tensor in hidden.values():
            value.const_value = tensor


@dataclasses.dataclass
class AppliedWeights:
    """What :func:`apply_weights` did.

    :param applied: initializer name -> the source name its data comes from
    :param kept: initializers keeping the values the model computed (buffers absent
        from the source)
    :param unused: source names of parameters or buffers the graph does not read
    :param ignored: source names that are not parameters or buffers of the model
        (only with ``strict=False``)
    """

    applied: dict[str, str]
    kept: list[str]
    unused: list[str]
    ignored: list[str]


def _mismatch_message(
    missing: list[str],
    missing_buffers: list[str],
    unexpected: list[str],
    mismatched: list[str],
) -> str:
    parts = []
    if missing:
        parts.append(f"missing from the source: {_listing(missing)}")
    if missing_buffers:
        parts.append(
            f"non-persistent buffers with no value: {_listing(missing_buffers)} "
            "(the model computes them in __init__ and checkpoints leave them out; build "
            "the model with yobx.torch.onnx.empty_weights() so that they are computed, "
            "or add them to the source)"
        )
    if unexpected:
        parts.append(
            f"not parameters or buffers of the model: {_listing(unexpected)} "
            "(apply_weights(..., strict=False) ignores them)"
        )
    if mismatched:
        parts.append("; ".join(mismatched[:12]))
    return "the weights do not fit the model: " + "; ".join(parts)


def _check_entry(value: ir.Value, entry: WeightEntry, transposed: bool) -> str | None:
    tensor = value.const_value
    shape = tuple(int(d) for d in tensor.shape)
    # stored [in, out] (yobx.torch.onnx.weight_layout): the checkpoint has [out, in]
    expected = shape[::-1] if transposed else shape
    dtype = to_torch_dtype(tensor.dtype)
    if expected != entry.shape or dtype != entry.dtype:
        return (
            f"{value.name!r} is {dtype} {list(expected)} in the model, "
            f"{entry.dtype} {list(entry.shape)} in {entry.origin}"
        )
    return None


def _lazy_tensor(name: str, entry: WeightEntry, transposed: bool) -> ir.TensorProtocol:
    def load() -> ir.TensorProtocol:
        tensor = entry.load()
        return ir.tensor(tensor.t().contiguous() if transposed else tensor, name=name)

    shape = entry.shape[::-1] if transposed else entry.shape
    return ir.LazyTensor(
        load, dtype=from_torch_dtype(entry.dtype), shape=ir.Shape(shape), name=name
    )


def apply_weights(
    model: ir.Model, weight_names: WeightNames, source: Any, strict: bool = True
) -> AppliedWeights:
    """Points the initializers of ``model`` at the tensors of ``source``.

    Nothing is read: every initializer gets a lazy tensor reading its data from the
    source when the model is saved. Names are matched to the state-dict names of the
    initializers (a tied weight is found under any of its names).

    :param model: the exported model
    :param weight_names: the names of its initializers in the model's state dict
    :param source: a state dict, a ``.safetensors`` file, a list of shards, a Hugging
        Face ``model.safetensors.index.json`` or a directory holding one of them
    :param strict: every persistent weight must be in the source, and every name of
        the source must be a parameter or buffer of the model; with ``strict=False``
        only weights without data must be there, and other names are ignored
    :raises WeightsMismatchError: missing or unexpected names, other shapes or dtypes
    :raises WeightSourceError: the source cannot be read (missing file, bad index)
    """
    if QUANTIZATION_KEY in model.metadata_props:
        raise OnnxExportError(
            "the model is quantized: its weights were read and replaced; apply the "
            "weights before quantizing (to_onnx(quantize=None), apply_weights, then "
            "result.quantize())"
        )
    entries = open_weight_source(source)
    initializers = model.graph.initializers
    transposed = transposed_weights(model)
    found: dict[str, WeightEntry] = {}
    missing, missing_buffers, mismatched, kept = [], [], [], []
    for name, aliases in weight_names.names.items():
        value = initializers.get(name)
        if value is None:
            continue  # the optimizer removed it: the graph does not read it
        match = next((entries[a] for a in aliases if a in entries), None)
        if match is None:
            persistent = any(a in weight_names.persistent for a in aliases)
            if is_pending(value.const_value):
                (missing if persistent else missing_buffers).append(name)
            elif strict and persistent:
                missing.append(name)
            else:
                kept.append(name)
            continue
        problem = _check_entry(value, match, name in transposed)
        if problem is not None:
            mismatched.append(problem)
        found[name] = match
    pending = [
        name
        for name in pending_weights(model)
        if name not in found
        and name not in missing + missing_buffers
        and transposed.get(name, name) not in found  # a copy, filled from its weight
    ]
    missing.extend(pending)
    used_names = {entry.name for entry in found.values()}
    unexpected = [n for n in entries if n not in weight_names.known]
    unused = [n for n in entries if n in weight_names.known and n not in used_names]
    if missing or missing_buffers or mismatched or (strict and unexpected):
        raise WeightsMismatchError(
            _mismatch_message(missing, missing_buffers, unexpected if strict else [], mismatched)
        )
    for name, entry in found.items():
        initializers[name].const_value = _lazy_tensor(name, entry, name in transposed)
    for name, original in transposed.items():
        # a transposed copy of a weight read otherwise too (weight_layout, tied=True)
        if name != original and original in found and name in initializers:
            initializers[name].const_value = _lazy_tensor(name, found[original], True)
    return AppliedWeights(
        applied={name: entry.name for name, entry in found.items()},
        kept=kept,
        unused=unused,
        ignored=unexpected,
    )


def _tie_again(module: torch.nn.Module, groups: list[list[str]]) -> None:
    """Tied weights loaded under one name: the other names get the same tensor
    (``load_state_dict(assign=True)`` replaces each name separately)."""
    for names in groups:
        loaded = [n for n in names if module.get_parameter(n).device.type != "meta"]
        if not loaded:
            continue
        tensor = module.get_parameter(loaded[0])
        for name in names:
            if module.get_parameter(name) is not tensor:
                owner_name, _, attribute = name.rpartition(".")
                setattr(module.get_submodule(owner_name), attribute, tensor)


def load_weights_into(module: torch.nn.Module, source: Any) -> None:
    """Gives ``module`` the weights of ``source`` (for an eager run of a model built on
    the meta device); buffers absent from the source keep their values.

    :param module: the model, modified in place
    :param source: what :meth:`yobx.torch.onnx.ExportResult.apply_weights` accepts: a
        state dict, a ``.safetensors`` file, a list of shard files, an index file or a
        directory
    :raises WeightsMismatchError: a parameter or buffer still on the meta device after
        loading
    :raises WeightSourceError: a missing file, an unreadable index, a name found twice
    """
    groups: dict[int, list[str]] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(parameter), []).append(name)
    entries = open_weight_source(source)
    state = {name: entry.load() for name, entry in entries.items()}
    missing, _ = module.load_state_dict(state, strict=False, assign=True)
    _tie_again(module, [names for names in groups.values() if len(names) > 1])
    on_meta = [
        name
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]
        if tensor.device.type == "meta"
    ]
    if on_meta:
        raise WeightsMismatchError(
            f"after loading the weights, {_listing(on_meta)} are still on the meta device"
            + (f" (missing from the source: {_listing(missing)})" if missing else "")
        )


def weight_bytes(model: ir.Model) -> int:
    """Total size in bytes of the initializers (known from dtypes and shapes)."""
    total = 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is not None:
            total += tensor.nbytes
    return total


__all__ = [
    "AppliedWeights",
    "PendingWeight",
    "WeightNames",
    "WeightsMismatchError",
    "WeightsNotAppliedError",
    "apply_weights",
    "empty_weights",
    "is_pending",
    "load_weights_into",
    "mark_pending",
    "pending_weights",
    "weight_bytes",
    "weights_kept_apart",
]
