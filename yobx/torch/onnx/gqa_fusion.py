"""The attention of a decode step as onnxruntime's ``GroupQueryAttention``.

A decoder step with a key-value cache computes, per layer, what transformers' eager and
sdpa attentions compute::

    present_k = Concat(past_k, k, axis=2)          # (batch, kv_heads, total, head)
    present_v = Concat(past_v, v, axis=2)
    scores = (q * c) @ (repeat_kv(present_k) * c).T + mask     # c * c = scale
    attention = Softmax(scores) @ repeat_kv(present_v)

(transformers' eager attention scales the scores instead, ``(q @ k.T) * scale``, which
onnxruntime's fusions run before this one write ``FusedMatMul(q, k, transB=1)``; the
rotation of the queries and keys, when it has transformers' form, becomes the
operator's own: :mod:`.gqa_rotary`).

``repeat_kv`` copies the whole cache once per query head of a group, and the product
reads it transposed: at batch 4 with 512 past tokens, that is most of the step's time in
onnxruntime. Its contrib operator ``com.microsoft.GroupQueryAttention`` takes the cache
in the model's own layout and unrepeated, writes ``present_k``/``present_v`` itself, and
adds the model's own mask (``attention_bias``), which keeps the step exact with padded
masks (onnxruntime-genai's builder derives positions from the mask instead).

``GroupQueryAttention`` is always causal: a query at position ``i`` of ``seq`` new
tokens sees the keys up to ``past + i``. For one new token (``seq == 1``) that is every
key, so the operator computes the model's attention for any mask; for a prompt it
would be exact only for a causal mask, and onnxruntime's CPU kernel refuses a batch of
several prompts that continue a cache. Two forms are fused:

* the version of a step for one new token, where torch already groups the query heads
  by key-value head instead of repeating the cache (``Reshape`` of the query to
  ``(batch, kv_heads, heads / kv_heads, head)``, the cache itself in the products): the
  operator takes its place;
* the attention for any number of tokens (keys repeated by ``repeat_kv``): an ``If``
  chooses the operator when ``seq == 1`` and the model's own nodes otherwise
  (prefill, chunked prefill).

Rows whose mask is all ``-inf`` keep the exported model's own treatment (the ``Where``
after the attention, which zeroes them).

Only these patterns are fused, recognised node by node and checked on the shapes
inferred for them (static head counts and head size, the query's grouping, ``Softmax``
on the last axis, the mask of the query's dtype) and on the shapes the reshapes of the
transposed keys read: any other attention is left as it is. Measured on a Llama-style
step: ``python _scripts/bench_decode_latency.py --layers 8 --variants
yobx,yobx-ort,builder``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from yobx.torch.onnx.gqa_rotary import NodeList, Rotary, RotaryCaches, rotary_of
from yobx.torch.onnx.gqa_sizes import StepSizes
from yobx.torch.onnx.ir_values import constant_ints, constant_scalar, dims_of, producer
from yobx.torch.onnx.ort_fusions import graphs_within

_MS = "com.microsoft"
#: what the attentions of a model share: the rotary caches, the operator's sizes
Shared = tuple[RotaryCaches, StepSizes]


@dataclasses.dataclass
class _Site:
    """One attention of the pattern, in one graph."""

    graph: ir.Graph
    query: ir.Value
    key: ir.Value
    value: ir.Value
    past_key: ir.Value
    past_value: ir.Value
    mask: ir.Value
    scale: float
    heads: int
    kv_heads: int
    head_size: int
    #: the nodes computing the attention and the present cache, in graph order
    nodes: list[ir.Node]
    attention: ir.Value
    present_key: ir.Value
    present_value: ir.Value
    #: one token's query grouped by key-value head, against the unrepeated cache (the
    #: attention is then ``(batch, kv_heads, heads / kv_heads, head)``)
    grouped: bool = False
    #: the rotations of the query and the key, which the operator applies itself
    #: (:mod:`.gqa_rotary`), None when they are not of that form
    rotary: tuple[Rotary, Rotary] | None = None

    def operands(self) -> tuple[ir.Value, ...]:
        """What the operator reads: the query and key before their rotation."""
        if self.rotary is None:
            return (self.query, self.key, self.value, self.past_key, self.past_value, self.mask)
        query, key = self.rotary
        rest = (self.value, self.past_key, self.past_value, self.mask, query.cos, query.sin)
        return (query.source, key.source, *rest)


def _cache_concat(value: ir.Value | None, graph: ir.Graph) -> ir.Node | None:
    """``Concat(past, new, axis=2)`` of two rank-4 values with the same static heads
    and head size, the node producing ``value``."""
    concat = producer(value, "Concat", graph)
    if concat is None or len(concat.inputs) != 2:
        return None
    if concat.attributes.get_int("axis") not in (2, -2):
        return None
    past, new = (dims_of(v) for v in concat.inputs)
    if past is None or new is None or len(past) != 4 or len(new) != 4:
        return None
    if not isinstance(past[1], int) or not isinstance(past[3], int):
        return None
    return concat if (new[1], new[3]) == (past[1], past[3]) else None


def _repeated_cache(value: ir.Value, graph: ir.Graph) -> list[ir.Node] | None:
    """The nodes from the cache's ``Concat`` to ``value``: none but the ``Concat`` when
    ``value`` is the cache itself, ``Unsqueeze(2)``, ``Expand`` and ``Reshape`` when it
    is the cache repeated per head of a group (transformers' ``repeat_kv``)."""
    concat = _cache_concat(value, graph)
    if concat is not None:
        return [concat]
    reshape = producer(value, "Reshape", graph)
    expand = reshape and producer(reshape.inputs[0], "Expand", graph)
    unsqueeze = expand and producer(expand.inputs[0], "Unsqueeze", graph)
    concat = unsqueeze and _cache_concat(unsqueeze.inputs[0], graph)
    out = dims_of(value)
    if concat is None or constant_ints(unsqueeze.inputs[1]) != [2] or out is None or len(out) != 4:
        return None
    kv_heads, head = dims_of(concat.inputs[0])[1], dims_of(concat.inputs[0])[3]
    if out[3] != head or not isinstance(out[1], int) or out[1] % kv_heads:
        return None
    expanded = dims_of(expand.outputs[0])
    if expanded is not None and len(expanded) != 5:
        return None
    if expanded is not None and isinstance(expanded[2], int) and expanded[2] != out[1] // kv_heads:
        return None
    return [concat, unsqueeze, expand, reshape]


def _shape_axes(value: ir.Value | None, source: ir.Value, graph: ir.Graph) -> list | None:
    """The axes of the rank-4 ``source`` that the 1-d shape ``value`` lists, ``-1`` for
    a constant ``-1`` (whatever is left): ``Concat`` of ``Slice(Shape(source))`` and
    ``Shape(source, start, end)``, as torch's lowering writes the shape of a view."""
    constant = constant_ints(value)
    if constant is not None:
        return constant if constant == [-1] else None
    concat = producer(value, "Concat", graph)
    if concat is not None:
        axes = [_shape_axes(part, source, graph) for part in concat.inputs]
        return None if any(a is None for a in axes) else [x for a in axes for x in a]
    node, part = producer(value, "Slice", graph), slice(None)
    if node is not None:
        bounds = [constant_ints(v) for v in node.inputs[1:3]]
        if None in bounds or (
            len(node.inputs) > 4 and constant_ints(node.inputs[4]) not in (None, [1])
        ):
            return None
        if len(node.inputs) > 3 and constant_ints(node.inputs[3]) not in (None, [0]):
            return None
        (start,), (end,) = bounds
        part = slice(start, end)
        node = producer(node.inputs[0], "Shape", graph)
    else:
        node = producer(value, "Shape", graph)
    if node is None or node.inputs[0] is not source:
        return None
    # Python's slicing has ONNX's semantics: negative bounds count from the end, both
    # clamped (torch writes INT64_MAX for "to the end")
    start, end = node.attributes.get_int("start", 0), node.attributes.get_int("end", None)
    return [0, 1, 2, 3][start:end][part]


def _transposed_keys(value: ir.Value, graph: ir.Graph) -> tuple[list[ir.Node], ir.Value] | None:
    """The nodes transposing the last two axes of a rank-4 value into ``value``, and
    that value: ``Transpose(perm=[0, 1, 3, 2])``, or torch's ``Reshape`` to rank 3,
    ``Transpose(perm=[0, 2, 1])`` and ``Reshape`` back, checked on the shapes the
    reshapes take (read from the source's own ``Shape``)."""
    transpose = producer(value, "Transpose", graph)
    if transpose is not None:
        if list(transpose.attributes.get_ints("perm") or []) != [0, 1, 3, 2]:
            return None
        return [transpose], transpose.inputs[0]
    back = producer(value, "Reshape", graph)
    transpose = back and producer(back.inputs[0], "Transpose", graph)
    flat = transpose and producer(transpose.inputs[0], "Reshape", graph)
    if flat is None or list(transpose.attributes.get_ints("perm") or []) != [0, 2, 1]:
        return None
    source = flat.inputs[0]
    # (-1, axis 2, axis 3), transposed, then (axes 0 and 1, axis 3, axis 2)
    if _shape_axes(flat.inputs[1], source, graph) != [-1, 2, 3]:
        return None
    if _shape_axes(back.inputs[1], source, graph) != [0, 1, 3, 2]:
        return None
    return [flat, transpose, back], source


def _scaled(value: ir.Value, graph: ir.Graph) -> tuple[list[ir.Node], ir.Value, float] | None:
    mul = producer(value, "Mul", graph)
    if mul is None:
        return [], value, 1.0
    for index in (0, 1):
        factor = constant_scalar(mul.inputs[1 - index])
        if factor is not None:
            return [mul], mul.inputs[index], factor
    return None


def _query(
    value: ir.Value, kv_heads: int, repeated: bool, graph: ir.Graph
) -> tuple[list, ir.Value] | None:
    """The query the product reads, ``(batch, heads, seq, head)``, and the nodes
    between: ``value`` itself against keys repeated per head, or against keys with as
    many heads; against the unrepeated cache of fewer heads, the reshape of a single
    token's query grouping its heads by key-value head (``(batch, kv_heads, heads /
    kv_heads, head)``, what torch makes of a one-token step)."""
    dims = dims_of(value)
    if dims is None or len(dims) != 4:
        return None
    if repeated:
        return [], value
    # the grouped query first: its second axis has as many entries as the cache's
    reshape = producer(value, "Reshape", graph)
    query = reshape and dims_of(reshape.inputs[0])
    if query is not None and len(query) == 4 and query[2] == 1 and query[0] is not None:
        heads = query[1]
        grouping = isinstance(heads, int) and heads % kv_heads == 0 and heads > kv_heads
        if grouping and dims == [query[0], kv_heads, heads // kv_heads, query[3]]:
            return [reshape], reshape.inputs[0]
    if dims[1] == kv_heads and (isinstance(dims[2], str) or dims[2] == 1):
        # as many query heads as key-value heads, any number of tokens
        return [], value
    return None


def _scores(
    value: ir.Value, graph: ir.Graph
) -> tuple[list[ir.Node], float, ir.Value, ir.Value] | None:
    """The nodes computing the attention scores ``value``, their scale, the query and
    the keys they read (not transposed): ``MatMul(q * a, Transpose(k * b))`` (sdpa
    scales both sides), ``MatMul(q, Transpose(k)) * s`` (transformers' eager attention
    scales the scores), or onnxruntime's ``FusedMatMul(q, k, transB=1, alpha=a)``,
    which the fusions run before this one make of the latter (times ``s``)."""
    nodes: list[ir.Node] = []
    scale = 1.0
    mul = producer(value, "Mul", graph)
    for index in (0, 1):
        factor = mul and constant_scalar(mul.inputs[1 - index])
        if factor is not None and len(mul.inputs[index].uses()) == 1:
            nodes, scale, value = [mul], factor, mul.inputs[index]
            break
    node = value.producer()
    if node is None or node.graph is not graph:
        return None
    if node.op_type == "FusedMatMul" and node.domain == _MS:
        flags = [node.attributes.get_int(k, 0) for k in ("transA", "transB", "transBatchA")]
        if flags != [0, 1, 0] or node.attributes.get_int("transBatchB", 0):
            return None
        alpha = node.attributes.get_float("alpha", 1.0)
        return [*nodes, node], scale * alpha, node.inputs[0], node.inputs[1]
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
        return None
    query_side, key_side = _scaled(node.inputs[0], graph), _scaled(node.inputs[1], graph)
    transposed = key_side and _transposed_keys(key_side[1], graph)
    if query_side is None or transposed is None:
        return None
    keys = transposed[1]
    scales = scale * query_side[2] * key_side[2]
    nodes = [*nodes, node, *query_side[0], *key_side[0], *transposed[0]]
    return nodes, scales, query_side[1], keys


def _match(softmax: ir.Node, graph: ir.Graph) -> _Site | None:
    """The attention computed around ``softmax``, when it is the pattern fused here."""
    axis = softmax.attributes.get_int("axis", -1)
    add = producer(softmax.inputs[0], "Add", graph)
    uses = list(softmax.outputs[0].uses())
    if add is None or axis not in (-1, 3) or len(uses) != 1:
        return None
    out = uses[0].node
    if out.op_type != "MatMul" or out.domain not in ("", "ai.onnx") or uses[0].idx != 0:
        return None
    for index in (0, 1):
        scores = _scores(add.inputs[index], graph)
        if scores is not None:
            mask = add.inputs[1 - index]
            break
    else:
        return None
    score_nodes, scale, query_value, keys_value = scores
    keys = _repeated_cache(keys_value, graph)
    values = _repeated_cache(out.inputs[1], graph)
    if keys is None or values is None or len(keys) != len(values):
        return None
    kv_heads = dims_of(keys[0].inputs[0])[1]
    grouping = _query(query_value, kv_heads, len(keys) > 1, graph)
    if grouping is None:
        return None
    query = grouping[1]
    query_dims, mask_dims = dims_of(query), dims_of(mask)
    if query_dims is None or len(query_dims) != 4 or not isinstance(query_dims[1], int):
        return None
    if mask_dims is None or len(mask_dims) != 4 or mask.dtype != query.dtype:
        return None
    if len(keys) > 1 and {dims_of(keys_value)[1], dims_of(out.inputs[1])[1]} != {query_dims[1]}:
        return None  # keys and values repeated to as many heads as the query has
    if mask_dims[1] not in (1, query_dims[1]) or (grouping[0] and mask_dims[2] != 1):
        return None  # a mask the operator cannot read (per key-value head...)
    past_key, key = keys[0].inputs
    past_value, value = values[0].inputs
    head_size = dims_of(past_key)[3]
    if query_dims[3] != head_size or query_dims[1] % kv_heads:
        return None
    if (dims_of(past_value)[1], dims_of(past_value)[3]) != (kv_heads, head_size):
        return None
    nodes = [*keys, *values, *grouping[0], *score_nodes]
    site = _Site(
        graph=graph,
        query=query,
        key=key,
        value=value,
        past_key=past_key,
        past_value=past_value,
        mask=mask,
        scale=scale,
        heads=query_dims[1],
        kv_heads=kv_heads,
        head_size=head_size,
        nodes=[*nodes, add, softmax, out],
        attention=out.outputs[0],
        present_key=keys[0].outputs[0],
        present_value=values[0].outputs[0],
        grouped=bool(grouping[0]),
    )
    rotations = rotary_of(site.query), rotary_of(site.key)
    # onnxruntime's CPU kernel rotates heads of a multiple of 16 only ("head_size shall
    # be a multiple of 16")
    if rotations[0] is not None and rotations[1] is not None and head_size % 16 == 0:
        angles = [(r.cos, r.sin) for r in rotations]
        if angles[0] == angles[1] and rotations[0].cos.dtype == query.dtype:
            site.rotary = (rotations[0], rotations[1])
            site.nodes = [*rotations[0].nodes, *rotations[1].nodes, *site.nodes]
    return site


def _downstream(values: list[ir.Value], graph: ir.Graph) -> set[ir.Node]:
    found: set[ir.Node] = set()
    pending = list(values)
    while pending:
        for use in pending.pop().uses():
            node = use.node
            if node.graph is graph and node not in found:
                found.add(node)
                pending.extend(node.outputs)
    return found


def _upstream(nodes: list[ir.Node], graph: ir.Graph) -> set[ir.Node]:
    found: set[ir.Node] = set()
    pending = list(nodes)
    while pending:
        for value in pending.pop().inputs:
            node = None if value is None else value.producer()
            if node is not None and node.graph is graph and node not in found:
                found.add(node)
                pending.append(node)
    return found


def _region(site: _Site) -> list[ir.Node] | None:
    """The nodes the ``If`` takes over: the site's, and those computed from its values
    that its nodes read (the shapes of the repeated cache); None when a value of the
    region other than the attention and the present cache is read elsewhere, or when
    an operand of the operator is computed in the region."""
    core = set(site.nodes)
    outputs = [site.attention, site.present_key, site.present_value]
    inner = [v for node in site.nodes for v in node.outputs if v not in outputs]
    region = core | (
        _downstream([*outputs, *inner], site.graph) & _upstream(site.nodes, site.graph)
    )
    if any(value.producer() in region for value in site.operands()):
        return None  # computed from the present cache (a mask from its length)
    for node in region:
        for value in node.outputs:
            if value in outputs:
                continue
            if value.is_graph_output() or any(use.node not in region for use in value.uses()):
                return None
    return [node for node in site.graph if node in region]


def _packed(value: ir.Value, nodes: NodeList, graph: ir.Graph) -> ir.Value:
    """``value``, ``(batch, heads, seq, head)``, as the operator reads it: ``(batch, seq,
    heads * head)``. That is the projection itself when ``value`` is its ``Reshape`` to
    ``(batch, seq, heads, head)`` transposed (a linear layer's output split into heads),
    two nodes less."""
    projection = _projection(value, graph)
    if projection is not None:
        return projection
    flat = nodes.constant(np.array([0, 0, -1], np.int64))
    return nodes.add("Reshape", [nodes.add("Transpose", [value], perm=[0, 2, 1, 3])[0], flat])[0]


def _projection(value: ir.Value, graph: ir.Graph) -> ir.Value | None:
    """The ``(batch, seq, heads * head)`` value ``value`` splits into heads and
    transposes, if it does (checked on the shapes)."""
    transpose = producer(value, "Transpose", graph)
    split = transpose and producer(transpose.inputs[0], "Reshape", graph)
    if split is not None and list(transpose.attributes.get_ints("perm") or []) == [0, 2, 1, 3]:
        source, heads = dims_of(split.inputs[0]), dims_of(split.outputs[0])
        if (
            source is not None
            and heads is not None
            and (len(source), len(heads)) == (3, 4)
            and None not in source[:2]
            and source[:2] == heads[:2]
            and all(isinstance(d, int) for d in (source[2], heads[2], heads[3]))
            and source[2] == heads[2] * heads[3]
        ):
            return split.inputs[0]
    return None


def _group_query_attention(
    site: _Site, nodes: NodeList, shared: Shared, before: ir.Node
) -> list[ir.Value]:
    """``GroupQueryAttention`` on the site's values: its attention ``(batch, seq,
    heads * head)`` and the present key and value. A rotation of the query and key
    becomes the operator's own, its caches written once before ``before``; the sizes
    the operator reads are written once for the model where the inputs name them
    (:mod:`.gqa_sizes`)."""
    caches, sizes = shared
    query, key, value = (_packed(v, nodes, site.graph) for v in site.operands()[:3])
    dims = [dims_of(v) or [None] * 3 for v in (query, key, site.past_key)]
    found = sizes.sizes(dims[0][0], dims[1][1], dims[2][2])
    if found is None:
        found = _layer_sizes(site, query, key, nodes)
    # the model's mask, (batch or 1, heads or 1, seq, total or 1), as the operator
    # reads it: (batch, heads or 1, seq, total)
    bias = nodes.add("Expand", [site.mask, found[5]])[0]
    inputs = [query, key, value, site.past_key, site.past_value, found[3], found[4]]
    rotary: list = [None, None, None]
    if site.rotary is not None:
        rotary = list(caches.inputs(site.rotary[0], site.past_key, before))
    return nodes.add(
        "GroupQueryAttention",
        [*inputs, *rotary, bias],
        domain=_MS,
        outputs=3,
        num_heads=site.heads,
        kv_num_heads=site.kv_heads,
        scale=float(site.scale),
        do_rotary=int(site.rotary is not None),
    )


def _layer_sizes(
    site: _Site, query: ir.Value, key: ir.Value, nodes: NodeList
) -> tuple[ir.Value, ...]:
    """The sizes of :meth:`.StepSizes.sizes` read on the layer's own values (when the
    model's inputs do not name them)."""
    one = nodes.constant(np.array([1], np.int64))
    past = nodes.add("Shape", [site.past_key], start=2, end=3)[0]
    # sizes read on the packed values: the heads split and transposed may then be
    # computed only where the model's own attention reads them (.branch_sinking)
    seq = nodes.add("Shape", [key], start=1, end=2)[0]
    total = nodes.add("Add", [past, seq])[0]
    batch = nodes.add("Shape", [query], start=0, end=1)[0]
    last = nodes.add("Sub", [total, one])[0]
    seqlens = nodes.add("Cast", [nodes.add("Expand", [last, batch])[0]], to=6)[0]
    total32 = nodes.add("Cast", [nodes.add("Squeeze", [total])[0]], to=6)[0]
    shape = nodes.add("Concat", [batch, one, seq, total], axis=0)[0]
    return (batch, seq, total, seqlens, total32, shape)


def _decode_branch(site: _Site, name: str, shared: Shared, before: ir.Node) -> ir.Graph:
    """``GroupQueryAttention``, its outputs in the model's layout."""
    nodes = NodeList(f"{name}_decode")
    attention, present_key, present_value = _group_query_attention(site, nodes, shared, before)
    heads = nodes.constant(np.array([0, 0, site.heads, site.head_size], np.int64))
    attention = nodes.add("Reshape", [attention, heads])[0]
    attention = nodes.add("Transpose", [attention], perm=[0, 2, 1, 3])[0]
    outputs = [nodes.add("Identity", [v])[0] for v in (attention, present_key, present_value)]
    return ir.Graph([], outputs, nodes=nodes, name=f"{name}_decode")


def _model_branch(region: list[ir.Node], site: _Site, name: str) -> ir.Graph:
    """A copy of the region's nodes, reading the enclosing graph's values directly."""
    mapping: dict[ir.Value, ir.Value] = {}
    nodes = []
    for node in region:
        inputs = [None if v is None else mapping.get(v, v) for v in node.inputs]
        copy = ir.Node(
            node.domain,
            node.op_type,
            inputs,
            attributes=list(node.attributes.values()),
            num_outputs=len(node.outputs),
            overload=node.overload,
        )
        copy.name = f"{name}_{node.name}"
        for old, new in zip(node.outputs, copy.outputs):
            new.dtype, new.shape = old.dtype, old.shape
            new.name = f"{name}_{old.name}"
            mapping[old] = new
        nodes.append(copy)
    outputs = [mapping[v] for v in (site.attention, site.present_key, site.present_value)]
    return ir.Graph([], outputs, nodes=nodes, name=f"{name}_model")


def _replace(site: _Site, region: list[ir.Node], news: list[ir.Value], added: list) -> None:
    """Inserts ``added`` after the region, makes ``news`` stand for the attention and
    the present cache (names of graph outputs included) and removes the region."""
    graph = site.graph
    olds = [site.attention, site.present_key, site.present_value]
    for old, new in zip(olds, news):
        new.dtype, new.shape = old.dtype, old.shape
    graph.insert_after(region[-1], added)
    for old, new in zip(olds, news):
        if old.is_graph_output():
            name = old.name
            old.name = f"{name}_unfused"
            new.name = name
        old.replace_all_uses_with(new, replace_graph_outputs=True)
    for node in reversed(region):
        graph.remove(node, safe=True)


def _fuse_grouped(site: _Site, region: list[ir.Node], index: int, shared: Shared) -> None:
    """One token's attention: ``GroupQueryAttention`` in its place, the attention
    reshaped to the grouped layout the model computes next."""
    nodes = NodeList(f"yobx_gqa_{index}")
    attention, present_key, present_value = _group_query_attention(site, nodes, shared, region[0])
    grouped = [0, site.kv_heads, site.heads // site.kv_heads, site.head_size]
    attention = nodes.add("Reshape", [attention, nodes.constant(np.array(grouped, np.int64))])
    _replace(site, region, [attention[0], present_key, present_value], nodes)


def _fuse_choice(site: _Site, region: list[ir.Node], index: int, shared: Shared) -> None:
    """Any number of tokens: an ``If`` choosing ``GroupQueryAttention`` for one."""
    name = f"yobx_gqa_{index}"
    nodes = NodeList(name)
    # the number of tokens, read on the projection where there is one (see _packed)
    query = site.operands()[0]
    projection = _projection(query, site.graph)
    axis = 2 if projection is None else 1
    source = query if projection is None else projection
    seq = nodes.add("Shape", [source], start=axis, end=axis + 1)[0]
    one = nodes.constant(np.array([1], np.int64))
    condition = nodes.add("Squeeze", [nodes.add("Equal", [seq, one])[0]])[0]
    choice = ir.node(
        "If",
        [condition],
        attributes={
            "then_branch": ir.AttrGraph(
                "then_branch", _decode_branch(site, name, shared, region[0])
            ),
            "else_branch": ir.AttrGraph("else_branch", _model_branch(region, site, name)),
        },
        num_outputs=3,
        name=name,
    )
    for position, value in enumerate(choice.outputs):
        value.name = f"{name}_output_{position}"
    nodes.append(choice)
    _replace(site, region, list(choice.outputs), nodes)


def fuse_group_query_attention(model: ir.Model) -> int:
    """Replaces each attention of the pattern of this module's docstring, in the model
    and its subgraphs, by an ``If`` choosing ``GroupQueryAttention`` for one new token;
    returns how many were fused. Needs the shapes inferred (checked on them)."""
    sites = []
    for graph in list(graphs_within(model.graph)):
        for node in list(graph):
            if node.op_type == "Softmax" and node.domain in ("", "ai.onnx"):
                site = _match(node, graph)
                region = site and _region(site)
                if region:
                    sites.append((site, region))
    shared = (RotaryCaches(), StepSizes(model))
    for index, (site, region) in enumerate(sites):
        if site.grouped:
            _fuse_grouped(site, region, index, shared)
        else:
            _fuse_choice(site, region, index, shared)
    if sites:
        model.opset_imports.setdefault(_MS, 1)
        for graph in graphs_within(model.graph):
            graph.sort()
    return len(sites)


__all__ = ["fuse_group_query_attention"]
