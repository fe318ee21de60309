"""Shared checks for tracing tests: trace, run the graph, compare with eager."""

from __future__ import annotations

import torch

from unittests.comparison import CLOSE
from unittests.comparison import assert_same as compare_outputs
from yobx.torch.tracing import CustomTracer


def trace_module(model, inputs: dict, dynamic_shapes=None, **kwargs):
    """Traces ``model`` with named example inputs; returns (tracer, graph, GraphModule)."""
    tracer = CustomTracer(**kwargs.pop("tracer_kwargs", {}))
    graph = tracer.trace(model, concrete_args=inputs, dynamic_shapes=dynamic_shapes, **kwargs)
    return tracer, graph, torch.fx.GraphModule(tracer.traced_model, graph)


def assert_same(expected, got, atol: float = CLOSE["atol"], rtol: float = CLOSE["rtol"]):
    """:func:`unittests.comparison.assert_same` with the tolerances of captures, whose
    graphs may call other kernels than eager (decompositions, batched forms)."""
    compare_outputs(expected, got, atol, rtol)


def check_trace(model, inputs: dict, dynamic_shapes=None, other_inputs=(), **kwargs):
    """Traces then checks the graph against eager on the example and ``other_inputs``.

    The example inputs are cloned before each run so that in-place code in the model
    sees the same values in eager and traced runs.
    """
    tracer, graph, gm = trace_module(model, _clone(inputs), dynamic_shapes, **kwargs)
    for case in (inputs, *other_inputs):
        expected = model(**_clone(case))
        got = gm(**_clone(case))
        assert_same(expected, got)
    return tracer, graph, gm


def _clone(inputs):
    return torch.utils._pytree.tree_map(
        lambda t: t.clone() if isinstance(t, torch.Tensor) else t, inputs
    )


class MaskOrToken(torch.nn.Module):
    """A relation between two sizes decided first (a mask longer than the sequence),
    a single token later (a decode step's ``seq == 1``)."""

    def forward(self, x, mask):
        if mask.shape[1] > x.shape[1]:
            x = x + mask[:, : x.shape[1]].unsqueeze(-1)
        if x.shape[1] == 1:
            return x * 3
        return x.cumsum(dim=1)
