"""Integer remainders by a constant 0, which onnxruntime refuses to load.

A version captured where a dimension is 0 computes what torch computes there, on empty
tensors: ``take_along_dim`` normalizes its indices with ``index % size``, a constant 0 in
that version. onnxruntime's ``Mod`` kernel checks a constant divisor when the session is
created (``Integer modulo by zero``), so a model holding such a node, even in a branch
that runs only at size 0, could not be loaded at all.

:func:`replace_zero_divisors` gives those nodes a divisor of 1 where it was 0. An integer
remainder by 0 only runs on an empty dividend in any call eager accepts (torch raises for
a non-empty one), and the result of an empty dividend is the same empty tensor whatever
the divisor.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from yobx.torch.onnx.constant_inputs import nodes_with_constant_input, replace_constant_input


def replace_zero_divisors(model: ir.Model) -> int:
    """Replaces, in the model and its subgraphs, the constant integer divisors of
    ``Mod`` nodes holding a 0 by the same constant with 1 there; returns how many."""
    count = 0
    for graph, node, array in nodes_with_constant_input(model, "Mod", 1):
        if array.dtype.kind not in "iu" or np.all(array != 0):
            continue
        fixed = np.where(array == 0, 1, array).astype(array.dtype)
        replace_constant_input(graph, node, 1, fixed, f"_nonzero_{count}")
        count += 1
    return count


__all__ = ["replace_zero_divisors"]
