"""The checks a model makes on tensor values, in ONNX.

``assert lengths.max() <= x.shape[1]`` and ``torch._check(n.item() >= 0)`` are
:func:`~yobx.torch.tracing.constraints.value_checks.check_value` nodes of the traced graph. Before
lowering, :func:`gate_value_checks` makes each one a :func:`yobx::value_check
<yobx.torch.ops.checks.value_check>` returning a token, and every tensor output of its
graph (a version's graph, a branch: each graph gates its own outputs) a
:func:`yobx::gated <yobx.torch.ops.checks.gated>` of it. In ONNX, as for the
constraints on sizes (:mod:`yobx.torch.onnx.runtime_checks`):

- the token is element ``1 - holds`` of a one-element zero: a ``Gather`` whose index is
  0 when every element of the condition holds and 1, out of range, when one does not,
  which onnxruntime refuses; that ``Gather`` is named after the check, so
  onnxruntime's error names it::

      Non-zero status code returned while running Gather node.
      Name:'yobx check failed: assert lengths.max() <= x.shape[1], needed at model.py:5'

- a gated output is ``output + token`` (``Or`` for booleans): the same values, and no
  output is returned before the check has passed. The ``+ 0`` costs one pass over the
  output, only in a model that checks values (a reshape to the output's own shape
  would not, but the optimizer removes it, and the check with it).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import onnxscript
import torch
import torch.fx
import torch.utils._pytree as pytree

from yobx.torch.fx_code import recompile_alone
from yobx.torch.onnx.runtime_checks import CHECK_NODE_PREFIX
from yobx.torch.ops import checks
from yobx.torch.tracing.constraints.value_checks import check_value

_op = onnxscript.opset18


def gate_value_checks(graph_module: torch.fx.GraphModule, keep: bool = True) -> int:
    """Rewrites the value checks of every graph of ``graph_module`` into tokens gating
    the graph's tensor outputs (see the module's documentation), or removes them when
    ``keep`` is False (``to_onnx(runtime_checks=False)``: no check at all, as asked;
    what computed their conditions is then dead code).

    :return: the number of checks rewritten or removed
    """
    count = 0
    for module in graph_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        nodes = [n for n in graph.nodes if n.op == "call_function" and n.target is check_value]
        if not nodes:
            continue
        if keep:
            _gate_outputs(graph, [_token(graph, node) for node in nodes])
        else:
            for node in nodes:
                graph.erase_node(node)
        count += len(nodes)
        if isinstance(module, torch.fx.GraphModule):
            recompile_alone(module)
    return count


def check_name(expression: str, location: str) -> str:
    """The name of the ONNX node checking ``expression`` (the check's source)."""
    where = f", needed at {location}" if location else ""
    return f"{CHECK_NODE_PREFIX}{expression}{where}"


def _token(graph: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node:
    """Replaces the check ``node`` by the ``yobx::value_check`` making its token."""
    condition, expression, location = node.args
    val = condition.meta.get("val") if isinstance(condition, torch.fx.Node) else condition
    with graph.inserting_before(node):
        if not isinstance(val, torch.Tensor):
            # a condition on a number read from a tensor (`n.item() >= 0`)
            condition = graph.call_function(
                torch.ops.aten.scalar_tensor.default, (condition,), {"dtype": torch.bool}
            )
            val = _fake_of(graph).new_ones((), dtype=torch.bool)
            condition.meta["val"] = val
        checks.operators()  # defined when first needed
        token = graph.call_function(
            torch.ops.yobx.value_check.default, (condition, check_name(expression, location))
        )
    token.meta["val"] = checks._value_check_fake(val, "")
    graph.erase_node(node)
    return token


def _fake_of(graph: torch.fx.Graph) -> torch.Tensor:
    """A fake tensor of the graph (the fake mode its new values are made in)."""
    for node in graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch._subclasses.FakeTensor):
            return val
    raise RuntimeError("a graph with value checks has no fake tensor")  # pragma: no cover


def _gate_outputs(graph: torch.fx.Graph, tokens: list[torch.fx.Node]) -> None:
    """Every tensor output of ``graph`` goes through each token."""
    output = next(n for n in graph.nodes if n.op == "output")
    gated: dict[torch.fx.Node, torch.fx.Node] = {}
    checks.operators()  # defined when first needed

    def gate(value: Any) -> Any:
        if not isinstance(value, torch.fx.Node) or not isinstance(
            value.meta.get("val"), torch.Tensor
        ):
            return value
        if value not in gated:
            current = value
            with graph.inserting_before(output):
                for token in tokens:
                    current = graph.call_function(torch.ops.yobx.gated.default, (current, token))
                    # a new value: the lowering takes a node returning its argument
                    # itself for that argument
                    current.meta["val"] = checks._gated_fake(value.meta["val"], None)
            gated[value] = current
        return gated[value]

    output.args = (pytree.tree_map(gate, output.args[0]),)


# ONNX translations (registered in yobx.torch.onnx.custom_ops)


def value_check_to_onnx(condition, message: str):
    """The token of a check: element ``1 - holds`` of a one-element zero, an index out
    of range where the condition fails (a ``Gather`` named after the check)."""
    flat = _op.Reshape(_op.Cast(condition, to=ir.DataType.INT64), _op.Constant(value_ints=[-1]))
    # 1 when every element holds (an empty condition holds)
    holds = _op.ReduceMin(_op.Concat(flat, _op.Constant(value_ints=[1]), axis=0), keepdims=1)
    # a zero computed from the condition, not a constant, and a Gather rather than the
    # Reshape of the constraints' checks: the optimizer folds a reshape whose output
    # shape it knows into a constant shape, and drops the check with it
    zero = _op.Sub(holds, holds)
    index = _op.Sub(_op.Constant(value_int=1), _op.Squeeze(holds))
    token = _op.Gather(zero, index, axis=0)
    token.producer().name = message
    # the exporter names the node returning a value after it: not this one
    return _op.Identity(_op.Unsqueeze(token, _op.Constant(value_ints=[0])))


def gated_to_onnx(value, token):
    """``value`` plus the token (zero): it depends on the check. A reshape to its own
    shape would cost nothing, but the optimizer removes a reshape whose output has the
    shape of its input (and the check with it); an addition of a computed zero stays."""
    zero = _op.ReduceMax(token, keepdims=0)
    if value.dtype == ir.DataType.BOOL:
        return _op.Or(value, _op.Cast(zero, to=ir.DataType.BOOL))
    return _op.Add(value, _op.CastLike(zero, value))


__all__ = ["check_name", "gate_value_checks", "gated_to_onnx", "value_check_to_onnx"]
