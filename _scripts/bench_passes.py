"""Measures the time per node of every pass of ``yobx.torch.passes`` on growing graphs.

Each graph repeats a block (in-place updates through views, full slices, a vmap region)
until it reaches the requested number of nodes; a linear pass keeps a constant time per
node. Usage::

    python _scripts/bench_passes.py                 # 1k, 10k and 100k nodes
    python _scripts/bench_passes.py --sizes 1000 5000 --passes remove_inplace
"""

from __future__ import annotations

import argparse
import operator
import sys
import time

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from yobx.torch.passes import (
    graph_erase_node,
    remove_batch_dim_nodes,
    remove_inplace,
    remove_unnecessary_slices,
)

INT64_MAX = 9223372036854775807


def inplace_graph(size: int) -> torch.fx.Graph:
    """Blocks of ``v = x[1:]; v.add_(1); x[:, 0].mul_(2); y = x[:] * 2`` chained on y."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.type = torch.Tensor
    while len(graph.nodes) < size:
        view = graph.call_function(operator.getitem, (x, slice(1, None)))
        graph.call_method("add_", (view, 1.0))
        column = graph.call_function(operator.getitem, (x, (slice(None), 0)))
        graph.call_method("mul_", (column, 2.0))
        full = graph.call_function(operator.getitem, (x, slice(None)))
        x = graph.call_function(operator.mul, (full, 0.5))
    graph.output(x)
    return graph


def slices_graph(size: int) -> torch.fx.Graph:
    """Blocks of full and partial slices, at torch and aten level."""
    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.type = torch.Tensor
    while len(graph.nodes) < size:
        a = graph.call_function(operator.getitem, (x, (slice(None), slice(0, INT64_MAX))))
        b = graph.call_function(aten.slice.Tensor, (a, 1, 0, INT64_MAX))
        c = graph.call_function(aten.slice.Tensor, (b, 0, 1, INT64_MAX))
        head = graph.call_function(aten.slice.Tensor, (b, 0, 0, 1))
        x = graph.call_function(aten.cat.default, ([c, head],))
    graph.output(x)
    return graph


def erase_graph(size: int) -> tuple[torch.fx.Graph, torch.fx.Node]:
    """A chain of unary operations whose last node is unused."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    node = x
    for _ in range(size - 2):
        node = graph.call_function(torch.sin, (node,))
    graph.output(x)
    return graph, node


def batch_dim_graph(size: int) -> torch.fx.Graph:
    """Consecutive vmap regions as torch.export leaves them (``meta["val"]`` included)."""
    import torch._functorch.predispatch as predispatch

    aten = torch.ops.aten
    mode = FakeTensorMode()
    with mode:
        batched = torch.empty(8, 16)
        example = torch.empty(16)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = batched
    while len(graph.nodes) < size:
        graph.call_function(predispatch._vmap_increment_nesting, (8, "error"))
        a = graph.call_function(predispatch._add_batch_dim, (x, 0, 1))
        a.meta["val"] = example
        value = a
        for _ in range(20):
            total = graph.call_function(aten.sum.default, (value,))
            total.meta["val"] = example.sum()
            value = graph.call_function(aten.sub.Tensor, (value, total))
            value.meta["val"] = example
        x = graph.call_function(predispatch._remove_batch_dim, (value, 1, 8, 0))
        x.meta["val"] = batched
        graph.call_function(predispatch._vmap_decrement_nesting, ())
    graph.output(x)
    return graph


def _time(build, run) -> tuple[int, float]:
    built = build()
    graph = built[0] if isinstance(built, tuple) else built
    nodes = len(graph.nodes)
    begin = time.perf_counter()
    run(built)
    return nodes, time.perf_counter() - begin


PASSES = {
    "remove_inplace": (inplace_graph, lambda g: remove_inplace(g)),
    "remove_unnecessary_slices": (slices_graph, lambda g: remove_unnecessary_slices(g)),
    "graph_erase_node": (erase_graph, lambda b: graph_erase_node(b[0], b[1])),
    "remove_batch_dim_nodes": (batch_dim_graph, lambda g: remove_batch_dim_nodes(g)),
}


def main(argv: list[str] | None = None) -> int:
    """Prints the time per node of each pass for each size, fails if it is not linear."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--passes", nargs="+", default=sorted(PASSES), choices=sorted(PASSES))
    parser.add_argument("--ratio", type=float, default=2.0, help="largest allowed slowdown")
    args = parser.parse_args(argv)
    failed = []
    print(f"{'pass':<28}{'nodes':>9}{'seconds':>10}{'us/node':>10}")
    for name in args.passes:
        build, run = PASSES[name]
        per_node = []
        for size in args.sizes:
            nodes, seconds = _time(lambda size=size, build=build: build(size), run)
            per_node.append(seconds / nodes * 1e6)
            print(f"{name:<28}{nodes:>9}{seconds:>10.3f}{per_node[-1]:>10.2f}", flush=True)
        ratio = per_node[-1] / per_node[0]
        print(f"{name:<28}{'ratio':>9}{ratio:>20.2f}")
        if ratio > args.ratio:
            failed.append(name)
    if failed:
        print(f"not linear: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
