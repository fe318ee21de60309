"""The constant inputs of ONNX nodes, read and replaced in a model and its subgraphs.

The rewrites that make a version captured at size 0 loadable by onnxruntime
(:mod:`~yobx.torch.onnx.zero_divisors`, :mod:`~yobx.torch.onnx.empty_reshapes`) each
look for the nodes of one operator whose input is a constant onnxruntime checks when the
session is created, and give that input another constant.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from yobx.torch.onnx.ort_fusions import graphs_within


def nodes_with_constant_input(
    model: ir.Model, op_type: str, index: int
) -> Iterator[tuple[ir.Graph, ir.Node, np.ndarray]]:
    """``(graph, node, value)`` for each node of the standard operator ``op_type``, in
    the model and its subgraphs, whose input ``index`` is a constant (its value as an
    array). The nodes of a graph are listed before any is yielded: the caller may insert
    nodes."""
    for graph in graphs_within(model.graph):
        for node in list(graph):
            if node.op_type != op_type or node.domain not in ("", "ai.onnx"):
                continue
            value = node.inputs[index] if len(node.inputs) > index else None
            tensor = None if value is None else value.const_value
            if tensor is not None:
                yield graph, node, tensor.numpy()


def replace_constant_input(
    graph: ir.Graph, node: ir.Node, index: int, array: np.ndarray, suffix: str
) -> None:
    """Feeds ``node``'s input ``index`` from a new ``Constant`` holding ``array``,
    inserted before the node; the new node and value are named after the node and the
    old value, followed by ``suffix``."""
    old = node.inputs[index]
    assert old is not None
    constant = ir.node(
        "Constant", [], attributes={"value": ir.tensor(array)}, name=f"{node.name}{suffix}"
    )
    output = constant.outputs[0]
    output.name = f"{old.name}{suffix}"
    output.dtype, output.shape = ir.DataType.from_numpy(array.dtype), ir.Shape(array.shape)
    graph.insert_before(node, constant)
    node.replace_input_with(index, output)


__all__ = ["nodes_with_constant_input", "replace_constant_input"]
