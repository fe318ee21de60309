"""The chain of an exported model's runtime checks, and the gates it puts on the inputs.

:mod:`.runtime_checks` computes, for each constraint, a boolean that holds when the
inputs' sizes satisfy it. This module turns those booleans into the nodes that stop the
model where one does not hold, and makes every input the model reads wait for them:

* **the chain**: each check decides the shape a ``Reshape`` of a one-element token asks
  for, ``[1]`` when the condition holds, ``[2]`` when it does not (onnxruntime refuses),
  each ``Reshape`` reading the token the previous one returned. The ``Reshape`` is named
  after the constraint, so onnxruntime's error names the first broken one.
* **the fast path**: a decode step checks some forty constraints (each cache tensor's
  batch and length...) at every token, and onnxruntime spends about a microsecond on
  each node it runs, whatever it computes (its profile of the decode step of
  ``_scripts/bench_decode_latency.py``). From :data:`FAST_PATH_FROM` checks on, the
  conditions are combined first (``Concat``, ``ReduceMin``), and an ``If`` runs the
  chain (two nodes per check) only when one of them does not hold: five nodes on the
  path a valid input takes, the same error on the others. The equalities between two
  input sizes, most of the forty, are computed at once (:func:`compare_sizes`).
* **the gates**: every input the model reads becomes ``Reshape(x, zeros)``, the token
  expanded to the input's rank. A ``0`` in a ``Reshape``'s shape keeps the input's
  dimension, so the gate returns the input as it is (a view, no copy) after the chain
  has passed: one node per input and one per rank, and no node of the model runs before
  every check has passed. Outputs computed from no input at all are gated themselves.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np
import onnx_ir as ir

#: from this many checks on, the conditions are combined before the chain (which then
#: runs only when one does not hold): below, the ``If`` costs more than it saves
FAST_PATH_FROM = 4


@dataclasses.dataclass(frozen=True)
class SizePair:
    """A check that two sizes of the inputs are equal (``past_key_values.3.key.size(0)
    == batch``, most of a decode step's checks): ``(input, axis)`` each. Many are
    compared at once (:func:`compare_sizes`)."""

    left: tuple[ir.Value, int]
    right: tuple[ir.Value, int]


#: what a check computes: a one-element boolean, the element of a vector of booleans at
#: an index, or two sizes to compare
Holds = ir.Value | tuple[ir.Value, int] | SizePair


class NodeWriter(Protocol):
    """What writes the checks' nodes (:class:`.runtime_checks._CheckGraph`)."""

    def op(
        self, op_type: str, inputs: list, name: str | None = None, into: list | None = None, **a
    ) -> ir.Value:
        """The output of a new node, appended to ``into`` (default: the nodes written
        before the model's), its name and its output's unique in the model."""

    def int_constant(self, value: int) -> ir.Value:
        """A one-element int64 constant, written once before the model's nodes."""

    def append(self, node: ir.Node) -> None:
        """Appends a node made elsewhere to the nodes written before the model's."""

    def constant(self, array: np.ndarray) -> ir.Value:
        """A constant, written once before the model's nodes."""


def compare_sizes(writer: NodeWriter, conditions: list[tuple[Holds, str]]) -> list:
    """``conditions`` with each :class:`SizePair` computed: from
    :data:`FAST_PATH_FROM` of them on, all at once (the shapes of the inputs they read
    concatenated, the two sides gathered and compared: a vector of booleans), else one
    ``Equal`` each."""
    pairs = [holds for holds, _ in conditions if isinstance(holds, SizePair)]
    resolved: dict[int, Holds] = {}
    if 0 < len(pairs) < FAST_PATH_FROM:
        for pair in pairs:
            sizes = [
                writer.op("Shape", [v], start=a, end=a + 1) for v, a in (pair.left, pair.right)
            ]
            resolved[id(pair)] = writer.op("Equal", sizes)
    elif pairs:
        values: list[ir.Value] = []
        for pair in pairs:
            for value, _ in (pair.left, pair.right):
                if not any(value is v for v in values):
                    values.append(value)
        offsets, shapes, start = {}, [], 0
        for value in values:
            offsets[id(value)] = start
            start += len(value.shape)
            shapes.append(writer.op("Shape", [value]))
        every = writer.op("Concat", shapes, axis=0)
        sides = [
            writer.op("Gather", [every, writer.constant(np.array(positions, dtype=np.int64))])
            for positions in zip(
                *[[offsets[id(v)] + a for v, a in (p.left, p.right)] for p in pairs]
            )
        ]
        equal = writer.op("Equal", sides)
        resolved = {id(pair): (equal, index) for index, pair in enumerate(pairs)}
    return [(resolved.get(id(holds), holds), name) for holds, name in conditions]


def chain_checks(
    writer: NodeWriter, token: ir.Value, conditions: list[tuple[Holds, str]], prefix: str
) -> ir.Value:
    """The chain's last token: it exists only when every condition holds.

    :param writer: makes the nodes
    :param token: the first token, ``[0]`` (int64)
    :param conditions: ``(holds, name)`` of each check, in the order they are reported:
        a one-element boolean (or an element of a vector of them, see
        :func:`compare_sizes`) and the name of the node that fails when it is false
    :param prefix: the beginning of the names of the helper nodes
    """
    if len(conditions) < FAST_PATH_FROM:
        return _chained(writer, token, conditions, into=None)
    flags: list[ir.Value] = []
    for holds, _ in conditions:
        flag = holds[0] if isinstance(holds, tuple) else holds
        if not any(flag is f for f in flags):
            flags.append(flag)
    combined = writer.op("Concat", flags, axis=0) if len(flags) > 1 else flags[0]
    # ReduceMin has no boolean kernel before opset 20
    combined = writer.op("Cast", [combined], to=ir.DataType.INT64)
    combined = writer.op("ReduceMin", [combined], keepdims=0)
    combined = writer.op("Cast", [combined], to=ir.DataType.BOOL)
    # the branches read the enclosing graph's values (conditions, constants, token)
    passed: list[ir.Node] = []
    failed: list[ir.Node] = []
    outputs = {
        "then_branch": (passed, writer.op("Identity", [token], into=passed)),
        "else_branch": (failed, _chained(writer, token, conditions, into=failed)),
    }
    choice = ir.node(
        "If",
        [combined],
        attributes={
            key: ir.AttrGraph(key, ir.Graph([], [out], nodes=nodes, name=f"{prefix}{key}"))
            for key, (nodes, out) in outputs.items()
        },
        name=f"{prefix}every_check",
    )
    checked = choice.outputs[0]
    checked.name = f"{prefix}checked_token"
    for value in (checked, *(out for _, out in outputs.values())):
        # no shape: onnxruntime removes a Reshape whose output has its input's static
        # shape as a no-op, and the chain would be gone
        value.dtype = ir.DataType.INT64
    writer.append(choice)
    return checked


def _chained(
    writer: NodeWriter,
    token: ir.Value,
    conditions: list[tuple[Holds, str]],
    into: list[ir.Node] | None,
) -> ir.Value:
    one, two = writer.int_constant(1), writer.int_constant(2)
    for holds, name in conditions:
        if isinstance(holds, tuple):
            # an element of the vector comparing sizes (where the chain runs)
            vector, index = holds
            start, end = writer.int_constant(index), writer.int_constant(index + 1)
            holds = writer.op("Slice", [vector, start, end], into=into)
        shape = writer.op("Where", [holds, one, two], into=into)
        token = writer.op("Reshape", [token, shape], name=name, into=into)
    return token


def gate_graph(
    graph: ir.Graph, writer: NodeWriter, token: ir.Value, ours: set[int], prefix: str
) -> list[ir.Node]:
    """Makes every input ``graph``'s nodes read go through ``token``, and the outputs
    computed from no input; returns the nodes gating those outputs, which go at the
    graph's end (the others are written by ``writer``).

    :param ours: the ids of the checks' own nodes (they read the inputs' sizes)
    """
    zeros: dict[int, ir.Value] = {}

    def gated(value: ir.Value, into: list[ir.Node] | None) -> ir.Value:
        if value.shape is None:
            shape = writer.op("Shape", [value], into=into)
            shape = writer.op("Add", [shape, token], into=into)
        else:
            rank = len(value.shape)
            if rank not in zeros:
                # the token repeated to the rank; for a scalar, none of it (onnxruntime
                # expands [0] to a shape [0] as [1]): computed from the token either way.
                # For a vector, the token's absolute value (0 too): onnxruntime removes
                # an Expand to the token's own shape, and its ReshapeFusion then fused the
                # check's Reshape into the gate's, typed as the token (int64) instead of
                # the input ("Type (tensor(float)) of output arg (z__checked) does not
                # match expected type (tensor(int64))": fuzz_onnx seed 7488)
                if rank == 0:
                    zero = writer.int_constant(0)
                    zeros[rank] = writer.op("Slice", [token, zero, zero])
                elif rank == 1:
                    zeros[rank] = writer.op("Abs", [token])
                else:
                    zeros[rank] = writer.op("Expand", [token, writer.int_constant(rank)])
            shape = zeros[rank]
        name = f"{prefix}gate_{value.name}"
        checked = writer.op("Reshape", [value, shape], name=name, into=into)
        checked.dtype, checked.shape = value.dtype, value.shape
        return checked

    replacements = []
    for value in graph.inputs:
        # the model's uses: the checks read the sizes of the input itself
        uses = [use for use in value.uses() if id(use.node) not in ours]
        if uses:
            checked = gated(value, None)
            checked.name = f"{value.name}__checked"
            replacements.append((checked, uses))
    for checked, uses in replacements:
        for use in uses:
            use.node.replace_input_with(use.idx, checked)
    depends = depending_values(graph, {id(checked) for checked, _ in replacements})
    after: list[ir.Node] = []
    for index, value in enumerate(list(graph.outputs)):
        if id(value) in depends or value.is_graph_input():
            continue
        # an output computed from no input (a constant): gated itself, after it
        checked = gated(value, after)
        name = value.name
        value.name = f"{name}__unchecked"
        checked.name = name
        graph.outputs[index] = checked
    return after


def depending_values(graph: ir.Graph, sources: set[int]) -> set[int]:
    """The ids of the values of ``graph`` computed from one of ``sources`` (ids of
    values), through subgraphs too (a branch reading an outer value)."""
    depends = set(sources)
    for node in graph:
        inputs = [v for v in node.inputs if v is not None]
        for attribute in node.attributes.values():
            if attribute.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                subgraphs = (
                    attribute.value if isinstance(attribute.value, list) else [attribute.value]
                )
                for subgraph in subgraphs:
                    for inner in ir.traversal.RecursiveGraphIterator(subgraph):
                        inputs.extend(v for v in inner.inputs if v is not None)
        if any(id(v) in depends for v in inputs):
            depends.update(id(v) for v in node.outputs)
    return depends


__all__ = [
    "FAST_PATH_FROM",
    "Holds",
    "NodeWriter",
    "SizePair",
    "chain_checks",
    "compare_sizes",
    "depending_values",
    "gate_graph",
]
