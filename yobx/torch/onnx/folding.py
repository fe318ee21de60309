"""onnxscript's constant folding, as :func:`~yobx.torch.onnx.optimize.optimize_model`
runs it.

:func:`folding_pass` is onnxscript's ``FoldConstantsPass`` with three changes:

* **its shape inference runs only where it adds something**, and once per kind of
  node. A node is serialized, inferred by ONNX and deserialized again: 130 µs, a fifth
  of the optimizer's time. The values torch.onnx's translation creates are known
  already (:func:`fully_known`); the others (inside translated functions, made by the
  rewrites) repeat themselves, layer after layer and version after version: in the
  ``export_for_generation`` of a tiny Llama, 1,321 inferences have 192 distinct
  inputs. The result of ONNX's inference is a function of the operator, its opset,
  its attributes and its inputs' types, shapes and small constant values (those ONNX
  reads), and is kept by those (:data:`_INFERRED`);
* **a node inside a branch leaves the enclosing graph's shapes alone**
  (:func:`_outer_shapes`);
* **an evaluator that fails leaves its node as it is** instead of refusing the export.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from yobx.torch.bounded_cache import BoundedCache

#: the constant inputs onnxscript gives ONNX's shape inference (``_get_numpy_value``)
_DATA_LIMIT = 20
#: attributes a key cannot hold (their values are not hashable)
_UNKEYED = (
    ir.AttributeType.TENSOR,
    ir.AttributeType.TENSORS,
    ir.AttributeType.GRAPH,
    ir.AttributeType.GRAPHS,
    ir.AttributeType.SPARSE_TENSOR,
    ir.AttributeType.SPARSE_TENSORS,
    ir.AttributeType.TYPE_PROTOS,
)
#: what ONNX inferred for each output of a kind of node (:func:`_inference_key`):
#: ``(dims or None, type)``, or None for an output it inferred nothing for
_INFERRED: dict[tuple, list] = BoundedCache(20_000)


def fully_known(value: ir.Value) -> bool:
    """True when ``value`` has a type and a shape whose every dimension is an integer
    or a named symbol: ONNX shape inference has nothing to add.

    The values torch.onnx's translation creates from the graph's fake tensors are such,
    and exact (a dimension torch knows symbolic is symbolic); the folding pass's shape
    inference then only runs on the nodes inside translated functions and on those the
    rewrites create.
    """
    shape = value.shape
    if value.type is None or shape is None:
        return False
    return all(isinstance(dim, int) or dim.value is not None for dim in shape)


def _dims(shape: ir.Shape | None) -> tuple | None:
    if shape is None:
        return None
    return tuple(dim if isinstance(dim, int) else dim.value for dim in shape)


def _inference_key(node: ir.Node, opset: int | None) -> tuple | None:
    """What ONNX's inference of ``node`` depends on, None when an attribute holds a
    tensor or a graph (such nodes are inferred each time)."""
    attributes = []
    for name, attribute in sorted(node.attributes.items()):
        if attribute.type in _UNKEYED:
            return None
        value = attribute.value
        attributes.append((name, tuple(value) if isinstance(value, list) else value))
    inputs: list[Any] = []
    for value in node.inputs:
        if value is None:
            inputs.append(None)
            continue
        constant = value.const_value
        data = None
        if constant is not None and constant.size <= _DATA_LIMIT:
            data = (constant.dtype, tuple(constant.shape), constant.numpy().tobytes())
        inputs.append((value.type, _dims(value.shape), data))
    key = (node.domain, node.op_type, opset, tuple(attributes), tuple(inputs), len(node.outputs))
    try:
        hash(key)
    except TypeError:  # an attribute of a form not foreseen: inferred each time
        return None
    return key


def _shape(dims: tuple | None) -> ir.Shape | None:
    if dims is None:
        return None
    return ir.Shape([d if isinstance(d, int) else ir.SymbolicDim(d) for d in dims])


def folding_pass(**kwargs: Any) -> ir.passes.InPlacePass:
    """onnxscript's constant folding (``kwargs`` are its options), with the changes of
    this module.

    An evaluator failing is a bug of onnxscript, not of the model (onnxscript 0.7.2 reads
    the value of a ``SplitToSequence`` split size it only knows the shape of, for a
    ``chunk`` of a dynamic dimension): the node is left as it is, folded or not, instead
    of refusing the whole export.
    """
    from onnxscript.optimizer import _constant_folding

    class FoldConstantsPass(_constant_folding.FoldConstantsPass):
        def _do_inference(self, node: ir.Node) -> None:
            if all(fully_known(output) for output in node.outputs):
                return
            key = _inference_key(node, self._opset_imports.get(node.domain))
            inferred = None if key is None else _INFERRED.get(key)
            if inferred is None:
                inferred = self._infer(node)
                if key is not None:
                    _INFERRED[key] = inferred
            for output, result in zip(node.outputs, inferred):
                if result is not None:
                    # as onnxscript merges what it infers
                    dims, type_ = result
                    output.shape = _constant_folding._merge_shapes(output.shape, _shape(dims))
                    output.type = type_

        def _infer(self, node: ir.Node) -> list:
            """onnxscript's inference of ``node`` alone: what it gives each output
            with nothing known of them before."""
            known = [(output.shape, output.type) for output in node.outputs]
            for output in node.outputs:
                output.shape, output.type = None, None
            try:
                super()._do_inference(node)
                return [
                    None if output.type is None else (_dims(output.shape), output.type)
                    for output in node.outputs
                ]
            finally:
                for output, (shape, type_) in zip(node.outputs, known):
                    output.shape, output.type = shape, type_

        def call(self, model: ir.Model):
            # the model's inputs keep their declared shapes whatever node reads them
            self._declared_inputs = list(model.graph.inputs)
            return super().call(model)

        def process_node(self, node: ir.Node, is_function: bool):
            outer = _outer_shapes(node)
            outer += [(v, v.shape) for v in getattr(self, "_declared_inputs", ())]
            try:
                return super().process_node(node, is_function)
            except RuntimeError as e:
                if not str(e).startswith("Error during constant folding for node"):
                    raise
                return None
            finally:
                for value, shape in outer:
                    value.shape = shape

    return FoldConstantsPass(**kwargs)


def _outer_shapes(node: ir.Node) -> list[tuple[ir.Value, ir.Shape | None]]:
    """The shapes of the values a node inside a branch reads from an enclosing graph.

    The folding infers shapes backwards through an ``Identity`` (its input gets its
    output's shape): inside the ``If`` branch of a version for ``seq == 1``, an
    ``Identity`` of an input whose output is ``[batch, 1]`` would make the model's
    input ``[batch, 1]`` for every version. A branch knows its shapes under its
    condition only: they are put back after the node is folded.
    """
    graph = node.graph
    return [
        (value, value.shape)
        for value in node.inputs
        if value is not None and value.graph is not None and value.graph is not graph
    ]


__all__ = ["folding_pass", "fully_known"]
