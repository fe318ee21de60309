"""Weights of linear layers stored as their matrix multiplications read them.

``torch.nn.Linear`` keeps its weight ``[out, in]`` and computes ``x @ W.T``; translated
as it is, every linear layer is ``MatMul(x, Transpose(W))`` (``Gemm(x, W, transB=1)``
on 2-d inputs). onnxruntime folds the transposition when it loads the model, but tools
working on the file do not look through it: onnxruntime's weight-only quantizers
(``MatMulNBitsQuantizer``) quantize a ``MatMul`` whose second input is an initializer,
and found none to quantize in such a graph.

:func:`store_weights_transposed` stores such a weight ``[in, out]`` under its own
name, once, and the ``MatMul`` reads it directly; a ``Gemm`` of a weight becomes
``MatMul`` (+ ``Add`` of its bias), which onnxruntime fuses back into ``Gemm`` where it
is faster, and so does onnxruntime's ``FusedMatMul`` of a transposed weight (what
``optimize="ort"`` fuses ``Transpose`` + ``MatMul`` into). The data is transposed when
it is read (when the model is saved or run): nothing is copied at export, and a weight
still on the meta device stays pending.
:func:`yobx.torch.onnx.weights.apply_weights` transposes what it reads from a
checkpoint for the initializers listed in the model's metadata under
:data:`TRANSPOSED_WEIGHTS_KEY`.

A weight also read otherwise (an embedding tied to the output projection, read by a
``Gather`` too) keeps its layout unless ``tied=True``: then the projection reads a
transposed copy, ``<name>.transposed``, which doubles it in the file (what a quantizer
shrinks eight times).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir
import torch

from yobx.torch.onnx.weights import (
    TRANSPOSED_SUFFIX,
    TRANSPOSED_WEIGHTS_KEY,
    PendingWeight,
    is_pending,
    transposed_weights,
)

__all__ = [
    "TRANSPOSED_SUFFIX",
    "TRANSPOSED_WEIGHTS_KEY",
    "TransposedTensor",
    "node_depths",
    "store_weights_transposed",
    "transposed_tensor",
    "transposed_weights",
]


def store_weights_transposed(
    model: ir.Model, names: Iterable[str], tied: bool = False, max_depth: int | None = 1
) -> int:
    """Stores the 2-d weights among ``names`` that the graph only reads transposed
    (``Transpose(perm=[1, 0])``, ``Gemm``'s ``B`` with ``transB=1``) as ``[in, out]``
    and removes the transpositions; returns how many weights were stored so.

    :param model: the exported model (its subgraphs included)
    :param names: the initializers that are weights (named after the state dict)
    :param tied: also give a weight read otherwise (a tied embedding) a transposed copy
        for its transposed reads
    :param max_depth: only weights whose readers sit at most that many subgraphs deep
        (``None``: any depth). Deeper (a choice between versions nested in another),
        onnxruntime (1.32) runs the model faster with a ``Transpose`` of the weight
        inside the subgraph, which it folds there into a weight of the subgraph's own:
        with every weight stored ``[in, out]`` at the top, a Llama decode step took
        17.5 ms against 9.6 ms (batch 4, past 512; ``_scripts/bench_decode_latency.py
        --layers 4 --variants yobx,yobx-in-out``). A single float ``MatMul`` at that
        depth runs as fast as at the top (``_scripts/bench_nested_prepack.py``): the
        cost lies in how onnxruntime runs the nested branches, not isolated further.
        Quantizing (which needs the weights as the ``MatMul`` inputs) passes ``None``.
    """
    graph = model.graph
    depths = node_depths(graph) if max_depth is not None else {}
    stored = []
    for name in names:
        value = graph.initializers.get(name)
        if value is None or value.shape is None or len(value.shape) != 2:
            continue
        uses = list(value.uses())
        transposing = [(node, index) for node, index in uses if _reads_transposed(node, index)]
        if not transposing:
            continue
        if max_depth is not None and any(depths[node] > max_depth for node, _ in transposing):
            continue
        if len(transposing) == len(uses):
            _transpose_in_place(value)
            target = value
        elif tied:
            target = _transposed_copy(graph, value)
        else:
            continue
        for node, _ in transposing:
            _read_directly(node, value, target)
        stored.append(target.name)
    if stored:
        previous = json.loads(model.metadata_props.get(TRANSPOSED_WEIGHTS_KEY, "[]"))
        model.metadata_props[TRANSPOSED_WEIGHTS_KEY] = json.dumps(sorted({*previous, *stored}))
    return len(stored)


def node_depths(graph: ir.Graph, depth: int = 0, into: dict | None = None) -> dict[ir.Node, int]:
    """How many subgraphs deep each node of ``graph`` is (0 for the main graph)."""
    found = {} if into is None else into
    for node in graph:
        found[node] = depth
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                node_depths(attribute.as_graph(), depth + 1, found)
            elif attribute.type == ir.AttributeType.GRAPHS:
                for subgraph in attribute.as_graphs():
                    node_depths(subgraph, depth + 1, found)
    return found


def _attribute(node: ir.Node, name: str, default: int | float) -> int | float:
    attribute = node.attributes.get(name)
    return default if attribute is None else attribute.value


def _reads_transposed(node: ir.Node, index: int) -> bool:
    """``node`` reads its input ``index`` transposed, and nothing else of it."""
    if node.domain == "com.microsoft" and node.op_type == "FusedMatMul" and index == 1:
        # optimize="ort" fuses Transpose + MatMul before the versions are merged and
        # their weight products reach the main graph: a plain one is MatMul(A, W.T)
        return all(
            _attribute(node, name, 0) == 0 for name in ("transA", "transBatchA", "transBatchB")
        ) and (_attribute(node, "transB", 0) == 1 and _attribute(node, "alpha", 1.0) == 1.0)
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Transpose":
        perm = node.attributes.get("perm")
        returned = node.outputs[0].is_graph_output()
        return perm is not None and list(perm.value) == [1, 0] and not returned
    if node.op_type == "Gemm" and index == 1:
        # a plain one: C (when given) is added as it is, which an Add broadcasts alike
        return (
            _attribute(node, "transB", 0) == 1
            and _attribute(node, "transA", 0) == 0
            and _attribute(node, "alpha", 1.0) == 1.0
            and (_attribute(node, "beta", 1.0) == 1.0 or len(node.inputs) < 3)
        )
    return False


def _transpose_in_place(value: ir.Value) -> None:
    value.const_value = transposed_tensor(value.const_value, value.name)
    value.shape = value.const_value.shape


def _transposed_copy(graph: ir.Graph, value: ir.Value) -> ir.Value:
    name = value.name + TRANSPOSED_SUFFIX
    existing = graph.initializers.get(name)
    if existing is not None:
        return existing
    data = transposed_tensor(value.const_value, name)
    copy = ir.Value(name=name, shape=data.shape, type=value.type, const_value=data)
    graph.register_initializer(copy)
    return copy


def transposed_tensor(tensor: ir.TensorProtocol, name: str) -> ir.TensorProtocol:
    """``tensor`` transposed, computed when its data is read (a weight still without
    data stays pending, with the transposed shape)."""
    rows, columns = tensor.shape
    if is_pending(tensor):
        return PendingWeight(name, tensor.dtype, ir.Shape([columns, rows]))
    return TransposedTensor(tensor, name)


class TransposedTensor(ir.LazyTensor):
    """A 2-d tensor read transposed: computed when its data is read, and written to a
    file in bands of rows.

    Saving writes each tensor with ``tofile``; onnx-ir's lazy tensor would evaluate the
    whole transposed copy and then its bytes, two copies of the largest weight (a 720 MB
    output projection of a model past 2 GB raised the peak memory of its export by half
    the weights). A band holds at most :attr:`BAND_BYTES`.
    """

    #: the most bytes one band of the transposed tensor holds while it is written
    BAND_BYTES = 1 << 24

    def __init__(self, source: ir.TensorProtocol, name: str):
        rows, columns = source.shape
        self.source = source
        super().__init__(self._load, dtype=source.dtype, shape=ir.Shape([columns, rows]), name=name)

    def _matrix(self) -> torch.Tensor | np.ndarray:
        raw = getattr(self.source, "raw", None)
        return raw if isinstance(raw, torch.Tensor) else self.source.numpy()

    def _load(self) -> ir.TensorProtocol:
        matrix = self._matrix()
        if isinstance(matrix, torch.Tensor):
            return ir.tensor(matrix.t().contiguous(), name=self.name)
        return ir.tensor(np.ascontiguousarray(matrix.T), name=self.name)

    def tofile(self, file) -> None:
        """Writes the transposed bytes to ``file``, one band of rows at a time."""
        if self.dtype.bitwidth % 8:
            # packed sub-byte types: no weight of a linear layer is stored so at export
            super().tofile(file)
            return
        matrix = self._matrix()
        rows = matrix.shape[0]
        band = max(1, self.BAND_BYTES // max(1, rows * self.dtype.bitwidth // 8))
        for start in range(0, matrix.shape[1], band):
            part = matrix[:, start : start + band]
            if isinstance(part, torch.Tensor):
                # bytes of any dtype, bfloat16 included (which numpy lacks)
                data = part.t().contiguous().reshape(-1).view(torch.uint8).numpy()
            else:
                data = np.ascontiguousarray(part.T).reshape(-1).view(np.uint8)
            file.write(memoryview(data))


def _read_directly(node: ir.Node, weight: ir.Value, stored: ir.Value) -> None:
    """Makes the readers of ``node`` (a transposition of ``weight``) read ``stored``,
    the weight transposed, and removes ``node``."""
    owner = node.graph
    if node.op_type == "Transpose":
        node.outputs[0].replace_all_uses_with(stored)
        owner.remove(node, safe=True)
        return
    # Gemm(A, W, C, transB=1) = MatMul(A, stored) + C; FusedMatMul(A, W, transB=1) =
    # MatMul(A, stored)
    output = node.outputs[0]
    name = output.name
    # named after the Gemm's output: in a subgraph, no name authority gives new values
    # unique names, and two "val_0" break single assignment
    matmul = ir.node("MatMul", [node.inputs[0], stored], name=f"{node.name}_matmul")
    new_nodes = [matmul]
    result = matmul.outputs[0]
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        result.name, result.type = f"{name}_matmul", output.type
        add = ir.node("Add", [result, node.inputs[2]], name=f"{node.name}_bias")
        new_nodes.append(add)
        result = add.outputs[0]
    output.name = None
    result.name, result.type, result.shape = name, output.type, output.shape
    owner.insert_after(node, new_nodes)
    output.replace_all_uses_with(result, replace_graph_outputs=True)
    owner.remove(node, safe=True)
