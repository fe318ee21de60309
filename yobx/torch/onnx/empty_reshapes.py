"""Reshapes of empty tensors that onnxruntime refuses to load.

A version captured where a dimension is 0 computes what torch computes there, on empty
tensors, with static shapes: the sizes torch_lib's translations compute from the
input's shape fold into constant targets. Two of them make onnxruntime's shape
inference refuse the ``Reshape`` when the session is created, even in a branch that
runs only at size 0: the whole model could not be loaded.

* A ``-1``: ``group_norm``'s decomposition reshapes its input to ``(0, groups, -1)``.
  Which size ``-1`` stands for is ambiguous when the other sizes multiply to 0
  (``Product cannot be 0 in combination with -1``). :func:`resolve_empty_reshapes`
  writes the output's own static shape instead (every size known, one of them 0: torch
  decided it), or the target read on the static empty input with ``-1`` as 0, with
  ``allowzero=1`` so that a 0 means 0.
* A 0 read as "the input's size there" (``allowzero=0``, the default, which torch_lib
  keeps for shapes it computes): ``group_norm`` reshapes its normalized ``(3, 1, 0)``
  back to the input's ``(3, 0, 3, 0)``, ``scaled_dot_product_attention`` its key to
  ``(1, 0, 0, 0)``; the input has no axis 3 to copy (``Invalid position of 0``). Where
  that reading has no valid answer, or another one than the output's own static shape,
  the 0 is torch's size: the target stays, with ``allowzero=1``.
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


def _static_input(node: ir.Node) -> list[int] | None:
    """The static shape of ``node``'s first input: its declared one, or, for a
    ``Transpose`` of a static value, that value's sizes permuted (the optimizer's shape
    inference ran before this module made the reshapes it reads static:
    ``scaled_dot_product_attention`` transposes the key it reshaped, then reshapes it
    again)."""
    value = node.inputs[0]
    known = _static(value.shape) if value is not None else None
    producer = value.producer() if value is not None else None
    if known is not None or producer is None or producer.op_type != "Transpose":
        return known
    source = _static(producer.inputs[0].shape) if producer.inputs[0] is not None else None
    if source is None:
        return None
    perm = producer.attributes.get_ints("perm", None)
    perm = list(reversed(range(len(source)))) if perm is None else list(perm)
    return [source[axis] for axis in perm] if sorted(perm) == list(range(len(source))) else None


def _empty_output(node: ir.Node, target: np.ndarray) -> list[int] | None:
    """The static shape of ``node``'s empty output: its own when known, else the target
    read on the static empty input (``0`` copying the input's size unless
    ``allowzero``, ``-1`` standing for 0: any size gives the same empty tensor)."""
    known = _static(node.outputs[0].shape)
    if known is not None:
        return known if 0 in known else None
    source = _static_input(node)
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


def _zeros_are_sizes(node: ir.Node, target: np.ndarray) -> bool:
    """The 0s of ``node``'s constant target (without ``-1``) can only be sizes: its input
    is static and empty, and reading them as the input's sizes (``allowzero=0``) points
    past the input's axes, changes the number of elements, or gives another shape than
    the output's own static one."""
    if node.attributes.get_int("allowzero", 0) or 0 not in target:
        return False
    source = _static_input(node)
    if source is None or 0 not in source:
        return False
    if any(size == 0 and index >= len(source) for index, size in enumerate(target)):
        return True
    copied = [source[i] if size == 0 else int(size) for i, size in enumerate(target)]
    known = _static(node.outputs[0].shape)
    return 0 not in copied or (known is not None and known != copied and known == list(target))


def resolve_empty_reshapes(model: ir.Model) -> int:
    """Makes the ``Reshape`` nodes of empty tensors in the model and its subgraphs
    loadable (see the module's documentation): a constant target holding a ``-1``, of
    a node whose output is static and empty, replaced by that output's shape, and a 0
    that can only be a size read as one (``allowzero=1``); returns how many."""
    count = 0
    for graph, node, target in nodes_with_constant_input(model, "Reshape", 1):
        if -1 not in target:
            if _zeros_are_sizes(node, target.reshape(-1)):
                node.attributes["allowzero"] = ir.AttrInt64("allowzero", 1)
                count += 1
            continue
        dims = _empty_output(node, target.reshape(-1))
        if dims is None:
            continue
        replace_constant_input(graph, node, 1, np.array(dims, dtype=np.int64), f"_empty_{count}")
        # static now: the reshapes after it read their input's sizes (_static_input)
        node.outputs[0].shape = ir.Shape(dims)
        node.attributes["allowzero"] = ir.AttrInt64("allowzero", 1)
        count += 1
    return count


__all__ = ["resolve_empty_reshapes"]
