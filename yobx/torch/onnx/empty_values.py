"""Values known to be empty, written as constants.

A version captured where a dimension is 0 computes what torch computes there, on empty
tensors with static shapes: ``group_norm``'s ``InstanceNormalization`` of a ``(3, 1, 0)``
tensor, ``scaled_dot_product_attention``'s reshapes of a ``(1, 0, 0, 0)`` key, a scan
whose state has no element. Nothing of it computes an element, and onnxruntime's
kernels are not all written for it: its ``InstanceNormalization`` crashes the process on
an empty input (a segmentation fault, where torch returns the empty tensor).

:func:`fold_empty_values` replaces every value a node computes whose declared shape is
static with a 0 in it by a constant of that shape and type: the values are the same
(there is none), the nodes computing them go, and the version at size 0 runs no kernel
on an empty tensor. The declared shapes are the capture's, which torch computed for that
version; a dimension the versions give different sizes is not static
(:func:`yobx.torch.onnx.branch_merging.merged_shape`). The runtime checks' nodes are
left as they are: a check reads its inputs' sizes, not their elements, but must stay
tied to them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from yobx.torch.onnx.ort_fusions import graphs_within
from yobx.torch.onnx.runtime_checks import CHECK_NODE_PREFIX, HELPER_NODE_PREFIX


def _empty_shape(value: ir.Value) -> list[int] | None:
    """The static shape of ``value`` when it is a tensor of a known element type whose
    every size is known and one of them 0; None otherwise."""
    if not isinstance(value.type, ir.TensorType) or value.dtype is None or value.shape is None:
        return None
    dims = [d if isinstance(d, int) else getattr(d, "value", None) for d in value.shape]
    if not all(isinstance(d, int) for d in dims) or 0 not in dims:
        return None
    return dims


def _foldable(node: ir.Node) -> bool:
    if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        return False
    name = node.name or ""
    return not name.startswith((CHECK_NODE_PREFIX, HELPER_NODE_PREFIX))


def fold_empty_values(model: ir.Model) -> int:
    """Replaces, in the model and its subgraphs, each value a node computes that is
    statically empty by a ``Constant`` (see the module's documentation); returns how
    many. The nodes computing nothing else are left unused, for the caller to remove."""
    count = 0
    for graph in list(graphs_within(model.graph)):
        for node in list(graph):
            if not _foldable(node):
                continue
            for value in node.outputs:
                dims = _empty_shape(value)
                if dims is None or (not value.uses() and not value.is_graph_output()):
                    continue
                assert value.dtype is not None
                array = np.zeros(dims, dtype=value.dtype.numpy())
                constant = ir.node(
                    "Constant",
                    [],
                    attributes={"value": ir.tensor(array)},
                    name=f"{node.name}_empty_{count}",
                )
                output = constant.outputs[0]
                output.dtype, output.shape = value.dtype, ir.Shape(dims)
                graph.insert_before(node, constant)
                if value.is_graph_output():
                    # the graph's output keeps its name; the computed value keeps one
                    # too: an If may go on computing it beside outputs still read, and
                    # a trailing output without a name is left out when serialized
                    name = value.name
                    value.name = f"{name}_computed_{count}"
                    output.name = name
                else:
                    output.name = f"{value.name}_empty_{count}"
                value.replace_all_uses_with(output, replace_graph_outputs=True)
                count += 1
    return count


__all__ = ["fold_empty_values"]
