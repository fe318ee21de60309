"""Capture of a model as a torch-level FX graph for the exporter.

The exporter works on the output of :class:`yobx.torch.tracing.CustomTracer`: a graph
whose placeholders are the flattened inputs and whose output node returns the
flattened outputs, every node carrying ``meta["val"]``.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from yobx.torch.fx_code import lazy_graph_module, recompile_alone

from ..pytree_paths import flatten_with_paths
from ..tracing.dynamic_shapes import axes_per_leaf, axis_spec
from ..tracing.inputs import bind_arguments, key_path_parts


@dataclasses.dataclass
class CapturedGraph:
    """A captured model.

    :param graph_module: torch-level graph, flat inputs and flat outputs
    :param out_spec: pytree spec rebuilding the user's output structure
    :param dimension_names: ShapeEnv symbol name -> user's dimension name
    :param guards: assumptions the capture made
    :param shape_env: the ShapeEnv of the fake values
    :param tracer: the tracer, when one was used
    """

    graph_module: torch.fx.GraphModule
    out_spec: pytree.TreeSpec | None
    dimension_names: dict[str, str]
    guards: list[Any]
    shape_env: Any
    tracer: Any = None
    #: :func:`yobx.torch.tracing.graph_fingerprint` of the graph as the tracer returned it
    fingerprint: str = ""
    #: facts on dynamic dimensions adopted from the example (``Constraint``)
    constraints: list[Any] = dataclasses.field(default_factory=list)
    #: the range of every named dimension, ``math.inf`` when unbounded
    range_constraints: dict[str, tuple] = dataclasses.field(default_factory=dict)
    #: [passes, issue 11] results of :func:`yobx.torch.passes.run_default_passes`
    passes: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: guards torch added while computing the fake values after the capture (the fx
    #: tracer's fake propagation), each with the node it came from
    guard_origins: list[tuple[Any, torch.fx.Node]] = dataclasses.field(default_factory=list)


def capture(
    model: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
    dynamic_shapes: Any,
    module_leaves: Any = None,
    narrowing: str = "versions",
    max_versions: int | None = None,
) -> CapturedGraph:
    """Captures ``model`` with :class:`yobx.torch.tracing.CustomTracer` (``narrowing``
    and ``max_versions``, None for its default, are its arguments)."""
    from yobx.torch.tracing import CustomTracer, graph_fingerprint
    from yobx.torch.tracing.core.tracer import DEFAULT_MAX_VERSIONS

    concrete_args = bind_arguments(model.forward, tuple(args), kwargs or {})
    # the ONNX model checks the constraints with nodes of its own (runtime_checks.py),
    # built after the optimizations: the graph's checks would be lowered like the model
    tracer = CustomTracer(
        module_leaves=module_leaves,
        runtime_checks=False,
        narrowing=narrowing,
        max_versions=DEFAULT_MAX_VERSIONS if max_versions is None else max_versions,
    )
    # an ONNX If returns one rank and dtype per output: a side returning another stays
    # a constraint, the other decisions versions
    tracer.versions_of_one_type = True
    graph = tracer.trace(
        model,
        concrete_args=concrete_args,
        dynamic_shapes=dynamic_shapes,
        remove_inplace=False,
    )
    fingerprint = graph_fingerprint(graph)
    graph_module = lazy_graph_module(tracer.traced_model, graph)
    passes = _run_default_passes(graph)
    remove_dead_code(graph_module)
    codegen = graph_module.graph._codegen
    pytree_info = getattr(codegen, "pytree_info", None)
    out_spec = pytree_info.out_spec if pytree_info is not None else None
    if out_spec is None:
        out_spec = _flatten_outputs(graph_module)
    from yobx.torch.onnx.dimensions import data_dependent_dimension_names

    names = data_dependent_dimension_names(graph_module)
    names.update(getattr(tracer, "dimension_names", {}) or {})
    return CapturedGraph(
        graph_module=graph_module,
        out_spec=out_spec,
        dimension_names=names,
        guards=list(getattr(tracer, "guards", []) or []),
        shape_env=getattr(tracer, "shape_env", None),
        tracer=tracer,
        fingerprint=fingerprint,
        constraints=list(tracer.constraints),
        range_constraints=dict(tracer.range_constraints),
        passes=passes,
    )


def _run_default_passes(graph: torch.fx.Graph) -> dict[str, Any]:
    """[passes, issue 11] The default passes, run once per capture. ONNX has no in-place
    writes: the final values of mutated inputs and buffers become extra outputs (listed
    in the output node's meta["yobx_mutations"])."""
    from yobx.torch.passes import run_default_passes
    from yobx.torch.tracing.symbolic.symbolic_kernels import symbolic_kernels

    # fake values of new nodes with the tracer's symbolic kernels (torch's would
    # specialize x[:, n - 1] = v to the example's n)
    with symbolic_kernels():
        return run_default_passes(graph, mutations="outputs", exc=False, recursive=True)


def remove_dead_code(graph_module: torch.fx.GraphModule) -> int:
    """Removes what the model computes without using it, in every graph, and the
    runtime checks of the constraints (the ONNX model gets checks of its own, see
    :mod:`yobx.torch.onnx.runtime_checks`) and of the inputs' layouts (ONNX inputs are
    always dense).

    Lowering dead code is not only a waste: its aten kernels may take decisions on the
    example's sizes the model never needed (a dead ``y[:, 1:] = y[:, :-1]``).

    :return: the number of nodes removed
    """
    from yobx.torch.passes import has_side_effect
    from yobx.torch.tracing.constraints.input_layouts import check_contiguous
    from yobx.torch.tracing.constraints.runtime_checks import check_constraint

    removed = 0
    for module in graph_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        before = removed
        for node in reversed(list(graph.nodes)):
            if node.op in ("placeholder", "output") or node.users:
                continue
            if node.target in (check_constraint, check_contiguous) or not has_side_effect(node):
                graph.erase_node(node)
                removed += 1
        if removed > before and isinstance(module, torch.fx.GraphModule):
            recompile_alone(module)
    return removed


def _expand_tuple_nodes(graph: torch.fx.Graph, value: Any) -> Any:
    """Replaces nodes returning tuples (per ``meta["val"]``) by tuples of getitem nodes."""
    if isinstance(value, torch.fx.Node):
        val = value.meta.get("val")
        if isinstance(val, (tuple, list)):
            items = []
            for i, item in enumerate(val):
                with graph.inserting_after(value):
                    getitem = graph.call_function(operator.getitem, (value, i))
                getitem.meta["val"] = item
                items.append(_expand_tuple_nodes(graph, getitem))
            return tuple(items)
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_expand_tuple_nodes(graph, v) for v in value)
    if isinstance(value, dict):
        return {k: _expand_tuple_nodes(graph, v) for k, v in value.items()}
    return value


def _flatten_outputs(graph_module: torch.fx.GraphModule) -> pytree.TreeSpec:
    """Makes the output node return a flat tuple and returns the structure's spec."""
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    structure = _expand_tuple_nodes(graph_module.graph, output.args[0])
    leaves, spec = pytree.tree_flatten(structure)
    output.args = (tuple(leaves),)
    recompile_alone(graph_module)
    return spec


def output_names(
    out_spec: pytree.TreeSpec | None, count: int, mutations: Sequence[Mapping[str, Any]] = ()
) -> list[str]:
    """Returns readable, stable names for the flat outputs.

    A single tensor is ``output``; a tuple or list gives ``output_0``, ``output_1``;
    dictionaries and dataclass-like outputs (``ModelOutput``) use their keys, nested
    positions append ``_<index>`` (``hidden_states_0_1``); the tensors of a
    ``transformers`` cache are ``present.<layer>.key`` and ``present.<layer>.value``
    (see :mod:`yobx.torch.onnx.cache_names`). The final values of
    mutated inputs and buffers (``mutations``, appended by ``remove_inplace``) come
    last, named ``<input or buffer>_updated``.
    """
    if mutations:
        from yobx.torch.onnx.translate import sanitize_name

        updated = [sanitize_name(f"{m['target']}_updated") for m in mutations]
        return _unique(output_names(out_spec, count - len(mutations)) + updated)
    if out_spec is None or out_spec.num_leaves != count:
        return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]
    # Stand-in leaves are empty tensors, not indices: containers such as DynamicCache
    # read tensor attributes when they are rebuilt.
    stand_ins = [torch.empty(0) for _ in range(count)]
    position = {id(t): i for i, t in enumerate(stand_ins)}
    structure = pytree.tree_unflatten(stand_ins, out_spec)
    if not isinstance(structure, (list, tuple, dict)) and not pytree.is_namedtuple_instance(
        structure
    ):
        leaves = flatten_with_paths(structure)
        if len(leaves) == 1 and not leaves[0][0]:
            return ["output"]
    from yobx.torch.onnx.cache_names import present_names
    from yobx.torch.onnx.translate import sanitize_name

    # the tensors of a cache are present.<layer>.key|value (see cache_names)
    present = present_names(structure)
    names: list[str] = [""] * count
    for path, leaf in flatten_with_paths(structure):
        index = position[id(leaf)]
        if id(leaf) in present:
            names[index] = present[id(leaf)]
            continue
        parts = key_path_parts(path)
        name = "_".join(parts)
        if not parts or isinstance(path[0], pytree.SequenceKey):
            name = f"output_{name}" if name else "output"
        names[index] = sanitize_name(name)
    return _unique(names)


def _unique(names: list[str]) -> list[str]:
    """Names must be unique; names made equal by sanitizing get a suffix."""
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        if name in seen:
            seen[name] += 1
            name = f"{name}_{seen[name]}"
        else:
            seen[name] = 0
        unique.append(name)
    return unique


def _symbolic_context(value: torch.Tensor, axes: Mapping[int, Any]):
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    dynamic = [
        DimDynamic.DYNAMIC if axis in axes else DimDynamic.STATIC for axis in range(value.dim())
    ]
    return StatelessSymbolicContext(dynamic_sizes=dynamic)


def _leaf_aware_fake_tensor_prop():
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from yobx.torch.onnx.custom_ops import leaf_module_call

    class LeafAwareFakeTensorProp(FakeTensorProp):
        """Propagates fake values, running LSTM/GRU leaves as yobx custom operators
        (their own forward cannot run on symbolic sizes)."""

        #: (guard, node) for the guards torch added while propagating, if recorded
        guard_origins: list | None = None

        def run_node(self, n):
            guards = self._mode.shape_env.guards
            start = len(guards)
            result = super().run_node(n)
            if self.guard_origins is not None:
                self.guard_origins.extend((guard, n) for guard in guards[start:])
            return result

        def call_module(self, target, args, kwargs):
            replacement = leaf_module_call(self.fetch_attr(target), args, kwargs)
            if replacement is not None:
                return replacement
            return super().call_module(target, args, kwargs)

    return LeafAwareFakeTensorProp


def capture_with_symbolic_trace(
    model: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
    dynamic_shapes: Any,
) -> CapturedGraph:
    """Captures ``model`` with :func:`torch.fx.symbolic_trace` and fake propagation.

    Only for models that symbolic_trace supports (no branching on shapes). Nested
    inputs (lists, tuples, dicts of tensors) are flattened. Dimensions named alike in
    ``dynamic_shapes`` share one symbol.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx._symbolic_trace import PH
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake_prop_class = _leaf_aware_fake_tensor_prop()
    bound = bind_arguments(model.forward, tuple(args), kwargs or {})
    concrete_args = {}
    for name, value in bound.items():
        if not isinstance(value, torch.Tensor) and pytree.tree_leaves(value):
            concrete_args[name] = pytree.tree_map(lambda _: PH, value)
    graph_module = torch.fx.symbolic_trace(model, concrete_args=concrete_args or None)
    shape_env = ShapeEnv()
    fake_mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)
    flat_values = pytree.tree_leaves(list(bound.values()))
    flat_axes = axes_per_leaf(list(bound), list(bound.values()), dynamic_shapes)
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(flat_values):
        raise ValueError(
            f"symbolic_trace made {len(placeholders)} placeholders for "
            f"{len(flat_values)} flat inputs"
        )
    fakes = []
    symbols: dict[str, torch.SymInt] = {}
    for node, value, axes in zip(placeholders, flat_values, flat_axes):
        if not isinstance(value, torch.Tensor):
            fakes.append(value)
            continue
        specs = {axis: axis_spec(entry, node.name, axis) for axis, entry in axes.items()}
        specs = {axis: spec for axis, spec in specs.items() if spec is not None}
        fake = fake_mode.from_tensor(value, symbolic_context=_symbolic_context(value, specs))
        for axis, spec in specs.items():
            size = fake.shape[axis]
            if spec.name in symbols:
                # The same name means the same dimension: unify the symbols.
                torch._check(size == symbols[spec.name])
            else:
                symbols[spec.name] = size
        fakes.append(fake)
    propagation = fake_prop_class(graph_module, mode=fake_mode)
    propagation.guard_origins = guard_origins = []
    propagation.propagate_dont_convert_inputs(*fakes)
    for node, fake in zip(placeholders, fakes):
        node.meta["val"] = fake
    passes = _run_default_passes(graph_module.graph)
    remove_dead_code(graph_module)
    pytree_info = getattr(graph_module.graph._codegen, "pytree_info", None)
    if pytree_info is not None and pytree_info.out_spec is not None:
        out_spec = pytree_info.out_spec
    else:
        out_spec = _flatten_outputs(graph_module)
    names = {str(size.node.expr): name for name, size in symbols.items()}
    return CapturedGraph(
        graph_module=graph_module,
        out_spec=out_spec,
        dimension_names=names,
        guards=[str(g.expr) for g in shape_env.guards],
        shape_env=shape_env,
        passes=passes,
        guard_origins=guard_origins,
    )
