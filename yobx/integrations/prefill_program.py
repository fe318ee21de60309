"""A prefill's ONNX model made from the decode step's, instead of a capture of its own.

transformers' ``export_for_generation`` exports two components of a causal LM: the
``prefill`` (the prompt, an empty cache) and the ``decode`` step (new tokens on a
cache). yobx's decode step already serves an empty cache: it is captured with the mask
declared ``past + seq``, and the decision on ``past == 0`` the model takes (a cache
without keys yet) is one of its versions. The prefill's graph is that step with each
cache input replaced by an empty tensor (``batch`` rows from ``input_ids``, ``0``
positions): the optimizer then folds the choices on ``past == 0`` into the prefill's
side. It saves the prefill's capture, lowering and translation (about 40% of an
``export_for_generation``), and it computes what the decode step computes at
``past = 0``, which the decode step's export checked on its inputs.

The runner binds the prefill's inputs by name (``input_ids``, ``attention_mask``,
``position_ids``...; an empty cache has no tensor) and reads its outputs in the order of
the model's output (``logits``, ``present.<i>.key|value``), the decode step's too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir
import sympy

from yobx.torch.onnx.optimize import optimize_model
from yobx.torch.onnx.weights import weights_kept_apart
from yobx.torch.quiet_logs import quieted

#: the dimension of a cache's positions (yobx.integrations.transformers.CACHE_ROLES)
PAST = "past"
#: the suffix of an input after the model checked its sizes (a Reshape to itself)
CHECKED = "__checked"


def prefill_from_decode(
    decode: ir.Model,
    prefill_inputs: list[str],
    weights: Iterable[str] = (),
    batch_input: str = "input_ids",
) -> ir.Model | None:
    """The prefill's model: a copy of ``decode`` (weights shared) whose inputs are
    ``prefill_inputs`` (the names the runner binds), every other input being a
    cache's keys or values, replaced by an empty tensor; None when ``decode`` does not
    have that form (an input of the prefill it does not take, another input than a
    4-d cache tensor over ``past``).

    :param weights: the initializers holding the model's weights, which the optimizer
        run on the copy leaves as they are (see
        :func:`~yobx.torch.onnx.weights.weights_kept_apart`); the small constants it
        lifted to initializers when it optimized ``decode`` stay visible, so that the
        choices comparing with them fold
    :param batch_input: the input whose first axis is the batch of the empty cache
    """
    names = [value.name for value in decode.graph.inputs]
    if not set(prefill_inputs) <= set(names) or batch_input not in prefill_inputs:
        return None
    cache = [value for value in decode.graph.inputs if value.name not in prefill_inputs]
    if not cache or not all(_is_cache_tensor(value) for value in cache):
        return None
    if any(_is_cache_tensor(v) for v in decode.graph.inputs if v.name in prefill_inputs):
        return None  # a cache the prefill holds tensors of (a sliding window's)
    model = decode.clone()
    graph = model.graph
    inputs = {value.name: value for value in graph.inputs}
    batch = ir.node("Shape", [inputs[batch_input]], attributes={"start": 0, "end": 1})
    batch.outputs[0].name = "prefill_batch"
    graph.insert_before(graph.node(0), [batch])
    for index, name in enumerate(value.name for value in cache):
        value = inputs[name]
        _, heads, _, head = value.shape
        shape = ir.node(
            "Concat",
            [batch.outputs[0], _constant(graph, np.array([heads, 0, head], np.int64), index)],
            attributes={"axis": 0},
        )
        zero = ir.tensor(np.zeros((1,), dtype=value.dtype.numpy()))
        empty = ir.node("ConstantOfShape", [shape.outputs[0]], attributes={"value": zero})
        shape.outputs[0].name = f"prefill_empty_shape_{index}"
        empty.outputs[0].name = f"prefill_empty_{index}"
        empty.outputs[0].shape = ir.Shape([value.shape[0], heads, 0, head])
        empty.outputs[0].type = value.type
        graph.insert_after(batch, [shape, empty])
        value.replace_all_uses_with(empty.outputs[0])
        graph.inputs.remove(value)
        _known_shapes(empty.outputs[0], [batch.outputs[0], heads, 0, head], shape.outputs[0])
    # the choices on past == 0 fold into the prefill's side; the weights stay as they
    # are, named after the state dict (see weights_kept_apart)
    weights = [name for name in weights if name in graph.initializers]
    with quieted("onnxscript.optimizer._constant_folding"), weights_kept_apart(model, weights):
        optimize_model(model)
    _without_past(model)
    return model


def _known_shapes(empty: ir.Value, dims: list, full: ir.Value) -> None:
    """Replaces the ``Shape`` of ``empty`` read by the graph (a cache's length, which
    the choice on ``past == 0`` compares) by what it is: constants for the static
    axes, ``full`` (the computed shape) for the whole, the batch for the first axis;
    onnxscript's optimizer does not see through ``ConstantOfShape``, and then folds
    the choices."""
    for node, index in list(empty.uses()):
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Reshape" and index == 0 and node.outputs[0].name.endswith(CHECKED):
            # a runtime check of the input's sizes returns the input as it is
            _known_shapes(node.outputs[0], dims, full)
            continue
        if node.op_type != "Shape":
            continue
        start = node.attributes.get_int("start", 0) % 4 if "start" in node.attributes else 0
        end = node.attributes.get_int("end", 4) if "end" in node.attributes else 4
        end = end % 4 if end < 0 else min(end, 4)
        pieces = dims[start:end]
        if not pieces:
            continue
        if all(isinstance(d, int) for d in pieces):
            constant = ir.node(
                "Constant", [], attributes={"value": ir.tensor(np.array(pieces, np.int64))}
            )
            constant.outputs[0].name = f"{node.outputs[0].name}_known"
            node.graph.insert_before(node, [constant])
            node.outputs[0].replace_all_uses_with(constant.outputs[0])
        elif (start, end) == (0, 4):
            node.outputs[0].replace_all_uses_with(full)
        elif (start, end) == (0, 1):
            node.outputs[0].replace_all_uses_with(dims[0])


def _is_cache_tensor(value: ir.Value) -> bool:
    """A cache's keys or values: 4-d, static heads and head size, positions ``past``."""
    shape = value.shape
    return (
        shape is not None
        and len(shape) == 4
        and isinstance(shape[1], int)
        and isinstance(shape[3], int)
        and str(shape[2]) == PAST
        and value.dtype is not None
    )


def _constant(graph: ir.Graph, array: np.ndarray, index: int) -> ir.Value:
    node = ir.node("Constant", [], attributes={"value": ir.tensor(array)})
    node.outputs[0].name = f"prefill_cache_shape_{index}"
    graph.insert_before(graph.node(0), [node])
    return node.outputs[0]


def _without_past(model: ir.Model) -> None:
    """The dimensions of the inputs and outputs written with ``past = 0``: the mask's
    ``past+seq`` is ``seq``, the new cache's positions ``seq``."""
    for value in [*model.graph.inputs, *model.graph.outputs]:
        if value.shape is None:
            continue
        dims = list(value.shape)
        changed = False
        for axis, dim in enumerate(dims):
            text = str(dim) if isinstance(dim, ir.SymbolicDim) and dim.value else ""
            if not re.search(rf"\b{PAST}\b", text):
                continue
            try:
                expression = sympy.sympify(text).subs(sympy.Symbol(PAST), 0)
            except (sympy.SympifyError, SyntaxError, TypeError):
                continue
            dims[axis] = int(expression) if expression.is_number else str(expression)
            changed = True
        if changed:
            value.shape = ir.Shape(dims)
