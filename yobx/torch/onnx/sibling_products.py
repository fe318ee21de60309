"""4-bit weight products of the same input, computed as one.

A decoder layer multiplies one normalized input by the weights of its queries, keys and
values, and another by those of its gate and up projections. Quantized
(:mod:`.quantize`), each is a ``MatMulNBits``; onnxruntime-genai's builder writes one
product for the queries, keys and values of a layer. In onnxruntime's profile of an
8-layer Llama decode step (4 bits, one thread), our 57 products took 1.85 ms of kernel
time, the builder's 41 took 1.62 ms. Fused here (33 products), the whole step went from
2.76 to 2.74 ms (``_scripts/bench_decode_latency.py``'s ``yobx-ort-int4-l4``, sessions
alternating): a call costs little next to the bytes each product reads, and the gain
is small but there.

:func:`fuse_sibling_products` writes the ``MatMulNBits`` nodes of a graph reading the
same input with the same attributes as one node whose weights are the ``Concat`` of
theirs along ``N`` (the 4-bit data ``[N, blocks, bytes]`` and the scales, one per
column and block), followed by a ``Split`` of its output along the last axis into the
original outputs. The file keeps each weight under its own name (onnxruntime's constant
folding, on at every graph optimization level but ``ORT_DISABLE_ALL``, computes the
``Concat`` of initializers once when it loads the model, then prepacks the result): the
checkpoint's names, :func:`~yobx.torch.onnx.quantize.dequantized_weights` and the
tools reading the weights find them as before. The rewrite is exact: a column of a
matrix product depends only on that column of the weights, and each block of a column
is quantized on its own, so the fused product computes the same columns, which the
``Split`` hands back in order.

Only quantized products are fused: in float32 the products of a decode step are bound
by the bytes of their weights, which fusing does not change (measured: our separate
``MatMul`` nodes took 6.60 ms of kernel time against 6.84 ms for the builder's fused
ones), and a float ``MatMul`` behind a ``Concat`` is one a weight-only quantizer no
longer finds.
"""

from __future__ import annotations

import onnx_ir as ir

_MS = "com.microsoft"
#: the attributes fused products must share (N is summed)
_SHARED = ("K", "bits", "block_size", "accuracy_level")


def fuse_sibling_products(model: ir.Model) -> int:
    """Fuses the ``MatMulNBits`` nodes reading the same input in every graph of
    ``model`` (see the module's documentation); returns how many nodes were removed."""
    removed = 0
    for graph in (model.graph, *_subgraphs_of(model.graph)):
        removed += _fuse_in(graph)
    return removed


def _subgraphs_of(graph: ir.Graph) -> list[ir.Graph]:
    found = []
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                found.append(attribute.value)
            elif attribute.type == ir.AttributeType.GRAPHS:
                found.extend(attribute.value)
    return found


def _constant(value: ir.Value | None) -> bool:
    return value is not None and (value.const_value is not None or value.is_initializer())


def _group_key(node: ir.Node) -> tuple | None:
    """What fused products share (their input and attributes); None for a node that
    cannot be fused: not a ``MatMulNBits``, zero points, a bias or group indices,
    weights that are not constants."""
    if node.op_type != "MatMulNBits" or node.domain != _MS or len(node.inputs) != 3:
        return None
    source, data, scales = node.inputs
    if source is None or not _constant(data) or not _constant(scales):
        return None
    if data.dtype != ir.DataType.UINT8 or len(node.outputs) != 1:
        return None
    if set(node.attributes) - {*_SHARED, "N"}:
        return None
    shared = tuple(
        node.attributes[name].value if name in node.attributes else None for name in _SHARED
    )
    return (id(source), *shared)


def _fuse_in(graph: ir.Graph) -> int:
    groups: dict[tuple, list[ir.Node]] = {}
    for node in graph:
        key = _group_key(node)
        if key is not None:
            groups.setdefault(key, []).append(node)
    removed = 0
    for nodes in groups.values():
        if len(nodes) > 1:
            _fuse(graph, nodes)
            removed += len(nodes) - 1
    return removed


def _fuse(graph: ir.Graph, nodes: list[ir.Node]) -> None:
    first = nodes[0]
    name = f"{first.name or first.outputs[0].name}_fused"
    columns = [int(node.attributes["N"].value) for node in nodes]
    data = ir.node("Concat", [node.inputs[1] for node in nodes], {"axis": 0}, name=f"{name}_data")
    scales = ir.node(
        "Concat", [node.inputs[2] for node in nodes], {"axis": 0}, name=f"{name}_scales"
    )
    attributes = {key: attr.value for key, attr in first.attributes.items()}
    attributes["N"] = sum(columns)
    fused = ir.node(
        "MatMulNBits",
        [first.inputs[0], data.outputs[0], scales.outputs[0]],
        attributes,
        domain=_MS,
        name=name,
    )
    sizes = ir.node(
        "Constant",
        [],
        {"value": ir.tensor(columns, dtype=ir.DataType.INT64)},
        name=f"{name}_sizes",
    )
    split = ir.node(
        "Split",
        [fused.outputs[0], sizes.outputs[0]],
        {"axis": -1},
        num_outputs=len(nodes),
        name=f"{name}_split",
    )
    for node in (data, scales, fused, sizes):
        node.outputs[0].name = node.name
    fused.outputs[0].dtype = first.outputs[0].dtype
    # the first product is before the others' readers, its input before it
    graph.insert_before(first, [data, scales, fused, sizes, split])
    for node, output in zip(nodes, split.outputs):
        old = node.outputs[0]
        output.dtype, output.shape = old.dtype, old.shape
        old.replace_all_uses_with(output, replace_graph_outputs=True)
        graph.remove(node, safe=True)
        output.name = old.name


__all__ = ["fuse_sibling_products"]
