"""Kernels onnxruntime cannot run on an empty tensor, skipped where the input is empty.

A version captured where a dimension is 0 computes what torch computes there, on empty
tensors with static shapes: ``group_norm``'s ``InstanceNormalization`` of a ``(3, 1, 0)``
tensor. onnxruntime's ``InstanceNormalization`` crashes the process on an empty input (a
segmentation fault, where torch returns the empty tensor): the model crashed its caller
at the size that version runs for.

:func:`skip_empty_kernels` replaces each such node whose input's declared shape is
static with a 0 in it by an ``Identity`` of that input: the output has the input's shape
and type, and no element, whatever the kernel would compute. The declared shapes are the
capture's, which torch computed for that version; a dimension the versions give
different sizes is not static (:func:`yobx.torch.onnx.branch_merging.merged_shape`).

Writing every empty value as a constant was tried first: onnxruntime then ran those
kernels on the constants when it created the session (its constant folding), and
crashed there, for every caller.
"""

from __future__ import annotations

import onnx_ir as ir

from yobx.torch.onnx.ort_fusions import graphs_within

#: operators whose output has their first input's shape and type, and whose
#: onnxruntime CPU kernel crashes on an empty input
EMPTY_UNSAFE_OPERATORS = ("InstanceNormalization",)


def _statically_empty(value: ir.Value | None) -> bool:
    """``value`` is a tensor whose every size is known, one of them 0."""
    if value is None or value.shape is None:
        return False
    dims = [d if isinstance(d, int) else getattr(d, "value", None) for d in value.shape]
    return all(isinstance(d, int) for d in dims) and 0 in dims


def skip_empty_kernels(model: ir.Model) -> int:
    """Replaces, in the model and its subgraphs, each node of
    :data:`EMPTY_UNSAFE_OPERATORS` whose input is statically empty by an ``Identity``
    of that input (see the module's documentation); returns how many."""
    count = 0
    for graph in list(graphs_within(model.graph)):
        for node in list(graph):
            if node.op_type not in EMPTY_UNSAFE_OPERATORS or node.domain not in ("", "ai.onnx"):
                continue
            if not _statically_empty(node.inputs[0]):
                continue
            output = node.outputs[0]
            identity = ir.node("Identity", [node.inputs[0]], name=f"{node.name}_empty")
            copy = identity.outputs[0]
            copy.type = node.inputs[0].type or output.type
            if copy.type is not None:
                # a shape without a type cannot be serialized
                copy.shape = node.inputs[0].shape
            graph.insert_before(node, identity)
            # the value keeps its name (a graph's output is found by it)
            name, output.name = output.name, f"{output.name}_unsafe"
            copy.name = name
            output.replace_all_uses_with(copy, replace_graph_outputs=True)
            graph.remove(node, safe=True)
            count += 1
    return count


__all__ = ["EMPTY_UNSAFE_OPERATORS", "skip_empty_kernels"]
