"""The promise of dynamic shapes, kept to the end: declared dimensions in the ONNX model.

The capture keeps every dimension the user declared dynamic symbolic (or refuses).
Lowering to aten runs torch's kernels again on the same fake values: a kernel may take
a decision from the example's sizes there (a guard), which can make a dimension static
or restrict its range without the capture knowing. Such decisions are judged like the
capture's own (:mod:`yobx.torch.tracing.constraints.refinement`): provable ones are fine, others are
adopted as constraints when the declarations allow it; a dimension becoming a constant
is an :class:`OnnxExportError` naming it and the line that needed it.

Finally, the ONNX model's inputs are compared with the declarations: every declared
dimension (but ``Dim.AUTO``) must be a symbolic ONNX dimension with the user's name,
and no ``dim_param`` may be a number.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import onnx_ir as ir
import sympy
import torch

from yobx.torch.node_text import node_location
from yobx.torch.onnx.dimensions import DimensionRenamer
from yobx.torch.onnx.errors import OnnxExportError
from yobx.torch.tracing.dynamic_shapes import AUTO, SCALAR, DimSpec, axes_per_leaf, axis_spec
from yobx.torch.tracing.inputs import bind_arguments


@dataclasses.dataclass(frozen=True)
class DeclaredDimension:
    """One axis of one input the user declared dynamic.

    :param input_name: the flat input (placeholder) name
    :param axis: the axis, :data:`SCALAR` for an int argument
    :param spec: the declaration
    :param size: the capture's size of that axis (a SymInt, or an int if it became
        static)
    """

    input_name: str
    axis: int
    spec: DimSpec
    size: Any

    def describe(self) -> str:
        """``'seq' (axis 1 of input_ids)``, ``'k' (int argument k)``"""
        if self.axis is SCALAR:
            return f"{self.spec.name!r} (int argument {self.input_name})"
        return f"{self.spec.name!r} (axis {self.axis} of {self.input_name})"


def declared_dimensions(
    model: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any],
    dynamic_shapes: Any,
    graph_module: torch.fx.GraphModule,
) -> list[DeclaredDimension]:
    """Every axis ``dynamic_shapes`` declares, with the capture's size for it."""
    if dynamic_shapes is None:
        return []
    bound = bind_arguments(model.forward, args, kwargs)
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    flat_axes = axes_per_leaf(list(bound), list(bound.values()), dynamic_shapes)
    if len(flat_axes) != len(placeholders):
        raise OnnxExportError(
            f"{len(placeholders)} graph inputs for {len(flat_axes)} flat inputs: cannot "
            f"match the dynamic shapes to the inputs"
        )
    declared = []
    for node, axes in zip(placeholders, flat_axes):
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt) and SCALAR in axes:
            spec = axis_spec(axes[SCALAR], node.name, SCALAR)
            declared.append(DeclaredDimension(node.name, SCALAR, spec, value))
        if not isinstance(value, torch.Tensor):
            continue
        for axis, entry in axes.items():
            spec = axis_spec(entry, node.name, axis)
            if spec is not None:
                declared.append(DeclaredDimension(node.name, axis, spec, value.shape[axis]))
    return declared


def _symbols_of(size: Any) -> set[sympy.Symbol]:
    if isinstance(size, torch.SymInt):
        # the symbol before the ShapeEnv replaced it (by a constant, when specialised)
        return set(size.node._expr.free_symbols)
    return set()


def _is_static(size: Any, shape_env: Any) -> bool:
    if not isinstance(size, torch.SymInt):
        return True
    expr = size.node.expr
    if shape_env is not None:
        expr = shape_env.replace(expr)
    return bool(expr.is_number)


def adopt_lowering_guards(captured: Any, lowered: Any, known: Any) -> None:
    """Judges the decisions torch took while lowering (``lowered.guards``).

    A decision provable from what the capture knew (``known``, a snapshot of its
    ShapeEnv before lowering) is fine. Others were taken from the example: they become
    constraints of the export as the dimensions' declarations allow (see
    :mod:`yobx.torch.tracing.constraints.refinement`), and ``captured.constraints`` is updated.

    :raises OnnxExportError: a decision would make a dimension declared dynamic a
        constant, or needs a fact a named ``Dim`` does not allow; the message names the
        dimension and the line being lowered
    """
    tracer = captured.tracer
    if not lowered.guards:
        return
    if tracer is None or tracer.dims is None:
        guard, node = lowered.guards[0]
        raise OnnxExportError(
            f"lowering to aten needed `{guard.expr}` on the example's sizes, which the "
            f"capture did not establish",
            node,
        )
    from yobx.torch.tracing.errors import TracingError

    for guard, node in lowered.guards:
        if tracer.dims.prove(guard.expr, known) is True:
            continue
        try:
            tracer.refinements.adopt(
                guard.expr, node_location(node), "lowering to aten", known=True
            )
        except TracingError as exc:
            raise OnnxExportError(f"lowering to aten specialised the model: {exc}", node) from exc
    strict = tracer.refinements.strict_error()
    if strict is not None:
        raise OnnxExportError(f"lowering to aten needs constraints: {strict}") from strict
    captured.constraints = list(tracer.constraints)
    captured.range_constraints = dict(tracer.range_constraints)


def refuse_translation_guards(shape_env: Any, n_guards: int) -> None:
    """Raises when the translation to ONNX took a decision on the example's sizes.

    Everything about sizes was decided by the capture and judged in the lowering; the
    translation (type promotion re-runs some nodes on fake tensors) must not add a
    guard: one would have been taken from the example, unchecked.

    :param n_guards: the number of guards of ``shape_env`` before the translation
    """
    if shape_env is None or len(shape_env.guards) <= n_guards:
        return
    added = ", ".join(f"`{g.expr}`" for g in shape_env.guards[n_guards:])
    raise OnnxExportError(
        f"the translation to ONNX decided {added} from the example's sizes, which the "
        f"capture did not establish; this is a bug of yobx, please report it with the model"
    )


def _specialised_by(symbols: set, captured: Any, lowered: Any) -> str:
    """The decision and line that fixed ``symbols``, when one is known."""
    names = {str(s) for s in symbols}
    stages = (("the capture", captured.guard_origins), ("lowering", lowered.guards))
    for stage, guards in stages:
        for guard, node in guards:
            if names & {str(s) for s in guard.expr.free_symbols}:
                where = node_location(node)
                return f"; {stage} of node `{node.name}` decided {guard.expr}" + (
                    f" at {where}" if where else ""
                )
    return ""


_NUMBER = re.compile(r"^-?\d+$")


def remove_numeric_dim_params(model: ir.Model) -> None:
    """A dimension whose name is a number (``"4"``) is the number: ``dim_value``."""
    from yobx.torch.onnx.dimensions import all_values

    for value in all_values(model):
        shape = value.shape
        if shape is None:
            continue
        dims = list(shape)
        changed = False
        for i, dim in enumerate(dims):
            if isinstance(dim, ir.SymbolicDim) and dim.value and _NUMBER.match(dim.value):
                dims[i] = int(dim.value)
                changed = True
        if changed:
            value.shape = ir.Shape(dims)


def check_declared_dimensions(
    model: ir.Model,
    declared: list[DeclaredDimension],
    renamer: DimensionRenamer,
    captured: Any,
    lowered: Any = None,
) -> None:
    """Checks that every declared dimension is symbolic and named in the ONNX inputs.

    ``Dim.AUTO`` dimensions may be static (the tracer warned). A declared dimension
    the ONNX model lost, or names differently from the capture (``s45`` instead of
    ``batch``), is an error.

    :raises OnnxExportError: naming the dimension, and the decision and line that
        specialised it when known
    """
    inputs = {value.name: value for value in model.graph.inputs}
    problems = []
    for dim in declared:
        value = inputs.get(dim.input_name)
        if dim.axis is SCALAR:
            if value is None or (value.shape is not None and len(value.shape) != 0):
                problems.append(f"{dim.describe()} is not a scalar input of the ONNX model")
            continue
        if value is None or value.shape is None:
            # an input the model does not use: nothing can depend on its sizes
            continue
        onnx_dim = value.shape[dim.axis]
        symbolic = isinstance(onnx_dim, ir.SymbolicDim) and onnx_dim.value is not None
        if not symbolic or _NUMBER.match(str(onnx_dim.value)):
            if dim.spec.policy == AUTO:
                continue
            shown = onnx_dim.value if isinstance(onnx_dim, ir.SymbolicDim) else onnx_dim
            problems.append(
                f"{dim.describe()} is {shown!r} in the ONNX model"
                + _specialised_by(_symbols_of(dim.size), captured, lowered)
            )
            continue
        if _is_static(dim.size, captured.shape_env):
            continue
        expected = renamer.expression(dim.size.node.expr)
        if onnx_dim.value != expected:
            problems.append(
                f"{dim.describe()} is named {onnx_dim.value!r} in the ONNX model instead "
                f"of {expected!r}"
            )
    if problems:
        raise OnnxExportError(
            "dimensions declared dynamic are not dynamic in the ONNX model: "
            + "; ".join(problems)
            + ". The model would be wrong for other sizes; declare them static "
            "(None or Dim.STATIC) or Dim.AUTO if that is intended"
        )
