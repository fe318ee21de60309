"""onnxruntime's ``com.microsoft.SkipLayerNormalization`` against ``Add`` +
``LayerNormalization`` on the CPU (why ``optimize="ort"`` splits the fused node back,
see ``yobx.torch.onnx.optimize._split_skip_layer_normalizations``).

Each variant is a one-node (or two-node) model run by onnxruntime with one thread; the
script prints the median latency of each at several shapes, their ratio, and the
largest difference between their outputs::

    python _scripts/bench_skip_layer_norm.py [--runs 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

SHAPES = ((2, 128, 512), (1, 512, 768), (4, 512, 4096))


def _session(nodes, hidden: int, outputs: list[str]) -> onnxruntime.InferenceSession:
    rng = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), name)
        for name in ("gamma", "beta")
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "skip")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _median_us(session, feeds, runs: int) -> float:
    for _ in range(10):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    options = parser.parse_args()
    print(f"onnxruntime {onnxruntime.__version__}, 1 thread, median of {options.runs} runs")
    header = ("shape", "SkipLayerNorm us", "Add+LayerNorm us", "ratio", "diff")
    print(f"{header[0]:18s} {header[1]:>17s} {header[2]:>17s} {header[3]:>6s} {header[4]:>8s}")
    for shape in SHAPES:
        hidden = shape[-1]
        fused = _session(
            [
                helper.make_node(
                    "SkipLayerNormalization",
                    ["x", "skip", "gamma", "beta"],
                    ["y", "", "", "sum"],
                    domain="com.microsoft",
                    epsilon=1e-5,
                )
            ],
            hidden,
            ["y", "sum"],
        )
        split = _session(
            [
                helper.make_node("Add", ["x", "skip"], ["sum"]),
                helper.make_node(
                    "LayerNormalization", ["sum", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5
                ),
            ],
            hidden,
            ["y", "sum"],
        )
        rng = np.random.default_rng(1)
        feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("x", "skip")}
        diff = max(
            float(np.abs(a - b).max())
            for a, b in zip(fused.run(None, feeds), split.run(None, feeds))
        )
        fused_us = _median_us(fused, feeds, options.runs)
        split_us = _median_us(split, feeds, options.runs)
        print(
            f"{shape!s:18s} {fused_us:17.0f} {split_us:17.0f} "
            f"{fused_us / split_us:6.1f} {diff:8.1e}"
        )


if __name__ == "__main__":
    main()
