"""Saving and checking exported models of any size.

A protobuf message cannot exceed 2 GB, and building one copies every weight. Models
are therefore saved from their ``onnx_ir`` form with :func:`onnx_ir.save`, which
writes the weights tensor by tensor into one external data file (offsets of large
tensors aligned for memory mapping), and checked on a *skeleton*: the same graph with
its large initializers declared as typed inputs, which the ONNX checker and shape
inference accept without reading a byte of weights.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import onnx
import onnx_ir as ir

from yobx.torch.onnx.weights import WeightsNotAppliedError, pending_weights, weight_bytes

#: Protobuf cannot serialize more than 2 GB.
PROTOBUF_LIMIT = 2**31
#: Above this size of weights, ``external_data=None`` keeps them outside the model: the
#: graph itself and the message overhead must fit in what is left below 2 GB.
EXTERNAL_DATA_THRESHOLD = PROTOBUF_LIMIT - 2**28
#: Offsets of tensors larger than ``ALIGN_THRESHOLD`` are multiples of this (the
#: allocation granularity of memory mapping on every platform).
ALIGNMENT = 65536
#: Tensors up to this size are packed densely.
ALIGN_THRESHOLD = 2**20
#: Initializers up to this size stay inside the ONNX file.
INLINE_THRESHOLD = 1024


def data_file_name(filename: str | os.PathLike) -> str:
    """The external data file of ``filename``: ``<basename>.data`` next to it."""
    return os.path.basename(os.fspath(filename)) + ".data"


def _not_applied_error(names: list[str]) -> WeightsNotAppliedError:
    shown = ", ".join(repr(n) for n in names[:5]) + (" ..." if len(names) > 5 else "")
    return WeightsNotAppliedError(
        f"{len(names)} weights have no data (the model was on the meta device: {shown}): "
        "call result.apply_weights(source) with a state dict, safetensors files or a "
        "model.safetensors.index.json before saving"
    )


def uses_external_data(model: ir.Model, external_data: bool | None) -> bool:
    """Decides where the weights go: ``None`` means outside past
    :data:`EXTERNAL_DATA_THRESHOLD`."""
    size = weight_bytes(model)
    if external_data is None:
        return size >= EXTERNAL_DATA_THRESHOLD
    if not external_data and size >= EXTERNAL_DATA_THRESHOLD:
        raise ValueError(
            f"the weights take {size / 2**30:.2f} GB, more than one ONNX file can hold "
            "(2 GB): save with external_data=True or None"
        )
    return bool(external_data)


def save_ir_model(
    model: ir.Model, filename: str | os.PathLike, external_data: bool | None = None
) -> list[str]:
    """Saves ``model``; with external data, every initializer above 1 KB goes to
    ``<filename>.data``, written one tensor at a time.

    :param model: the model
    :param filename: the ONNX file
    :param external_data: ``True`` (weights in ``<filename>.data``), ``False`` (all in
        one file, under 2 GB) or ``None`` (outside past 2 GB)
    :return: the files written
    :raises WeightsNotAppliedError: weights of a meta model were not applied
    """
    pending = pending_weights(model)
    if pending:
        raise _not_applied_error(pending)
    filename = os.fspath(filename)
    if not uses_external_data(model, external_data):
        ir.save(model, filename)
        return [filename]
    location = data_file_name(filename)
    ir.save(
        model,
        filename,
        external_data=location,
        size_threshold_bytes=INLINE_THRESHOLD,
        alignment=ALIGNMENT,
        align_threshold=ALIGN_THRESHOLD,
    )
    data_path = os.path.join(os.path.dirname(filename), location)
    return [filename, data_path] if os.path.exists(data_path) else [filename]


@contextlib.contextmanager
def _weights_as_stubs(model: ir.Model, threshold: int) -> Iterator[set[str]]:
    """Replaces initializers above ``threshold`` bytes (and those without data) by
    external references to nothing, so that serializing copies no weight."""
    pending = set(pending_weights(model))
    replaced = {}
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        if tensor is None:
            continue
        if tensor.nbytes > threshold or name in pending:
            replaced[name] = (value, tensor)
            value.const_value = ir.ExternalTensor(
                "__yobx_skeleton__", 0, tensor.nbytes, tensor.dtype, shape=tensor.shape, name=name
            )
    try:
        yield set(replaced)
    finally:
        for value, tensor in replaced.values():
            value.const_value = tensor


def skeleton_proto(model: ir.Model, threshold: int = INLINE_THRESHOLD) -> onnx.ModelProto:
    """The model without its weights: initializers above ``threshold`` bytes become
    graph inputs of the same type and shape. Cheap for any model size."""
    with _weights_as_stubs(model, threshold) as stubs:
        proto = ir.to_proto(model)
    if not stubs:
        return proto
    kept = []
    for tensor in proto.graph.initializer:
        if tensor.name in stubs:
            proto.graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims)
            )
        else:
            kept.append(tensor)
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(kept)
    return proto


def check_model(model: ir.Model) -> None:
    """Runs the ONNX checker and shape inference on the model's skeleton (weights are
    not read: checked once saved, by ``onnx.checker.check_model(path)``)."""
    proto = skeleton_proto(model)
    onnx.checker.check_model(proto)
    onnx.shape_inference.infer_shapes(proto, strict_mode=False)


def model_to_proto(model: ir.Model) -> onnx.ModelProto:
    """The whole model as one ``ModelProto`` with inferred shapes (under 2 GB)."""
    pending = pending_weights(model)
    if pending:
        raise _not_applied_error(pending)
    size = weight_bytes(model)
    if size >= EXTERNAL_DATA_THRESHOLD:
        raise ValueError(
            f"the weights take {size / 2**30:.2f} GB: a ModelProto cannot hold more than "
            "2 GB; use result.model (onnx_ir), or result.save(path) and the file"
        )
    proto = ir.to_proto(model)
    return onnx.shape_inference.infer_shapes(proto, strict_mode=False)


__all__ = [
    "EXTERNAL_DATA_THRESHOLD",
    "check_model",
    "data_file_name",
    "model_to_proto",
    "save_ir_model",
    "skeleton_proto",
    "uses_external_data",
]
