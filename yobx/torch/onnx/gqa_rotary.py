"""The rotary embedding of an attention, applied by ``GroupQueryAttention`` itself.

transformers' Llama-style attention rotates its queries and keys before the product::

    rotated = x * Unsqueeze(cos, 1) + Concat(-x[..., h:], x[..., :h]) * Unsqueeze(sin, 1)

with ``x`` of shape ``(batch, heads, seq, head)``, ``h = head / 2`` and ``cos``, ``sin``
of shape ``(batch or 1, seq, head)``, computed once per step from the positions.
onnxruntime's ``GroupQueryAttention`` applies the same rotation itself
(``do_rotary=1``, halves not interleaved) from ``cos_cache`` and ``sin_cache`` of shape
``(rows, h)`` and ``position_ids`` of shape ``(batch, seq)``: the token at ``(b, s)``
uses row ``position_ids[b, s]``. Sixteen nodes per layer go (the products, the halves
sliced and negated, the angles unsqueezed).

The fusion does not need to know how the model computes its angles (scaled,
dynamic...): the caches are **the model's own** ``cos`` and ``sin``, one row per token
(``Reshape(cos[..., :h], (-1, h))``), and ``position_ids`` the index of each token's row.
Each token is then rotated by exactly the values the model computes for it. The
operator reads ``h`` values per row, so ``cos`` must hold its first half twice
(``Cos(Concat(f, f))``, what transformers writes): that is checked on the nodes that
compute it, through the branches of ``If`` nodes. onnxruntime also asks for at least
``past + seq`` rows: the caches are padded with zeros (rows no position reads), written
at each step: ``(past + seq) * h`` values, once for all layers, where each layer's
attention reads ``2 * kv_heads * past * head`` values of its cache.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from yobx.torch.onnx.ir_values import constant_ints, dims_of, producer


@dataclasses.dataclass
class Rotary:
    """One rotation of the pattern: ``rotated`` computed from ``source``."""

    source: ir.Value
    cos: ir.Value
    sin: ir.Value
    #: the nodes between ``source`` and the rotated value (the ``Unsqueeze`` of the
    #: angles aside: several rotations share them)
    nodes: list[ir.Node]


def _last_axis_slice(node: ir.Node | None, rank: int) -> tuple[int, int] | None:
    """``(start, end)`` of a ``Slice`` on the last axis with step 1."""
    if node is None or len(node.inputs) < 4:
        return None
    starts, ends, axes = (constant_ints(v) for v in node.inputs[1:4])
    steps = constant_ints(node.inputs[4]) if len(node.inputs) > 4 else [1]
    if starts is None or ends is None or axes is None or steps != [1]:
        return None
    if len(starts) != 1 or axes[0] % rank != rank - 1:
        return None
    return starts[0], ends[0]


def _angle(mul: ir.Node, source: ir.Value) -> ir.Value | None:
    """``cos`` for ``Mul(source, Unsqueeze(cos, 1))`` (either order)."""
    if source not in mul.inputs:
        return None
    other = mul.inputs[1] if mul.inputs[0] is source else mul.inputs[0]
    unsqueeze = producer(other, "Unsqueeze")
    if unsqueeze is None or constant_ints(unsqueeze.inputs[1]) != [1]:
        return None
    return unsqueeze.inputs[0]


def _rotate_half(value: ir.Value, half: int) -> tuple[ir.Value, list[ir.Node]] | None:
    """``x`` and the nodes for ``Concat(Neg(x[..., h:]), x[..., :h], axis=-1)``."""
    concat = producer(value, "Concat")
    if (
        concat is None
        or len(concat.inputs) != 2
        or concat.attributes.get_int("axis")
        not in (
            -1,
            3,
        )
    ):
        return None
    neg = producer(concat.inputs[0], "Neg")
    upper = neg and producer(neg.inputs[0], "Slice")
    lower = producer(concat.inputs[1], "Slice")
    if upper is None or lower is None or upper.inputs[0] is not lower.inputs[0]:
        return None
    first, second = _last_axis_slice(upper, 4), _last_axis_slice(lower, 4)
    if first is None or second is None or first[0] != half or first[1] < 2 * half:
        return None
    if second != (0, half):
        return None
    return upper.inputs[0], [upper, neg, lower, concat]


def rotary_of(value: ir.Value) -> Rotary | None:
    """The rotation computing ``value``, when it has the module's form on a value of
    rank 4 with a static, even head size."""
    dims = dims_of(value)
    add = producer(value, "Add")
    if add is None or dims is None or len(dims) != 4 or not isinstance(dims[3], int):
        return None
    half = dims[3] // 2
    if dims[3] % 2:
        return None
    for straight, rotated in ((0, 1), (1, 0)):
        plain, turned = (producer(add.inputs[i], "Mul") for i in (straight, rotated))
        if plain is None or turned is None:
            continue
        for index in (0, 1):
            found = _rotate_half(turned.inputs[index], half)
            if found is None:
                continue
            source, nodes = found
            cos, sin = _angle(plain, source), _angle(turned, turned.inputs[index])
            if cos is not None and sin is not None and _angles_fit(cos, sin, dims):
                return Rotary(source, cos, sin, [*nodes, plain, turned, add])
    return None


def _angles_fit(cos: ir.Value, sin: ir.Value, dims: list) -> bool:
    """``cos`` and ``sin`` of shape ``(batch or 1, seq, head)`` for a value of shape
    ``(batch, heads, seq, head)``, each its first half twice."""
    for angle in (cos, sin):
        shape = dims_of(angle)
        if shape is None or len(shape) != 3 or shape[1:] != [dims[2], dims[3]]:
            return False
        if shape[0] not in (1, dims[0]):
            return False
    return duplicated_halves(cos) and duplicated_halves(sin)


def duplicated_halves(value: ir.Value, depth: int = 0) -> bool:
    """Whether the last axis of ``value`` is its first half twice, on the nodes computing
    it: ``Cos`` or ``Sin`` of ``Concat(f, f, axis=-1)``, through casts, products by a
    scalar and the branches of ``If`` nodes (each branch's output)."""
    node = value.producer()
    if node is None or depth > 16 or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in ("Cast", "Identity"):
        return duplicated_halves(node.inputs[0], depth + 1)
    if node.op_type == "Mul":
        for index in (0, 1):
            other = node.inputs[1 - index]
            if other is not None and other.const_value is not None and other.const_value.size == 1:
                return duplicated_halves(node.inputs[index], depth + 1)
        return False
    if node.op_type in ("Cos", "Sin"):
        concat = producer(node.inputs[0], "Concat")
        if concat is None or len(concat.inputs) != 2 or concat.inputs[0] is not concat.inputs[1]:
            return False
        rank = len(dims_of(value) or ())
        return concat.attributes.get_int("axis") in (-1, rank - 1)
    if node.op_type == "If":
        index = value.index()
        branches = [node.attributes.get_graph(k) for k in ("then_branch", "else_branch")]
        return all(
            b is not None and duplicated_halves(b.outputs[index], depth + 1) for b in branches
        )
    return False


class NodeList(list):
    """Nodes being written, each added by :meth:`add` (outputs returned), their values
    named ``<prefix>_<n>``: names unique in the model, since a subgraph resolves a name
    of its own before one of an enclosing graph (an automatic ``val_3`` would hide the
    enclosing graph's)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def add(self, op: str, inputs: list, domain: str = "", outputs: int = 1, **attributes):
        node = ir.node(op, inputs, attributes=attributes, domain=domain, num_outputs=outputs)
        for value in node.outputs:
            value.name = f"{self.prefix}_{len(self)}_{value.index()}"
        node.name = f"{self.prefix}_node_{len(self)}"
        self.append(node)
        return list(node.outputs)

    def constant(self, array: np.ndarray) -> ir.Value:
        return self.add("Constant", [], value=ir.tensor(array))[0]


class RotaryCaches:
    """The caches and positions of each pair of angles, written once per graph before
    the first attention that reads them (see the module's documentation)."""

    def __init__(self) -> None:
        self.written: dict[tuple[int, int, int], tuple[ir.Value, ir.Value, ir.Value]] = {}

    def inputs(self, rotary: Rotary, past_key: ir.Value, before: ir.Node) -> tuple:
        """``cos_cache``, ``sin_cache`` and ``position_ids`` for the rotation, written the
        first time before ``before`` (in its graph, which ``past_key`` is visible from).

        :param past_key: the cache the operator extends (its batch, and its length for
            the padding)
        """
        # per graph: an attention in another branch cannot read this one's values
        key = (id(before.graph), id(rotary.cos), id(rotary.sin))
        if key not in self.written:
            nodes = NodeList(f"yobx_rotary_{len(self.written)}")
            self.written[key] = _caches(nodes, rotary, past_key)
            before.graph.insert_before(before, nodes)
        return self.written[key]


def _caches(nodes: NodeList, rotary: Rotary, past_key: ir.Value) -> tuple:
    half = dims_of(rotary.cos)[2] // 2
    zero, halves = (nodes.constant(np.array([v], np.int64)) for v in (0, half))
    last = nodes.constant(np.array([-1], np.int64))
    flat = nodes.constant(np.array([-1, half], np.int64))
    # zeros for the rows past the tokens': at least `past + seq` rows in all
    seq = nodes.add("Shape", [rotary.cos], start=1, end=2)[0]
    past = nodes.add("Shape", [past_key], start=2, end=3)[0]
    total = nodes.add("Add", [past, seq])[0]
    shape = nodes.add("Concat", [total, halves], axis=0)[0]
    filler = ir.tensor(np.zeros((1,), dtype=rotary.cos.dtype.numpy()))
    padding = nodes.add("ConstantOfShape", [shape], value=filler)[0]
    caches = []
    for angle in (rotary.cos, rotary.sin):
        first = nodes.add("Slice", [angle, zero, halves, last])[0]
        per_token = nodes.add("Reshape", [first, flat])[0]
        caches.append(nodes.add("Concat", [per_token, padding], axis=0)[0])
    # each token's row: (b, s) reads b * seq + s, or s when the angles are shared by
    # the batch (cos of batch 1)
    grid = nodes.add("Shape", [rotary.cos], start=0, end=2)[0]
    count = nodes.add("ReduceProd", [grid], keepdims=0)[0]
    scalar = nodes.constant(np.array(0, np.int64))
    one = nodes.constant(np.array(1, np.int64))
    rows_of = nodes.add("Reshape", [nodes.add("Range", [scalar, count, one])[0], grid])[0]
    batch = nodes.add("Shape", [past_key], start=0, end=1)[0]
    tokens = nodes.add("Concat", [batch, seq], axis=0)[0]
    positions = nodes.add("Expand", [rows_of, tokens])[0]
    # typed: the merge of the versions' branches pairs what later nodes read
    for cache in caches:
        cache.dtype, cache.shape = rotary.cos.dtype, ir.Shape([None, half])
    positions.dtype, positions.shape = ir.DataType.INT64, ir.Shape([None, None])
    return caches[0], caches[1], positions


__all__ = ["NodeList", "Rotary", "RotaryCaches", "duplicated_halves", "rotary_of"]
