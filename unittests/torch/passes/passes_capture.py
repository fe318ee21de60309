"""Captures a model with each tool the passes must support, then checks remove_inplace."""

from __future__ import annotations

import copy
import inspect

import torch
from passes_test_helpers import (
    assert_runs_alike,
    clone,
    eager_run,
    has_inplace,
    run_graph_module,
)

from yobx.torch.passes import remove_inplace

TOOLS = ("symbolic_trace", "torch_ir", "export", "make_fx", "tracer")


def _export_shapes(dynamic_shapes):
    if dynamic_shapes is None:
        return None
    return tuple(
        None
        if d is None
        else {
            axis: torch.export.Dim.DYNAMIC if isinstance(dim, str) else dim
            for axis, dim in d.items()
        }
        for d in dynamic_shapes
    )


def capture(tool: str, model: torch.nn.Module, args: tuple, dynamic_shapes=None):
    """Captures ``model`` with ``tool``; returns a GraphModule or an ExportedProgram."""
    model = copy.deepcopy(model)
    args = clone(args)
    if tool == "symbolic_trace":
        return torch.fx.symbolic_trace(model)
    if tool == "torch_ir":
        from torch.export._trace import _export_to_torch_ir

        return _export_to_torch_ir(model, args, dynamic_shapes=_export_shapes(dynamic_shapes))
    if tool == "export":
        return torch.export.export(model, args, dynamic_shapes=_export_shapes(dynamic_shapes))
    if tool == "make_fx":
        from torch.fx.experimental.proxy_tensor import make_fx

        return make_fx(model, pre_dispatch=True)(*args)
    if tool == "tracer":
        from yobx.torch.tracing import CustomTracer

        names = list(inspect.signature(model.forward).parameters)
        tracer = CustomTracer()
        # a failure of the tracer fails the test: these models are meant to be traceable
        graph = tracer.trace(
            model,
            concrete_args=dict(zip(names, args)),
            dynamic_shapes=dynamic_shapes,
            remove_inplace=False,
        )
        return torch.fx.GraphModule(tracer.traced_model, graph)
    raise ValueError(tool)


def _run_exported(ep, args):
    # ep.module() shares the program's buffers: copy them so that runs stay independent
    module = copy.deepcopy(ep.module())
    args = clone(args)
    out = module(*args)
    return clone(out), args, {k: v.clone() for k, v in module.named_buffers()}


def check_inplace(
    tool: str,
    model: torch.nn.Module,
    args: tuple,
    other_args: tuple = (),
    dynamic_shapes=None,
    compare_buffers: bool = True,
):
    """Captures, removes in-place nodes, compares before/after/eager on all inputs.

    :return: the captured object after the pass
    """
    captured = capture(tool, model, args, dynamic_shapes)
    # make_fx and static exports specialize on the example shapes
    dynamic = tool == "symbolic_trace" or (dynamic_shapes is not None and tool != "make_fx")
    cases = (args, *other_args) if dynamic else (args,)
    if tool == "make_fx":
        # make_fx bakes buffers in as constants
        compare_buffers = False
    buffer_names = None if compare_buffers else []
    if isinstance(captured, torch.export.ExportedProgram):
        before = [_run_exported(captured, a) for a in cases]
        count = remove_inplace(captured.graph_module.graph, exported_program=captured)
        after = [_run_exported(captured, a) for a in cases]
        graph = captured.graph_module.graph
    else:
        before = [run_graph_module(captured, a) for a in cases]
        # symbolic_trace records nothing about the inputs' storage: the tests pass
        # distinct tensors (test_passes_aliasing checks what happens otherwise)
        count = remove_inplace(captured.graph, assume_distinct_inputs=tool == "symbolic_trace")
        after = [run_graph_module(captured, a) for a in cases]
        graph = captured.graph
    assert count > 0, f"nothing rewritten:\n{graph}"
    if tool in ("export", "tracer"):
        # every node keeps knowing its value
        unknown = [n.name for n in graph.nodes if n.op != "output" and "val" not in n.meta]
        assert not unknown, f"nodes without meta['val']: {unknown}\n{graph}"
    assert not has_inplace(graph), f"in-place nodes left:\n{graph}"
    graph.lint()
    for case, b, a in zip(cases, before, after):
        expected = eager_run(model, case)
        assert_runs_alike(expected, b, buffer_names)
        assert_runs_alike(expected, a, buffer_names)
    return captured
