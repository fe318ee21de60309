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


def _sizes(shape: ir.Shape | None) -> list[int | None] | None:
    """The sizes of ``shape``, None for each one not known; None for an unknown rank."""
    if shape is None:
        return None
    return [d if isinstance(d, int) else getattr(d, "value", None) for d in shape]


def _static(shape: ir.Shape | None) -> list[int] | None:
    """The sizes of ``shape`` when every one is known, None otherwise."""
    dims = _sizes(shape)
    return dims if dims is not None and all(isinstance(d, int) for d in dims) else None


#: operators whose output has the shape of their first input
_SAME_SHAPE = ("InstanceNormalization", "Identity", "Cast")


def _input_sizes(node: ir.Node) -> list[int | None] | None:
    """The sizes of ``node``'s first input (None where not known): its declared ones,
    or, for a ``Transpose`` of a value of known rank, that value's sizes permuted, and
    for an operator keeping its input's shape (``group_norm``'s
    ``InstanceNormalization`` between its two reshapes), its input's (the optimizer's
    shape inference ran before this module made the reshapes it reads static:
    ``scaled_dot_product_attention`` transposes the key it reshaped, then reshapes it
    again)."""
    value = node.inputs[0]
    if value is None:
        return None
    known = _sizes(value.shape)
    producer = value.producer()
    unknown_empty = known is None or 0 not in known
    if unknown_empty and producer is not None and producer.op_type in _SAME_SHAPE:
        inner = _input_sizes(producer) if producer.domain in ("", "ai.onnx") else None
        return inner if inner is not None and 0 in inner else known
    if (known is not None and 0 in known) or producer is None or producer.op_type != "Transpose":
        return known
    source = _sizes(producer.inputs[0].shape) if producer.inputs[0] is not None else None
    if source is None:
        return known
    perm = producer.attributes.get_ints("perm", None)
    perm = list(reversed(range(len(source)))) if perm is None else list(perm)
    if sorted(perm) != list(range(len(source))):
        return known
    return [source[axis] for axis in perm]


def _read_on_input(node: ir.Node, target: np.ndarray) -> list[int | None] | None:
    """The sizes ``node``'s target gives when its input is empty at every size (one of
    its sizes is a static 0), a 0 of the target copying the input's size unless
    ``allowzero`` (None where that size is not known, ``-1`` left as it is); None when
    the input is not known empty or a 0 points past its axes."""
    source = _input_sizes(node)
    if source is None or 0 not in source:
        return None
    allowzero = node.attributes.get_int("allowzero", 0)
    dims: list[int | None] = []
    for index, size in enumerate(int(t) for t in target):
        if size == 0 and not allowzero:
            if index >= len(source):
                return None
            dims.append(source[index])
        else:
            dims.append(size)
    return dims


def _empty_output(node: ir.Node, target: np.ndarray) -> list[int] | None:
    """The static shape of ``node``'s empty output: its own when known, else the target
    read on the input empty at every size (:func:`_read_on_input`), ``-1`` standing for
    0: any size gives the same empty tensor, and torch itself refuses such a reshape
    (only a decomposition writes one, ``group_norm``'s ``(0, groups, -1)``, and reads
    the sizes it needs elsewhere)."""
    known = _static(node.outputs[0].shape)
    if known is not None:
        return known if 0 in known else None
    dims = _read_on_input(node, target)
    sizes = [size for size in dims or () if size is not None]
    if dims is None or len(sizes) != len(dims):
        return None
    return [0 if size == -1 else size for size in sizes]


def _zeros_are_sizes(node: ir.Node, target: np.ndarray) -> bool:
    """The 0s of ``node``'s constant target (without ``-1``) can only be sizes: its input
    is empty at every size, and reading them as the input's sizes (``allowzero=0``)
    points past the input's axes, changes the number of elements, or gives another
    shape than the output's own static one."""
    if node.attributes.get_int("allowzero", 0) or 0 not in target:
        return False
    source = _input_sizes(node)
    if source is None or 0 not in source:
        return False
    copied = _read_on_input(node, target)
    if copied is None:
        return True  # a 0 past the input's axes
    if any(size is None for size in copied):
        return False
    known = _static(node.outputs[0].shape)
    return 0 not in copied or (known is not None and known != copied and known == list(target))


def _declare(node: ir.Node, dims: list[int]) -> None:
    """Declares the static shape of ``node``'s output, with its input's type when it
    has none (a shape without a type is left out when the model is serialized)."""
    output = node.outputs[0]
    if output.type is None and node.inputs[0] is not None:
        output.type = node.inputs[0].type
    output.shape = ir.Shape(dims)


def _forget_shapes_after(value: ir.Value, main: ir.Graph) -> None:
    """Forgets the shapes of the values computed from ``value``: the optimizer's shape
    inference wrote them from the 0s read as the input's sizes (``(1, 2, 2, 3)`` where
    the reshape gives ``(1, 0, 2, 3)``), and onnxruntime would check a product of
    matrices on them when creating the session (``Incompatible dimensions``). The
    model's outputs keep theirs, the capture's (their dimensions are named)."""
    seen = {id(value)}
    todo = [value]
    while todo:
        for use in todo.pop().uses():
            for output in use.node.outputs:
                if id(output) not in seen:
                    seen.add(id(output))
                    if not (output.is_graph_output() and use.node.graph is main):
                        output.shape = None
                    todo.append(output)


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
                _declare(node, [int(size) for size in target.reshape(-1)])
                _forget_shapes_after(node.outputs[0], model.graph)
                count += 1
            continue
        dims = _empty_output(node, target.reshape(-1))
        if dims is None:
            continue
        replace_constant_input(graph, node, 1, np.array(dims, dtype=np.int64), f"_empty_{count}")
        # static now: the reshapes after it read their input's sizes (_static_input)
        _declare(node, dims)
        node.attributes["allowzero"] = ir.AttrInt64("allowzero", 1)
        count += 1
    return count


__all__ = ["resolve_empty_reshapes"]
