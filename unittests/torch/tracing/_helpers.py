"""Shared checks for tracing tests: trace, run the graph, compare with eager."""

from __future__ import annotations

import torch

from yobx.torch.tracing import CustomTracer


def trace_module(model, inputs: dict, dynamic_shapes=None, **kwargs):
    """Traces ``model`` with named example inputs; returns (tracer, graph, GraphModule)."""
    tracer = CustomTracer(**kwargs.pop("tracer_kwargs", {}))
    graph = tracer.trace(model, concrete_args=inputs, dynamic_shapes=dynamic_shapes, **kwargs)
    return tracer, graph, torch.fx.GraphModule(tracer.traced_model, graph)


def assert_same(expected, got, atol=1e-5, rtol=1e-5):
    """Compares nested outputs (tensors, tuples, dicts, ModelOutput) exactly in structure."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"expected a tensor, got {type(got)}"
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
    elif isinstance(expected, dict):
        assert set(expected) == set(got), (sorted(expected), sorted(got))
        for k in expected:
            assert_same(expected[k], got[k], atol, rtol)
    elif isinstance(expected, (tuple, list)):
        assert len(expected) == len(got), (len(expected), len(got))
        for a, b in zip(expected, got):
            assert_same(a, b, atol, rtol)
    elif type(expected) in torch.utils._pytree.SUPPORTED_NODES:
        assert type(got) is type(expected), (type(expected), type(got))
        assert_same(
            torch.utils._pytree.tree_leaves(expected),
            torch.utils._pytree.tree_leaves(got),
            atol,
            rtol,
        )
    else:
        assert expected == got, (expected, got)


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
