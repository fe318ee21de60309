"""Shared checks for the pass tests: capture a model, run a pass, compare with eager."""

from __future__ import annotations

import copy

import torch
import torch.utils._pytree as pytree

from unittests.comparison import assert_same
from yobx.torch.passes import MUTATIONS_KEY, WRITE_BACK_KEY


def clone(values):
    """Clones every tensor of a nested structure."""
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, values)


def eager_run(model: torch.nn.Module, args: tuple):
    """Runs a copy of the model on cloned inputs: (output, inputs after, buffers after)."""
    model = copy.deepcopy(model)
    args = clone(args)
    out = model(*args)
    return clone(out), args, {k: v.clone() for k, v in model.named_buffers()}


def split_outputs(graph: torch.fx.Graph, result, args: tuple, buffers: dict):
    """Applies the mutation outputs of a rewritten torch-level graph to inputs and buffers.

    :return: the user output
    """
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    records = output.meta.get(MUTATIONS_KEY)
    if not records:
        return result
    placeholders = [n.target for n in graph.nodes if n.op == "placeholder"]
    for record in records:
        value = result[record["output_index"]]
        if record["kind"] == "USER_INPUT_MUTATION":
            args[placeholders.index(record["target"])].copy_(value)
        else:
            buffers[record["target"]] = value
    return result[0]


def run_graph_module(gm: torch.nn.Module, args: tuple):
    """Runs a GraphModule on cloned inputs: (output, inputs after, buffers after)."""
    gm = copy.deepcopy(gm)
    args = clone(args)
    out = gm(*args)
    buffers = {k: v.clone() for k, v in gm.named_buffers()}
    out = split_outputs(gm.graph, out, args, buffers)
    return clone(out), args, buffers


def assert_runs_alike(expected, got, buffer_names=None):
    """Compares (output, inputs, buffers) triples, buffers by name (last component)."""
    assert_same(expected[0], got[0])
    assert_same(expected[1], got[1])
    if buffer_names is None:
        buffer_names = expected[2].keys()
    for name in buffer_names:
        short = name.split(".")[-1]
        match = [v for k, v in got[2].items() if k.split(".")[-1].endswith(short)]
        assert match, f"buffer {name!r} not found in {sorted(got[2])}"
        torch.testing.assert_close(match[0], expected[2][name], atol=0, rtol=0)


def has_inplace(graph: torch.fx.Graph) -> bool:
    """Tells if a graph still contains an in-place node (the final write-backs aside)."""
    from yobx.torch.passes.aliasing import writes

    return any(writes(n) for n in graph.nodes if not n.meta.get(WRITE_BACK_KEY))


def write_backs(graph: torch.fx.Graph) -> list[str]:
    """Targets written back at the end of a rewritten graph."""
    return [n.args[0].target for n in graph.nodes if n.meta.get(WRITE_BACK_KEY)]
