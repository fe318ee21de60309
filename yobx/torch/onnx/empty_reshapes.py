"""Reshapes of empty tensors to a shape with ``-1``, which onnxruntime refuses to load.

A version captured where a dimension is 0 computes what torch computes there, on empty
tensors, with static shapes: ``group_norm``'s decomposition reshapes its input to
``(0, groups, -1)``. Which size ``-1`` stands for is ambiguous when the other sizes
multiply to 0, and onnxruntime's shape inference refuses such a ``Reshape`` when the
session is created (``Product cannot be 0 in combination with -1``), even in a branch
that runs only at size 0: the whole model could not be loaded.

:func:`resolve_empty_reshapes` writes the output's own static shape instead (every size
known, one of them 0: torch decided it), or the target read on the static empty
input with ``-1`` as 0, with ``allowzero=1`` so that a 0 means 0.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from yobx.torch.onnx.constant_inputs import nodes_with_constant_input, replace_constant_input


def _static(shape: ir.Shape | None) -> list[int] | None:
    """The sizes of ``shape`` when every one is known, None otherwise."""
    if shape is None:
        return None
    dims = [d if isinstance(d, int) else getattr(d, "value", None) for d in shape]
    return dims if all(isinstance(d, int) for d in dims) else None


def _empty_output(node: ir.Node, target: np.ndarray) -> list[int] | None:
    """The static shape of ``node``'s empty output: its own when known, else the target
    read on the static empty input (``0`` copying the input's size unless
    ``allowzero``, ``-1`` standing for 0: any size gives the same empty tensor)."""
    known = _static(node.outputs[0].shape)
    if known is not None:
        return known if 0 in known else None
    source = _static(node.inputs[0].shape)
    if source is None or 0 not in source:
        return None
    allowzero = node.attributes.get_int("allowzero", 0)
    dims = []
    for index, size in enumerate(int(t) for t in target):
        if size == 0 and not allowzero:
            if index >= len(source):
                return None
            size = source[index]
        dims.append(0 if size == -1 else size)
    return dims


def resolve_empty_reshapes(model: ir.Model) -> int:
    """Replaces, in the model and its subgraphs, the constant target shape holding a
    ``-1`` of each ``Reshape`` whose output is static and empty by that output's shape
    (``allowzero=1``); returns how many."""
    count = 0
    for graph, node, target in nodes_with_constant_input(model, "Reshape", 1):
        if -1 not in target:
            continue
        dims = _empty_output(node, target.reshape(-1))
        if dims is None:
            continue
        replace_constant_input(graph, node, 1, np.array(dims, dtype=np.int64), f"_empty_{count}")
        node.attributes["allowzero"] = ir.AttrInt64("allowzero", 1)
        count += 1
    return count


__all__ = ["resolve_empty_reshapes"]
