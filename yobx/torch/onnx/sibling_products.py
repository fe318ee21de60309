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

An onnxruntime ``GroupQueryAttention`` (``optimize="ort"``, :mod:`.gqa_fusion`) reading
the queries, keys and values of one fused product then reads that product itself, its
packed form (``query`` of ``heads + 2 * kv_heads`` heads, no ``key`` nor ``value``):
:func:`pack_attention_inputs`. The ``Split`` is then only read where the model's own
attention runs (a prompt), and :mod:`.branch_sinking` moves it there.

Only quantized products are fused: in float32 the products of a decode step are bound
by the bytes of their weights, which fusing does not change (measured: our separate
``MatMul`` nodes took 6.60 ms of kernel time against 6.84 ms for the builder's fused
ones), and a float ``MatMul`` behind a ``Concat`` is one a weight-only quantizer no
longer finds.
"""

from __future__ import annotations

import onnx_ir as ir

from yobx.torch.onnx.ort_fusions import graphs_within

_MS = "com.microsoft"
#: the attributes fused products must share (N is summed)
_SHARED = ("K", "bits", "block_size", "accuracy_level")


def fuse_sibling_products(model: ir.Model) -> int:
    """Fuses the ``MatMulNBits`` nodes reading the same input in every graph of
    ``model`` (see the module's documentation); returns how many nodes were removed."""
    return sum(_fuse_in(graph) for graph in list(graphs_within(model.graph)))


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


def pack_attention_inputs(model: ir.Model) -> int:
    """Makes each ``GroupQueryAttention`` reading the three parts of a fused product's
    ``Split`` (queries, keys and values, in that order, of the operator's head counts)
    read the product itself, packed (see the module's documentation); returns how many."""
    packed = 0
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type == "GroupQueryAttention" and node.domain == _MS:
            source = _packed_source(node)
            if source is not None:
                node.replace_input_with(0, source)
                node.replace_input_with(1, None)
                node.replace_input_with(2, None)
                packed += 1
    return packed


def _packed_source(node: ir.Node) -> ir.Value | None:
    """The fused product whose ``Split`` gives exactly the operator's query, key and
    value, else None."""
    if len(node.inputs) < 3 or any(value is None for value in node.inputs[:3]):
        return None
    split = node.inputs[0].producer()  # type: ignore[union-attr]
    if split is None or split.op_type != "Split" or len(split.outputs) != 3:
        return None
    if [value.producer() for value in node.inputs[:3]] != [split] * 3:  # type: ignore[union-attr]
        return None
    if [value.index() for value in node.inputs[:3]] != [0, 1, 2]:  # type: ignore[union-attr]
        return None
    product = split.inputs[0].producer() if split.inputs[0] is not None else None
    if product is None or product.op_type != "MatMulNBits":
        return None
    if split.attributes.get_int("axis") != -1:
        return None
    sizes = split.inputs[1].producer() if len(split.inputs) > 1 and split.inputs[1] else None
    if sizes is None or sizes.op_type != "Constant":
        return None
    columns = [int(c) for c in sizes.attributes["value"].value.numpy()]
    heads = node.attributes.get_int("num_heads")
    kv_heads = node.attributes.get_int("kv_num_heads")
    if not heads or not kv_heads or columns[0] % heads:
        return None
    head = columns[0] // heads
    return split.inputs[0] if columns == [heads * head, kv_heads * head, kv_heads * head] else None


__all__ = ["fuse_sibling_products", "pack_attention_inputs"]
