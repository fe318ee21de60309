"""The chain of runtime checks and the gates on the inputs (:mod:`yobx.torch.onnx.check_gates`):
many checks are combined before the chain, which runs only when one fails and still
names the first broken one; the gates return the inputs as they are, empty ones too."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime
import pytest
import sympy
import torch

from yobx.torch.onnx.check_gates import FAST_PATH_FROM
from yobx.torch.onnx.runtime_checks import CHECK_NODE_PREFIX, _CheckGraph, failed_check
from yobx.torch.tracing.constraints.runtime_checks import RuntimeCheck

N, M = sympy.Symbol("n", integer=True), sympy.Symbol("m", integer=True)
#: checks on x of shape (n, m), in the order they are reported
CONDITIONS = (
    ("n positive", sympy.Ge(N, 1)),
    ("m at most 40", sympy.Le(M, 40)),
    ("m even", sympy.Eq(M % 2, 0)),
    ("n at most m", sympy.Le(N, M)),
    ("n not 7", sympy.Ne(N, 7)),
    ("m not 12", sympy.Ne(M, 12)),
)


def _checked_model(
    count: int,
    inputs: list[tuple[str, list]],
    constant_output: bool = False,
    conditions: tuple = CONDITIONS,
    sources: dict | None = None,
):
    """An identity of each input, the first ``count`` of ``conditions`` checked (their
    symbols read where ``sources`` says, by default ``n`` and ``m`` the first input's
    sizes), and an output computed from no input when ``constant_output``."""
    values = [
        ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(dims))
        for name, dims in inputs
    ]
    graph = ir.Graph(values, [], nodes=[], opset_imports={"": 18})
    for value in values:
        node = ir.node("Identity", [value])
        node.outputs[0].name = f"{value.name}_out"
        graph.append(node)
        graph.outputs.append(node.outputs[0])
    if constant_output:
        node = ir.node("Constant", [], attributes={"value": ir.tensor(np.array([3.0], np.float32))})
        node.outputs[0].name = "three"
        node.outputs[0].dtype, node.outputs[0].shape = ir.DataType.FLOAT, ir.Shape([1])
        graph.append(node)
        graph.outputs.append(node.outputs[0])
    builder = _CheckGraph(graph, {v.name: v for v in values})
    if sources is None:
        sources = {N: (values[0].name, 0, 1, 0), M: (values[0].name, 1, 1, 0)}
    for name, condition in conditions[:count]:
        builder.check(condition, sources, CHECK_NODE_PREFIX + name, RuntimeCheck(condition, name))
    builder.gate()
    return ir.Model(graph, ir_version=10)


def _session(model: ir.Model) -> onnxruntime.InferenceSession:
    proto = ir.serde.serialize_model(model)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _failing(session, rows: int, columns: int) -> str | None:
    try:
        session.run(None, {"x": np.zeros((rows, columns), dtype=np.float32)})
    except Exception as e:
        name = failed_check(str(e))
        assert name is not None, str(e)
        return name[len(CHECK_NODE_PREFIX) :]
    return None


def _first_broken(count: int, rows: int, columns: int) -> str | None:
    values = {N: rows, M: columns}
    for name, condition in CONDITIONS[:count]:
        if not bool(condition.subs(values)):
            return name
    return None


@pytest.mark.parametrize("count", [FAST_PATH_FROM - 1, FAST_PATH_FROM, len(CONDITIONS)])
def test_the_first_broken_check_is_named_with_many_checks_or_few(count):
    session = _session(_checked_model(count, [("x", ["n", "m"])]))
    sizes = [(r, c) for r in (0, 1, 3, 7, 9) for c in (2, 7, 12, 16, 41, 42)]
    reported = {size: _failing(session, *size) for size in sizes}
    assert reported == {size: _first_broken(count, *size) for size in sizes}
    # each check is the first broken one somewhere
    assert set(reported.values()) == {name for name, _ in CONDITIONS[:count]} | {None}


def test_many_checks_run_a_few_nodes_when_they_hold():
    """From FAST_PATH_FROM checks on, the main graph combines them and holds no
    ``Where``/``Reshape`` per check: the chain is in the ``If`` for a broken check."""
    model = _checked_model(len(CONDITIONS), [("x", ["n", "m"])])
    main = [n for n in model.graph if n.op_type != "Constant"]
    assert not any(n.name.startswith(CHECK_NODE_PREFIX) for n in main)
    (choice,) = [n for n in main if n.op_type == "If"]
    chain = choice.attributes["else_branch"].value
    assert [n.name for n in chain if n.op_type == "Reshape"] == [
        CHECK_NODE_PREFIX + name for name, _ in CONDITIONS
    ]
    assert len(choice.attributes["then_branch"].value) == 1
    few = _checked_model(FAST_PATH_FROM - 1, [("x", ["n", "m"])])
    assert not any(n.op_type == "If" for n in few.graph)


@pytest.mark.parametrize("count", [1, len(CONDITIONS)])
def test_gates_return_the_inputs_as_they_are(count):
    """Inputs of ranks 0 to 3, empty ones included, and an output computed from no
    input, through one gate each."""
    inputs = [("x", ["n", "m"]), ("s", []), ("v", ["k"]), ("t", ["a", "b", "c"])]
    model = _checked_model(count, inputs, constant_output=True)
    gates = [n for n in model.graph if n.name.startswith("yobx_checks/gate_")]
    assert len(gates) == len(inputs) + 1
    assert all(g.op_type == "Reshape" for g in gates)
    session = _session(model)
    rng = np.random.default_rng(0)
    for shapes in (
        {"x": (3, 4), "s": (), "v": (0,), "t": (2, 0, 5)},
        {"x": (2, 8), "s": (), "v": (5,), "t": (1, 3, 2)},
    ):
        feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
        outputs = session.run(None, feeds)
        for (name, _), got in zip(inputs, outputs):
            assert got.shape == feeds[name].shape
            np.testing.assert_array_equal(got, feeds[name])
        np.testing.assert_array_equal(outputs[-1], np.array([3.0], np.float32))
    with pytest.raises(Exception, match="m at most 40|n positive"):
        session.run(None, {**feeds, "x": np.zeros((0, 50), np.float32)})


P, Q, R, S = (sympy.Symbol(name, integer=True) for name in "pqrs")
#: checks on a of shape (p, q) and b of shape (r, s): equal sizes, and one range
SIZE_CONDITIONS = (
    ("p is r", sympy.Eq(P, R)),
    ("q at most 9", sympy.Le(Q, 9)),
    ("q is s", sympy.Eq(Q, S)),
    ("p is s", sympy.Eq(P, S)),
    ("r is q", sympy.Eq(R, Q)),
    ("s is p", sympy.Eq(S, P)),
)


@pytest.mark.parametrize("count", [FAST_PATH_FROM, len(SIZE_CONDITIONS)])
def test_equal_sizes_are_compared_at_once_and_the_first_broken_is_named(count):
    sources = {P: ("a", 0, 1, 0), Q: ("a", 1, 1, 0), R: ("b", 0, 1, 0), S: ("b", 1, 1, 0)}
    inputs = [("a", ["p", "q"]), ("b", ["r", "s"])]
    model = _checked_model(count, inputs, conditions=SIZE_CONDITIONS, sources=sources)
    main = [n.op_type for n in model.graph]
    equalities = sum(1 for _, c in SIZE_CONDITIONS[:count] if isinstance(c, sympy.Eq))
    if equalities >= FAST_PATH_FROM:
        # one comparison of two gathered vectors for all of them
        assert main.count("Equal") == 1 and main.count("Gather") == 2, main
    session = _session(model)
    for a, b in [((3, 3), (3, 3)), ((2, 3), (3, 3)), ((3, 12), (3, 12)), ((3, 3), (3, 4))]:
        sizes = {P: a[0], Q: a[1], R: b[0], S: b[1]}
        expected = next((n for n, c in SIZE_CONDITIONS[:count] if not bool(c.subs(sizes))), None)
        feeds = {"a": np.zeros(a, np.float32), "b": np.zeros(b, np.float32)}
        try:
            session.run(None, feeds)
            reported = None
        except Exception as e:
            reported = failed_check(str(e))[len(CHECK_NODE_PREFIX) :]
        assert reported == expected, (a, b)


class _SquareBesideAVector(torch.nn.Module):
    """The model reads the vector only (the square input is checked, not gated)."""

    def forward(self, y, z):
        return (z.reshape(int(z.shape[0]), -1) * 2,)


def test_the_gate_of_a_vector_input_loads_in_onnxruntime():
    # a vector's gate reshaped it to the token expanded to one element: onnxruntime
    # removed that Expand, and its ReshapeFusion, fusing the gate's Reshape with the
    # model's reshape of the vector, took the check's Reshape for the gate's, typed
    # int64 ("Type (tensor(float)) of output arg (z__checked) ... does not match
    # expected type (tensor(int64))"): the model did not load (fuzz_onnx 7488)
    from yobx.torch.onnx import to_onnx

    model = _SquareBesideAVector()
    result = to_onnx(
        model,
        (torch.randn(3, 3), torch.randn(5)),
        dynamic_shapes={"y": {0: "length", 1: "length"}, "z": None},
    )
    assert result.runtime_checks
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for length in (3, 6, 1):
        y, z = torch.randn(length, length), torch.randn(5)
        got = session.run(None, {"y": y.numpy(), "z": z.numpy()})
        for value, expected in zip(got, model(y, z), strict=True):
            np.testing.assert_allclose(value, expected.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match="y.size\\(1\\) == length"):
        session.run(None, {"y": np.zeros((3, 4), np.float32), "z": np.zeros(5, np.float32)})
