"""onnxruntime's prepacking of weights read inside subgraphs, and what it costs a model
choosing between versions nested in versions (an ``If`` in an ``If``).

One matrix multiplication ``[1, K] x [K, N]`` (K = N = 1024 by default), its weight an
initializer of the main graph, read:

* ``top``: by a node of the main graph;
* ``depth 1``: by a node in a branch of an ``If``;
* ``depth 2``: by a node in a branch of an ``If`` in a branch of an ``If``;

for a 4-bit ``MatMulNBits`` (what ``to_onnx(quantize="int4")`` writes) and a float
``MatMul`` of a weight stored ``[in, out]``, and, at depth 2, a ``MatMul`` reading
``Transpose`` of the weight stored ``[out, in]`` inside the subgraph (what
``yobx.torch.onnx.weight_layout`` keeps there: onnxruntime folds the transposition into
a weight of the subgraph's own, which it prepacks). The sessions alternate run after
run on one thread; the script prints the median of each in microseconds and its ratio
to ``top``::

    python _scripts/bench_nested_prepack.py [--runs 300] [--size 1024]

Measured with onnxruntime 1.32 (K = N = 1024): the 4-bit weights are prepacked at
depth 1 and not at depth 2, where the multiplication runs about twelve times slower
(3114 us against 260 us); the float ``MatMul`` of this single node runs alike at every
depth.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

BLOCK = 32


def _value(name: str, size: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, size])


def _multiplication(kind: str, output: str, size: int) -> list[onnx.NodeProto]:
    """The node(s) computing ``output`` from ``A`` and the weight of ``kind``."""
    if kind == "int4":
        return [
            helper.make_node(
                "MatMulNBits",
                ["A", "Bq", "Bs"],
                [output],
                domain="com.microsoft",
                K=size,
                N=size,
                bits=4,
                block_size=BLOCK,
            )
        ]
    if kind == "float":
        return [helper.make_node("MatMul", ["A", "W"], [output])]
    # float, the weight stored [out, in] and transposed inside the subgraph
    return [
        helper.make_node("Transpose", ["Wt"], [f"{output}_w"], perm=[1, 0]),
        helper.make_node("MatMul", ["A", f"{output}_w"], [output]),
    ]


def _nest(nodes: list[onnx.NodeProto], output: str, size: int, depth: int) -> list:
    """``nodes`` (computing ``output``) wrapped in ``depth`` levels of ``If``."""
    for level in range(depth):
        branch = helper.make_graph(nodes, f"then{level}", [], [_value(output, size)])
        other = helper.make_graph(
            [helper.make_node("Identity", ["A"], [f"{output}_else{level}"])],
            f"else{level}",
            [],
            [_value(f"{output}_else{level}", size)],
        )
        wrapped = f"{output}_if{level}"
        nodes = [helper.make_node("If", ["C"], [wrapped], then_branch=branch, else_branch=other)]
        output = wrapped
    return [*nodes, helper.make_node("Identity", [output], ["Y"])]


def model(kind: str, depth: int, size: int, rng: np.random.Generator) -> bytes:
    """The model of one case, serialized."""
    blocks = size // BLOCK
    initializers = [
        numpy_helper.from_array(
            rng.integers(0, 256, (size, blocks, BLOCK // 2), dtype=np.uint8), "Bq"
        ),
        numpy_helper.from_array(rng.uniform(0.01, 0.1, size * blocks).astype(np.float32), "Bs"),
        numpy_helper.from_array(rng.standard_normal((size, size)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal((size, size)).astype(np.float32), "Wt"),
    ]
    nodes = _nest(_multiplication(kind, "M", size), "M", size, depth)
    inputs = [_value("A", size), helper.make_tensor_value_info("C", TensorProto.BOOL, [])]
    graph = helper.make_graph(nodes, "g", inputs, [_value("Y", size)], initializers)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    proto = helper.make_model(graph, opset_imports=opsets)
    proto.ir_version = 10
    return proto.SerializeToString()


CASES = (
    ("int4", 0),
    ("int4", 1),
    ("int4", 2),
    ("float", 0),
    ("float", 1),
    ("float", 2),
    ("float, transposed inside", 2),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # the unused initializers of each case
    sessions = {
        case: onnxruntime.InferenceSession(
            model(_kind(case[0]), case[1], args.size, rng),
            options,
            providers=["CPUExecutionProvider"],
        )
        for case in CASES
    }
    feeds = {"A": rng.standard_normal((1, args.size)).astype(np.float32), "C": np.array(True)}
    times: dict = {case: [] for case in CASES}
    for run in range(args.runs + 20):
        for case, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds)
            if run >= 20:  # warm-up
                times[case].append(time.perf_counter() - start)
    print(f"onnxruntime {onnxruntime.__version__}, K = N = {args.size}, one thread")
    for kind in ("int4", "float"):
        top = statistics.median(times[(kind, 0)])
        for case in CASES:
            if not case[0].startswith(kind):
                continue
            median = statistics.median(times[case])
            where = "top" if case[1] == 0 else f"depth {case[1]}"
            print(f"  {case[0]:26} {where:8} {1e6 * median:9.1f} us  {median / top:6.2f}x top")


def _kind(label: str) -> str:
    """The ``kind`` of :func:`_multiplication` a case's label names."""
    return {"int4": "int4", "float": "float"}.get(label, "transposed")


if __name__ == "__main__":
    main()
