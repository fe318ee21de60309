"""Random ONNX models choosing between two branches that share parts, and the check
that merging their branches (:mod:`yobx.torch.onnx.branch_merging`) keeps what they
compute.

A model takes ``x`` (``[n, 4]``, ``n`` dynamic) and two booleans. It has one to three
``If`` nodes on the first boolean, built alike (layers, each reading the previous one's
outputs), each with two branches built from one list of segments: a *common* segment
writes the same nodes in both branches (reading values by their position from the end
of each branch's pool, so that nodes after a difference read the values that differ,
as a layer after an attention that differs does), a *different* segment writes nodes
of its own in each branch (none in one of them at times). Nodes are elementwise
operations, products with weights of the enclosing graph, reductions keeping their
axis, shape-reading and reshaping nodes, and at times an ``If`` on the second boolean
nested inside a branch, built the same way, or alike inside both, or nested in one
branch while the other computes its then branch itself (a tree with a leaf repeated,
once merged). A branch returns
its last values, at times a value of the enclosing graph itself.

:func:`check_merge` merges the branches as the export does
(:func:`~yobx.torch.onnx.optimize.arrange_branches`: merged, trees collapsed, nodes
only one side reads moved into it), runs the model before and
after in onnxruntime for every pair of booleans and two sizes, and compares the outputs
(to the rounding of the last bits: onnxruntime runs a product in the main graph with
another kernel than in a branch).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir

from yobx.torch.onnx.optimize import arrange_branches, hoist_branch_twins

WIDTH = 4
OUTPUTS = 2


class _Namer:
    def __init__(self):
        self.count = 0

    def __call__(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"


def _step(rng: random.Random, pool: list[str], nodes: list, name, weights: list[str]) -> None:
    """Appends one random node (or two) reading values of ``pool``; its output joins
    the pool."""
    kind = rng.choice(["add", "mul", "sub", "relu", "neg", "matmul", "reduce", "reshape"])
    pick = (rng.randint(1, min(3, len(pool))), rng.randint(1, min(3, len(pool))))
    a, b = pool[-pick[0]], pool[-pick[1]]
    out = name("v")
    if kind in ("add", "mul", "sub"):
        nodes.append(oh.make_node(kind.capitalize(), [a, b], [out], name=name("n")))
    elif kind in ("relu", "neg"):
        nodes.append(oh.make_node(kind.capitalize(), [a], [out], name=name("n")))
    elif kind == "matmul":
        nodes.append(oh.make_node("MatMul", [a, rng.choice(weights)], [out], name=name("n")))
    elif kind == "reduce":
        reduced = name("r")
        nodes.append(oh.make_node("ReduceSum", [a, "axis1"], [reduced], keepdims=1, name=name("n")))
        nodes.append(oh.make_node("Add", [reduced, b], [out], name=name("n")))
    else:
        shape, flat = name("s"), name("f")
        nodes.append(oh.make_node("Shape", [a], [shape], name=name("n")))
        nodes.append(oh.make_node("Reshape", [a, "flat"], [flat], name=name("n")))
        nodes.append(oh.make_node("Reshape", [flat, shape], [out], name=name("n")))
    pool.append(out)


def _branches(
    rng: random.Random, outer: list[str], name, weights: list[str], depth: int
) -> tuple[onnx.GraphProto, onnx.GraphProto]:
    """The two branches of an ``If``, from one list of segments."""
    sides = [([], list(outer)), ([], list(outer))]
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice(["common", "common", "different", "nested", "tree"])
        if kind in ("nested", "tree") and depth >= 1:
            kind = "different"
        if kind == "common":
            state = rng.getstate()
            for nodes, pool in sides:
                rng.setstate(state)
                for _ in range(rng.randint(1, 4)):
                    _step(rng, pool, nodes, name, weights)
        elif kind == "different":
            for nodes, pool in sides:
                for _ in range(rng.choice([0, 1, 1, 2, 3])):
                    _step(rng, pool, nodes, name, weights)
        elif kind == "tree":
            _repeated_leaf(rng, sides, name, weights, depth)
        else:
            # an If on the second boolean, in one branch, or alike in both (the same
            # structure reading each branch's own values)
            chosen = [rng.randint(0, 1)] if rng.random() < 0.5 else [0, 1]
            state = rng.getstate()
            for side in chosen:
                rng.setstate(state)
                nodes, pool = sides[side]
                inner = _branches(rng, pool[-3:], name, weights, depth + 1)
                outs = [name("w") for _ in range(OUTPUTS)]
                nodes.append(
                    oh.make_node("If", ["c2"], outs, then_branch=inner[0], else_branch=inner[1])
                )
                pool += outs
    graphs = []
    for index, (nodes, pool) in enumerate(sides):
        returned = pool[-OUTPUTS:]
        if rng.random() < 0.2:
            # a branch returning a value of the enclosing graph as it is
            returned = [outer[0], *returned[1:]]
        produced = {out for node in nodes for out in node.output}
        for position, value in enumerate(returned):
            if value not in produced:
                # an output of a graph is produced in it: through an Identity
                returned[position] = name("i")
                nodes.append(
                    oh.make_node("Identity", [value], [returned[position]], name=name("n"))
                )
        outputs = [
            oh.make_tensor_value_info(v, onnx.TensorProto.FLOAT, [None, None]) for v in returned
        ]
        graphs.append(oh.make_graph(nodes, name(f"branch{index}_"), [], outputs))
    return graphs[0], graphs[1]


def _repeated_leaf(rng: random.Random, sides: list, name, weights: list[str], depth: int) -> None:
    """An ``If`` on the second boolean in the first branch, and its then branch written
    out in the second branch (reading that branch's own values): once merged, a tree
    of ``If`` nodes with a leaf repeated, as versions give."""
    (then_nodes, then_pool), (else_nodes, else_pool) = sides
    reads = then_pool[-3:]
    inner = _branches(rng, reads, name, weights, depth + 1)
    outs = [name("w") for _ in range(OUTPUTS)]
    then_nodes.append(oh.make_node("If", ["c2"], outs, then_branch=inner[0], else_branch=inner[1]))
    then_pool += outs
    # the values of the same positions from the end (the first one again when the
    # second branch has fewer)
    renamed = {
        value: else_pool[-min(len(reads) - index, len(else_pool))]
        for index, value in enumerate(reads)
    }
    for node in inner[0].node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = name("n")
        for index, value in enumerate(copy.input):
            copy.input[index] = renamed.get(value, value)
        for index, value in enumerate(copy.output):
            renamed[value] = copy.output[index] = name("t")
        else_nodes.append(copy)
    else_pool += [renamed[output.name] for output in inner[0].output]


def generate_branch_program(seed: int) -> onnx.ModelProto:
    """A random model with an ``If`` (see the module's docstring)."""
    rng = random.Random(seed)
    name = _Namer()
    weights = [f"W{i}" for i in range(3)]
    generator = np.random.default_rng(seed)
    initializers = [
        onnx.numpy_helper.from_array(
            generator.standard_normal((WIDTH, WIDTH)).astype(np.float32), weight
        )
        for weight in weights
    ]
    initializers.append(onnx.numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"))
    initializers.append(onnx.numpy_helper.from_array(np.array([-1], dtype=np.int64), "flat"))
    nodes = [oh.make_node("Relu", ["x"], ["rx"], name="relu")]
    layers = rng.choice([1, 1, 2, 3])
    state = rng.getstate()
    inputs = ["x", "rx"]
    for layer in range(layers):
        # the layers of a model: the same structure on the previous layer's outputs
        rng.setstate(state)
        then_branch, else_branch = _branches(rng, inputs, name, weights, 0)
        outputs = [f"y{layer}_0", f"y{layer}_1"] if layer < layers - 1 else ["y0", "y1"]
        nodes.append(
            oh.make_node("If", ["c1"], outputs, then_branch=then_branch, else_branch=else_branch)
        )
        inputs = outputs
    graph = oh.make_graph(
        nodes,
        "program",
        [
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", WIDTH]),
            oh.make_tensor_value_info("c1", onnx.TensorProto.BOOL, []),
            oh.make_tensor_value_info("c2", onnx.TensorProto.BOOL, []),
        ],
        [oh.make_tensor_value_info(v, onnx.TensorProto.FLOAT, [None, None]) for v in ("y0", "y1")],
        initializers,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    return onnx.shape_inference.infer_shapes(model)


@dataclass
class MergeOutcome:
    """What :func:`check_merge` found for one program."""

    seed: int
    merged: int
    wrong: str = ""
    #: trees of nested If nodes run as one (:mod:`yobx.torch.onnx.if_trees`)
    collapsed: int = 0
    #: nodes moved into the only side reading them (:mod:`yobx.torch.onnx.branch_sinking`)
    sunk: int = 0
    #: nodes both sides computed alike, moved before their If
    #: (:mod:`yobx.torch.onnx.branch_hoisting`)
    hoisted: int = 0


def _run(proto: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    # the random programs leave weights unread: onnxruntime warns about each
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def check_merge(seed: int, hoist_only: bool = False) -> MergeOutcome:
    """Merges the branches of program ``seed`` and compares the two models; with
    ``hoist_only``, only moves the nodes both sides compute alike out of their ``If``
    (:func:`~yobx.torch.onnx.optimize.hoist_branch_twins`, on branches not merged,
    which share many)."""
    proto = generate_branch_program(seed)
    model = ir.serde.deserialize_model(copy.deepcopy(proto))
    if hoist_only:
        counts = {"nodes_hoisted": hoist_branch_twins(model)}
    else:
        counts = arrange_branches(model)
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after)
    outcome = MergeOutcome(
        seed,
        counts.get("nodes_merged", 0),
        collapsed=counts.get("if_trees_collapsed", 0),
        sunk=counts.get("nodes_sunk", 0),
        hoisted=counts["nodes_hoisted"],
    )
    generator = np.random.default_rng(seed)
    for n in (3, 1):
        x = generator.standard_normal((n, WIDTH)).astype(np.float32)
        for c1 in (True, False):
            for c2 in (True, False):
                feeds = {"x": x, "c1": np.array(c1), "c2": np.array(c2)}
                expected, got = _run(proto, feeds), _run(after, feeds)
                # the largest value of every output: an output that cancels to exactly
                # 0 in the model as generated is 1.5e-7 in one element after the merge
                # (seed 8479: its operands rounded apart), far below the values it is
                # computed from (up to 9.8 there)
                overall = max(
                    (
                        float(np.abs(e[np.isfinite(e)]).max())
                        for e in expected
                        if np.isfinite(e).any()
                    ),
                    default=0.0,
                )
                for e, g in zip(expected, got):
                    # onnxruntime prepacks the weights of the main graph's products, not
                    # a subgraph's, and picks other kernels for one row: a product moved
                    # out may round its last bits otherwise, a few float32 epsilons after
                    # a few operations (seeds 3282 and 4320: 1e-7 of the largest value,
                    # 3e-6 relative after a cancellation); a merge that reads the wrong
                    # value or branch is off by the values themselves
                    finite = np.abs(e[np.isfinite(e)])
                    scale = max(float(finite.max()) if finite.size else 0.0, overall)
                    close = np.allclose(e, g, rtol=1e-5, atol=1e-5 * scale, equal_nan=True)
                    if e.shape != g.shape or not close:
                        outcome.wrong = f"n={n} c1={c1} c2={c2}: {e.shape} {g.shape}"
                        return outcome
    return outcome
