"""Scans of zero steps, which onnxruntime refuses.

A Python loop over a dynamic range (``for i in range(1, x.shape[2])``) becomes a scan
(:mod:`yobx.torch.tracing.core.loop_tracing`), an ONNX ``Scan``. At the size where the
range is empty the scan has no step, which ONNX allows: the loop states come out as they
went in, the stacked outputs are empty. onnxruntime's CPU kernel fails there instead
(``dim0_offset < dim0_size was false``: it slices the first step before looking at the
count), so the exported model raised where eager runs.

:func:`guard_empty_scans` rewrites each ``Scan`` so that it always runs at least one
step: when its inputs are empty, an ``If`` gives it one step of zeros instead, which a
mask input of the body (``True`` for the real steps, ``False`` for that one) keeps from
changing the states (``Where(valid, new state, old state)``), and its stacked outputs
are sliced back to the real count of steps. At any other size the inputs, the states
and the outputs are those of the original scan (the ``Where`` takes the new state).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from yobx.torch.onnx.gqa_rotary import NodeList
from yobx.torch.onnx.ort_fusions import graphs_within


def guard_empty_scans(model: ir.Model) -> int:
    """Rewrites every ``Scan`` of the model, of its local functions (a version's
    branch is one until the optimizer inlines it) and of their subgraphs as the
    module's documentation says; returns how many. A scan whose inputs do not run along
    their first axis forward, or whose first input's element type is unknown, is left
    as it is."""
    roots = [model.graph, *(function.graph for function in model.functions.values())]
    scans = [
        (graph, node)
        for root in roots
        for graph in graphs_within(root)
        for node in graph
        if node.op_type == "Scan" and node.domain in ("", "ai.onnx")
    ]
    count = 0
    for index, (graph, node) in enumerate(scans):
        count += _guard(graph, node, f"yobx_scan_{index}")
    return count


def _guard(graph: ir.Graph, scan: ir.Node, prefix: str) -> int:
    body_attribute = scan.attributes.get("body")
    inputs_count = scan.attributes.get_int("num_scan_inputs", 0)
    if body_attribute is None or inputs_count < 1:
        return 0
    for name in ("scan_input_axes", "scan_input_directions", "scan_output_axes"):
        values = scan.attributes.get_ints(name, None)
        if values is not None and any(values):
            return 0  # not the form torch's scan translates to
    body = body_attribute.as_graph()
    states = len(scan.inputs) - inputs_count
    xs = list(scan.inputs[states:])
    if any(x is None or x.dtype is None for x in xs):
        return 0
    nodes = NodeList(prefix)
    one = nodes.constant(np.array([1], np.int64))
    zero = nodes.constant(np.array([0], np.int64))
    steps = nodes.add("Shape", [xs[0]], start=0, end=1)[0]
    empty = nodes.add("Squeeze", [nodes.add("Equal", [steps, zero])[0]])[0]
    padded = [_one_step_if_empty(nodes, empty, x, f"{prefix}_{i}") for i, x in enumerate(xs)]
    # True for the real steps, False for the step of zeros
    count = nodes.add("Max", [steps, one])[0]
    bounds = [_scalar(nodes, zero), _scalar(nodes, count), _scalar(nodes, one)]
    positions = nodes.add("Range", bounds)[0]
    valid = nodes.add("Less", [positions, steps])[0]
    _mask_states(body, states, prefix)
    attributes = {
        name: attribute
        for name, attribute in scan.attributes.items()
        if name not in ("body", "num_scan_inputs", "scan_input_axes", "scan_input_directions")
    }
    scan.attributes.pop("body")
    guarded = ir.node(
        "Scan",
        [*scan.inputs[:states], *padded, valid],
        attributes={
            **attributes,
            "body": ir.AttrGraph("body", body),
            "num_scan_inputs": ir.AttrInt64("num_scan_inputs", inputs_count + 1),
        },
        num_outputs=len(scan.outputs),
        name=f"{prefix}_guarded",
    )
    for position, value in enumerate(guarded.outputs):
        value.name = f"{prefix}_out_{position}"
    nodes.append(guarded)
    news = list(guarded.outputs[:states])
    for value in guarded.outputs[states:]:
        news.append(nodes.add("Slice", [value, zero, steps, zero])[0])
    graph.insert_before(scan, nodes)
    for old, new in zip(scan.outputs, news):
        new.dtype, new.shape = old.dtype, old.shape
        if old.is_graph_output():
            name = old.name
            old.name = f"{name}_unguarded"
            new.name = name
        old.replace_all_uses_with(new, replace_graph_outputs=True)
    graph.remove(scan, safe=True)
    return 1


def _scalar(nodes: NodeList, value: ir.Value) -> ir.Value:
    return nodes.add("Squeeze", [value])[0]


def _one_step_if_empty(nodes: NodeList, empty: ir.Value, x: ir.Value, name: str) -> ir.Value:
    """``x``, or one step of zeros of its step's shape when ``x`` has no step."""
    zeros = NodeList(f"{name}_then")
    step_shape = zeros.add("Shape", [x], start=1)[0]
    shape = zeros.add("Concat", [zeros.constant(np.array([1], np.int64)), step_shape], axis=0)[0]
    zero = ir.tensor(np.zeros((1,), dtype=x.dtype.numpy()))
    filled = zeros.add("ConstantOfShape", [shape], value=zero)[0]
    same = NodeList(f"{name}_else")
    kept = same.add("Identity", [x])[0]
    choice = ir.node(
        "If",
        [empty],
        attributes={
            "then_branch": ir.AttrGraph(
                "then_branch", ir.Graph([], [filled], nodes=zeros, name=f"{name}_then")
            ),
            "else_branch": ir.AttrGraph(
                "else_branch", ir.Graph([], [kept], nodes=same, name=f"{name}_else")
            ),
        },
        num_outputs=1,
        name=f"{name}_steps",
    )
    choice.outputs[0].name = f"{name}_steps"
    choice.outputs[0].dtype = x.dtype
    nodes.append(choice)
    return choice.outputs[0]


def _mask_states(body: ir.Graph, states: int, prefix: str) -> None:
    """Adds the body's input ``valid`` (one boolean per step) and makes each new state
    ``Where(valid, new state, old state)``."""
    valid = ir.Value(
        name=f"{prefix}_valid", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([])
    )
    body.inputs.append(valid)
    for position in range(states):
        new, old = body.outputs[position], body.inputs[position]
        kept = ir.node("Where", [valid, new, old], name=f"{prefix}_keep_{position}")
        kept.outputs[0].name = f"{prefix}_state_{position}"
        kept.outputs[0].dtype, kept.outputs[0].shape = new.dtype, new.shape
        body.append(kept)
        body.outputs[position] = kept.outputs[0]


__all__ = ["guard_empty_scans"]
