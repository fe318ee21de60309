"""Weight-only quantization of an exported model with onnxruntime's quantizer.

``to_onnx(..., quantize="int4")`` (or :meth:`ExportResult.quantize
<yobx.torch.onnx.ExportResult.quantize>` after :meth:`apply_weights
<yobx.torch.onnx.ExportResult.apply_weights>`) runs
``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer`` on the
model: every ``MatMul`` reading a weight ``[in, out]`` (the layout yobx stores them in,
:mod:`yobx.torch.onnx.weight_layout`) becomes a ``MatMulNBits`` (onnxruntime's contrib
operator) with 4-bit weights in blocks of ``block_size`` along ``in``, one scale per
block, symmetric (no zero point).

The model then computes what the eager model computes with its quantized weights
replaced by their dequantized values. The validation checks exactly that
(:func:`dequantized_weights`, :func:`weights_swapped`): eager on those weights against
onnxruntime, with the usual tolerances, instead of a loose tolerance against the
original weights, which would hide a wrong graph under the quantization error.

``accuracy_level`` sets the type ``MatMulNBits`` computes in (its attribute, see
:data:`ACCURACY_LEVELS`): 0, the default, computes with the inputs' float type, exact on
the dequantized weights; 4 quantizes the activations to int8 per block, which
onnxruntime's CPU kernels run faster (a Llama decode step 13.4 -> 8.2 ms at batch 1 in
``_scripts/bench_decode_latency.py``, variants ``yobx-int4`` and ``yobx-int4-l4``) and
which onnxruntime-genai's model builder writes for int4, at the cost of that quantization
(not exact by design). The validation (and ``yobx export``'s generation check) then
runs the same graph at level 0 to check it exactly, and says so.

The quantizer works on the whole model in memory (an ``onnx.ModelProto`` holding
every weight): quantize a model whose weights fit in memory twice.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import onnx_ir as ir
import torch

from yobx.torch.onnx.branch_sinking import sink_into_branches
from yobx.torch.onnx.errors import OnnxExportError
from yobx.torch.onnx.sibling_products import fuse_sibling_products, pack_attention_inputs
from yobx.torch.onnx.weight_layout import node_depths, store_weights_transposed
from yobx.torch.onnx.weights import QUANTIZATION_KEY, pending_weights, transposed_weights
from yobx.torch.quiet_logs import quieted

#: what ``quantize`` accepts
QUANTIZE_LEVELS = ("int4",)
#: the accuracy levels of ``MatMulNBits``: the type it computes in
ACCURACY_LEVELS = {
    0: "the inputs' float type",
    1: "float32",
    2: "float16",
    3: "bfloat16",
    4: "int8 activations",
}
#: the suffix onnxruntime's quantizer gives the quantized data of a weight
_QUANTIZED_SUFFIX = "_Q4"
#: MatMulNBits' zero point when the model gives none (4 bits: the middle)
_DEFAULT_ZERO_POINT = 8


def check_quantize(
    quantize: str | None, block_size: int = 32, accuracy_level: int = 0
) -> str | None:
    """``quantize`` checked: ``None`` or one of :data:`QUANTIZE_LEVELS`, with a block
    size :func:`check_block_size` accepts and one of :data:`ACCURACY_LEVELS`."""
    check_block_size(block_size)
    check_accuracy_level(accuracy_level)
    if quantize is None or quantize in QUANTIZE_LEVELS:
        return quantize
    raise ValueError(f"quantize={quantize!r}: use one of {list(QUANTIZE_LEVELS)} or None")


def check_block_size(block_size: int) -> int:
    """A block size MatMulNBits takes: a power of two from 16."""
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size={block_size}: use a power of two, at least 16")
    return block_size


def check_accuracy_level(accuracy_level: int) -> int:
    """``accuracy_level`` checked: one of :data:`ACCURACY_LEVELS`."""
    if accuracy_level not in ACCURACY_LEVELS:
        raise ValueError(
            f"accuracy_level={accuracy_level!r}: use one of {sorted(ACCURACY_LEVELS)} "
            f"({', '.join(f'{k}: {v}' for k, v in ACCURACY_LEVELS.items())})"
        )
    return accuracy_level


def quantize_model(
    model: ir.Model, block_size: int = 32, weights: Iterable[str] = (), accuracy_level: int = 0
) -> tuple[ir.Model, int]:
    """The model with its weight ``MatMul`` nodes quantized to 4 bits; returns it and
    how many nodes were.

    :param weights: the initializers that are weights: those still read through a
        ``Transpose`` (the export keeps it where the reader sits two subgraphs deep,
        :func:`~yobx.torch.onnx.weight_layout.store_weights_transposed`) are
        stored ``[in, out]`` first, so that every weight matrix multiplication is
        quantized

    :param accuracy_level: the type the quantized products compute in (one of
        :data:`ACCURACY_LEVELS`)
    :raises OnnxExportError: the model has weights without data (exported on the meta
        device: apply them first), or is quantized already
    """
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if QUANTIZATION_KEY in model.metadata_props:
        raise OnnxExportError(
            f"the model is quantized already ({model.metadata_props[QUANTIZATION_KEY]})"
        )
    pending = pending_weights(model)
    if pending:
        raise OnnxExportError(
            f"quantizing reads the weights, and {len(pending)} have no data (the model "
            f"was exported on the meta device): call result.apply_weights(...) first, "
            f"then result.quantize()"
        )
    store_weights_transposed(model, weights, max_depth=None)
    proto = ir.serde.serialize_model(model)
    quantizer = MatMulNBitsQuantizer(
        proto,
        bits=4,
        block_size=block_size,
        is_symmetric=True,
        accuracy_level=check_accuracy_level(accuracy_level),
    )
    # a line per node, at INFO
    with quieted("onnxruntime.quantization.matmul_nbits_quantizer", logging.WARNING):
        quantizer.process()
    quantized = ir.serde.deserialize_model(quantizer.model.model)
    # the queries', keys' and values' products (gate and up) as one, which the fused
    # attention reads packed; the Split then goes where a prompt's attention reads it
    if fuse_sibling_products(quantized) and pack_attention_inputs(quantized):
        sink_into_branches(quantized)
    quantized.metadata_props.update(model.metadata_props)
    described = f"int4, block {block_size}"
    if accuracy_level:
        described += f", accuracy level {accuracy_level} ({ACCURACY_LEVELS[accuracy_level]})"
    quantized.metadata_props[QUANTIZATION_KEY] = described
    _keep_input_metadata(model, quantized)
    return quantized, quantized_products(quantized)


def quantized_weights(model: ir.Model) -> list[str]:
    """The names of the 4-bit data of every weight the ``MatMulNBits`` nodes of
    ``model`` read (``<weight>_Q4``), each once: a node reading several weights
    concatenated (:mod:`.sibling_products`) counts each."""
    names: dict[str, None] = {}
    for node in _all_nodes(model):
        if node.op_type == "MatMulNBits" and node.inputs[1] is not None:
            names.update((data.name, None) for data, _, _ in _weights_read(node))  # type: ignore[union-attr]
    return list(names)


def quantized_products(model: ir.Model) -> int:
    """How many weight products the ``MatMulNBits`` nodes of ``model`` compute: a node
    reading several weights concatenated (:mod:`.sibling_products`) counts each, a
    weight read by two nodes (in two versions) counts twice."""
    return sum(
        len(_weights_read(node))
        for node in _all_nodes(model)
        if node.op_type == "MatMulNBits" and node.inputs[1] is not None
    )


def nested_quantized_nodes(model: ir.Model) -> int:
    """How many quantized weight products (of :func:`quantized_weights`) sit two
    subgraphs deep or more (a choice between versions nested in another).

    onnxruntime 1.32 prepacks the 4-bit weights of a node in a subgraph when they are
    initializers of the graph just above, not further up: such a node unpacks its
    weights at every run, about ten times slower (``_scripts/bench_nested_prepack.py``:
    3114 us against 260 us; ``_scripts/bench_decode_latency.py``'s ``yobx-int4``).
    """

    depths = node_depths(model.graph)
    return sum(
        len(_weights_read(node))
        for node, depth in depths.items()
        if node.op_type == "MatMulNBits" and depth >= 2
    )


def _keep_input_metadata(source: ir.Model, target: ir.Model) -> None:
    """The in-memory metadata of the inputs (the placeholder each feeds) survives the
    round trip through the quantizer's proto."""
    for old, new in zip(source.graph.inputs, target.graph.inputs):
        new.meta.update(old.meta)


def _all_nodes(model: ir.Model) -> Iterator[ir.Node]:
    return ir.traversal.RecursiveGraphIterator(model.graph)


def dequantized_weights(model: ir.Model) -> dict[str, torch.Tensor]:
    """State-dict name -> the weight ``[out, in]`` as the quantized model computes with
    it (its 4-bit values times their block's scale), for every weight quantized."""
    initializers = model.graph.initializers
    transposed = transposed_weights(model)
    weights = {}
    for node in _all_nodes(model):
        if node.op_type != "MatMulNBits" or node.inputs[1] is None:
            continue
        attributes = {key: attr.value for key, attr in node.attributes.items()}
        zero_points = None
        if len(node.inputs) > 3 and node.inputs[3] is not None:
            zero_points = initializers[node.inputs[3].name].const_value.numpy()
        for data, scales, columns in _weights_read(node):
            name = data.name
            if not name.endswith(_QUANTIZED_SUFFIX) or name in weights:
                continue
            original = name.removesuffix(_QUANTIZED_SUFFIX)
            packed = initializers[name].const_value.numpy()
            scale = initializers[scales.name].const_value.numpy()
            shape = {**_shape_of(attributes), "N": columns}
            matrix = _dequantize(packed, scale, zero_points, **shape)
            # stored [in, out] (a weight the graph read transposed): the module's is [out, in]
            source = transposed.get(original, original)
            weights[source] = torch.from_numpy(np.ascontiguousarray(matrix.T))
    return weights


def _weights_read(node: ir.Node) -> list[tuple[ir.Value, ir.Value, int]]:
    """The 4-bit data, scales and columns of each weight a ``MatMulNBits`` reads: its
    own, or those it reads concatenated (:mod:`.sibling_products`, no zero points)."""
    data, scales = node.inputs[1], node.inputs[2]
    concatenated = data.producer() if data is not None else None
    if concatenated is None or concatenated.op_type != "Concat":
        return [(data, scales, int(node.attributes["N"].value))]
    scale_parts = scales.producer().inputs  # type: ignore[union-attr]
    return [
        (part, scale, int(part.shape[0]))  # type: ignore[index]
        for part, scale in zip(concatenated.inputs, scale_parts)
    ]


def _shape_of(attributes: dict[str, Any]) -> dict[str, int]:
    if attributes.get("bits", 4) != 4:
        raise OnnxExportError(f"MatMulNBits with bits={attributes['bits']}: yobx reads 4 bits")
    return {k: int(attributes[k]) for k in ("K", "N", "block_size")}


def _dequantize(
    packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    K: int,  # MatMulNBits' attribute names
    N: int,
    block_size: int,
) -> np.ndarray:
    """``[K, N]`` from MatMulNBits' ``B`` (``[N, blocks, block_size / 2]`` bytes, the
    low half-byte first), ``scales`` (``[N, blocks]``) and its zero points (the middle
    when absent)."""
    blocks = (K + block_size - 1) // block_size
    data = packed.reshape(N, blocks, block_size // 2)
    values = np.stack([data & 0x0F, data >> 4], axis=-1).reshape(N, blocks, block_size)
    if zero_points is None:
        zero = np.full((N, blocks, 1), _DEFAULT_ZERO_POINT, dtype=np.float32)
    else:
        flat = zero_points.reshape(-1)
        if flat.dtype == np.uint8 and flat.size * 2 >= N * blocks and flat.size < N * blocks:
            flat = np.stack([flat & 0x0F, flat >> 4], axis=-1).reshape(-1)
        zero = flat[: N * blocks].reshape(N, blocks, 1).astype(np.float32)
    scale = scales.reshape(N, blocks, 1).astype(np.float32)
    matrix = ((values.astype(np.float32) - zero) * scale).reshape(N, blocks * block_size)
    return matrix[:, :K].T.astype(scales.dtype)


@contextlib.contextmanager
def computing_as(model: torch.nn.Module, onnx_model: ir.Model) -> Iterator[None]:
    """A context in which ``model`` and ``onnx_model`` compute the same: when the ONNX
    model is quantized, ``model``'s quantized weights are dequantized
    (:func:`weights_swapped`) and the quantized products compute in the inputs' float
    type (:func:`exact_products`); nothing changes otherwise. What the validation and
    the generation check compare."""
    if QUANTIZATION_KEY not in onnx_model.metadata_props:
        yield
        return
    with weights_swapped(model, dequantized_weights(onnx_model)), exact_products(onnx_model):
        yield


@contextlib.contextmanager
def exact_products(onnx_model: ir.Model) -> Iterator[int]:
    """Inside, every ``MatMulNBits`` of ``onnx_model`` computes in its inputs' float
    type (``accuracy_level`` 0); each has its own level again on exit. Yields how many
    nodes changed: with level 4 (int8 activations) the model is not exact by design,
    and the same graph at level 0 is what can be checked exactly."""
    changed = []
    for node in _all_nodes(onnx_model):
        level = node.attributes.get("accuracy_level")
        if node.op_type == "MatMulNBits" and level is not None and level.value:
            changed.append((node, level))
            node.attributes["accuracy_level"] = ir.AttrInt64("accuracy_level", 0)
    try:
        yield len(changed)
    finally:
        for node, level in changed:
            node.attributes["accuracy_level"] = level


@contextlib.contextmanager
def weights_swapped(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> Iterator[None]:
    """``module``'s parameters named in ``weights`` hold those values inside, their own
    again on exit (the module is the user's: nothing of it changes for good)."""
    parameters = dict(module.named_parameters(remove_duplicate=False))
    unknown = sorted(set(weights) - set(parameters))
    if unknown:
        raise OnnxExportError(f"quantized weights not found in the model: {unknown[:5]}")
    saved = {}
    try:
        with torch.no_grad():
            for name, value in weights.items():
                parameter = parameters[name]
                if id(parameter) in saved:
                    continue
                saved[id(parameter)] = (parameter, parameter.data)
                parameter.data = value.to(parameter.dtype).reshape(parameter.shape)
        yield
    finally:
        for parameter, data in saved.values():
            parameter.data = data
