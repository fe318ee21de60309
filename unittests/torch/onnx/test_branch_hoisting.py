"""Nodes both sides of an ``If`` compute alike are computed once before it
(:mod:`yobx.torch.onnx.branch_hoisting`), and once for the graph when several ``If``
nodes computed them (:func:`yobx.torch.onnx.optimize.hoist_branch_twins`): the model
computes the same values on both sides of every condition."""

from __future__ import annotations

import copy

import numpy as np
import onnx_ir as ir
import pytest

from unittests.torch.onnx._helpers import run_ir_model
from unittests.torch.onnx.branch_program_generator import check_merge
from yobx.torch.onnx.branch_hoisting import hoist_out_of_branches
from yobx.torch.onnx.optimize import hoist_branch_twins

_FLOAT = ir.TensorType(ir.DataType.FLOAT)


class _Writer:
    """Nodes written into lists, their outputs named ``v<n>`` (unique in the model)."""

    def __init__(self) -> None:
        self.count = 0

    def op(self, op_type: str, inputs: list, into: list, **attributes) -> ir.Value:
        node = ir.node(op_type, inputs, attributes=attributes or None, name=f"n{self.count}")
        node.outputs[0].name = f"v{self.count}"
        self.count += 1
        into.append(node)
        return node.outputs[0]

    def choice(self, condition, then_side: tuple, else_side: tuple, into: list) -> ir.Value:
        """``If(condition)``, each side ``(nodes, output)``."""
        branches = {}
        for name, (nodes, output) in (("then_branch", then_side), ("else_branch", else_side)):
            graph = ir.Graph([], [output], nodes=nodes, name=f"g{self.count}_{name}")
            branches[name] = ir.AttrGraph(name, graph)
        node = ir.node("If", [condition], attributes=branches, name=f"n{self.count}")
        node.outputs[0].name = f"v{self.count}"
        self.count += 1
        into.append(node)
        return node.outputs[0]


def _model(layers: int = 2, nested: bool = False) -> ir.Model:
    """``layers`` ``If`` nodes on ``x.sum() > 0``, each side computing ``Neg(Exp(x))``
    (a chain of twins) and something of its own with the layer's value; with
    ``nested``, the then side computes ``Abs(x)`` in both sides of an ``If`` of its own
    (on ``x.max() > 1``) and the else side computes it too."""
    w = _Writer()
    x = ir.Value(name="x", type=_FLOAT, shape=ir.Shape(["n"]))
    nodes: list[ir.Node] = []
    zero = w.op("Constant", [], nodes, value=ir.tensor(np.array(0.0, np.float32)))
    one = w.op("Constant", [], nodes, value=ir.tensor(np.array(1.0, np.float32)))
    condition = w.op("Greater", [w.op("ReduceSum", [x], nodes, keepdims=0), zero], nodes)
    inner_condition = w.op("Greater", [w.op("ReduceMax", [x], nodes, keepdims=0), one], nodes)
    outputs = []
    current = x
    for layer in range(layers):
        scale = w.op("Constant", [], nodes, value=ir.tensor(np.array(layer + 2.0, np.float32)))
        own = w.op("Mul", [current, scale], nodes)
        then_nodes: list[ir.Node] = []
        negated = w.op("Neg", [w.op("Exp", [x], then_nodes)], then_nodes)
        then_out = w.op("Add", [negated, own], then_nodes)
        else_nodes: list[ir.Node] = []
        negated = w.op("Neg", [w.op("Exp", [x], else_nodes)], else_nodes)
        else_out = w.op("Sub", [negated, own], else_nodes)
        if nested:
            inner_then: list[ir.Node] = []
            inner_else: list[ir.Node] = []
            absolute = w.op("Abs", [x], inner_then)
            inner_then_out = w.op("Sqrt", [absolute], inner_then)
            absolute = w.op("Abs", [x], inner_else)
            inner_else_out = w.op("Tanh", [absolute], inner_else)
            inner = w.choice(
                inner_condition,
                (inner_then, inner_then_out),
                (inner_else, inner_else_out),
                then_nodes,
            )
            then_out = w.op("Add", [then_out, inner], then_nodes)
            else_out = w.op("Add", [else_out, w.op("Abs", [x], else_nodes)], else_nodes)
        current = w.choice(condition, (then_nodes, then_out), (else_nodes, else_out), nodes)
        outputs.append(current)
    for value in outputs:
        value.type, value.shape = _FLOAT, ir.Shape(["n"])
    graph = ir.Graph([x], outputs, nodes=nodes, opset_imports={"": 18}, name="main")
    return ir.Model(graph, ir_version=10)


def _run(model: ir.Model, x: np.ndarray) -> list[np.ndarray]:
    return run_ir_model(model, {"x": x})


def _branch_nodes(model: ir.Model) -> int:
    return sum(1 for node in ir.traversal.RecursiveGraphIterator(model.graph)) - len(model.graph)


_INPUTS = [
    np.array([0.5, 2.0, -0.25], np.float32),  # both conditions true
    np.array([0.5, 0.75, -0.25], np.float32),  # the outer one only
    np.array([-3.0, 2.0, -0.25], np.float32),  # the inner one only
    np.array([-3.0, 0.5, -1.0], np.float32),  # neither
]


@pytest.mark.parametrize("nested", [False, True])
def test_twins_leave_the_if_and_the_values_stay(nested):
    model = _model(nested=nested)
    original = copy.deepcopy(model)
    hoisted = hoist_out_of_branches(model)
    # per layer: Exp then Neg (a chain), and Abs out of the nested If then out of the
    # outer one
    assert hoisted == 2 * (2 + (2 if nested else 0)), hoisted
    # a pair hoisted out of the outer If leaves two nodes of the branches; out of the
    # nested one, its copy is in the then side still
    assert _branch_nodes(model) == _branch_nodes(original) - 2 * (4 + (3 if nested else 0))
    for x in _INPUTS:
        for got, expected in zip(_run(model, x), _run(original, x)):
            np.testing.assert_array_equal(got, expected)


def test_twins_of_several_ifs_run_once_for_the_graph():
    model = _model(layers=3)
    original = copy.deepcopy(model)
    assert hoist_branch_twins(model) == 6
    # one Exp and one Neg for the three layers
    ops = [node.op_type for node in model.graph]
    assert ops.count("Exp") == 1 and ops.count("Neg") == 1, ops
    for x in _INPUTS:
        for got, expected in zip(_run(model, x), _run(original, x)):
            np.testing.assert_array_equal(got, expected)


def test_outputs_of_a_branch_and_nodes_with_subgraphs_stay():
    w = _Writer()
    x = ir.Value(name="x", type=_FLOAT, shape=ir.Shape(["n"]))
    nodes: list[ir.Node] = []
    zero = w.op("Constant", [], nodes, value=ir.tensor(np.array(0.0, np.float32)))
    condition = w.op("Greater", [w.op("ReduceSum", [x], nodes, keepdims=0), zero], nodes)
    sides = []
    for _ in range(2):
        side: list[ir.Node] = []
        # an If in each side, alike: it holds a subgraph, it stays
        inner_sides = []
        for _ in range(2):
            inner_nodes: list[ir.Node] = []
            inner_sides.append((inner_nodes, w.op("Sin", [x], inner_nodes)))
        inner = w.choice(condition, inner_sides[0], inner_sides[1], side)
        # the output of the branch: it stays
        sides.append((side, w.op("Exp", [inner], side)))
    w.choice(condition, sides[0], sides[1], nodes)
    nodes[-1].outputs[0].type = _FLOAT
    graph = ir.Graph([x], [nodes[-1].outputs[0]], nodes=nodes, opset_imports={"": 18})
    model = ir.Model(graph, ir_version=10)
    # the Sin of the nested If and the Exp are outputs of their branches, the If holds
    # subgraphs: nothing moves
    assert hoist_out_of_branches(model) == 0
    for side in ("then_branch", "else_branch"):
        branch = model.graph[-1].attributes[side].value
        assert [node.op_type for node in branch] == ["If", "Exp"]


def test_random_programs_compute_the_same_after_hoisting():
    # the generator's branches (not merged) share many nodes; 20 programs, every pair
    # of conditions, two sizes (_scripts/fuzz_branch_merging.py --hoist-only for more)
    outcomes = [check_merge(seed, hoist_only=True) for seed in range(20)]
    wrong = [o for o in outcomes if o.wrong]
    assert not wrong, wrong
    assert sum(o.hoisted > 0 for o in outcomes) >= 10
