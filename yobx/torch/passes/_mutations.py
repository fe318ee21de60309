"""Where the final values of mutated inputs and buffers go, and the new nodes' values.

Two conventions:

* *write-back* (default): the body is functional and ends with one ``copy_`` per mutated
  input or buffer (``meta["yobx_write_back"]`` marks them), so the graph module has the
  model's side effects;
* *outputs* (torch.export's convention, used by ``to_onnx``): the final values become
  extra outputs, listed in ``output_node.meta["yobx_mutations"]`` on a plain graph, or in
  the ``ExportedProgram``'s graph signature.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx import Graph, Node
from torch.fx.node import map_arg

from ._inplace_walk import WRITE_BACK_KEY, InplaceRemovalError, Root
from ._targets import aten, example_value

#: ``output_node.meta`` key listing the mutated inputs and buffers whose final values
#: ``remove_inplace(mutations="outputs")`` appended to the outputs
MUTATIONS_KEY = "yobx_mutations"


def write_back(graph: Graph, finals: list[tuple[Root, Node]]) -> None:
    """Appends ``copy_(input_or_buffer, final_value)`` before the output node."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    aten_level = any(
        isinstance(n.target, torch._ops.OpOverload) for n in graph.nodes if n.op == "call_function"
    )
    with graph.inserting_before(output):
        for root, value in finals:
            if aten_level:
                node = graph.call_function(aten.copy_.default, (root.node, value))
            else:
                node = graph.call_method("copy_", (root.node, value))
            node.meta[WRITE_BACK_KEY] = True
            val = example_value(root.node)
            if val is not None:
                node.meta["val"] = val


def record_outputs(graph: Graph, finals: list[tuple[Root, Node]]) -> None:
    """torch.export-like convention on a plain graph: the final values become outputs."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    records = list(output.meta.get(MUTATIONS_KEY, []))
    codegen = graph._codegen
    out_spec = getattr(getattr(codegen, "pytree_info", None), "out_spec", None)
    if out_spec is not None:
        # the graph returns flat leaves rebuilt by its pytree codegen: append leaves and
        # make the rebuilt output ``(original_output, new_value_1, ...)``
        values = list(output.args[0])
        if records:
            children = list(out_spec.children())
            out_spec = children[0]
            extra = len(children) - 1
        else:
            extra = 0
        leaf = pytree.tree_structure(0)
        codegen.pytree_info = codegen.pytree_info._replace(
            out_spec=pytree.TreeSpec(tuple, None, [out_spec] + [leaf] * (extra + len(finals)))
        )
        next_index = extra + 1
    else:
        values = list(output.args[0]) if records else [output.args[0]]
        next_index = len(values)
    for root, value in finals:
        kind = "USER_INPUT_MUTATION" if root.node.op == "placeholder" else "BUFFER_MUTATION"
        records.append(
            {
                "kind": kind,
                "target": root.node.target,
                "node": value.name,
                "output_index": next_index,
            }
        )
        next_index += 1
        values.append(value)
    output.args = (tuple(values),)
    output.meta[MUTATIONS_KEY] = records


def record_exported(exported_program: Any, finals: list[tuple[Root, Node]]) -> None:
    """torch.export's convention: mutation outputs listed in the graph signature."""
    from torch.export.graph_signature import (
        InputKind,
        OutputKind,
        OutputSpec,
        TensorArgument,
    )

    signature = exported_program.graph_signature
    inputs = {spec.arg.name: spec for spec in signature.input_specs if hasattr(spec.arg, "name")}
    kinds = {
        InputKind.BUFFER: OutputKind.BUFFER_MUTATION,
        InputKind.PARAMETER: OutputKind.PARAMETER_MUTATION,
        InputKind.USER_INPUT: OutputKind.USER_INPUT_MUTATION,
    }
    graph = exported_program.graph_module.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    values = list(output.args[0])
    first_user = next(
        (i for i, s in enumerate(signature.output_specs) if s.kind == OutputKind.USER_OUTPUT),
        len(signature.output_specs),
    )
    for root, value in finals:
        spec = inputs.get(root.node.name)
        if spec is None or spec.kind not in kinds:
            raise InplaceRemovalError(
                f"node {root.node.name!r} is mutated but the exported program has no "
                "input spec allowing a mutation for it"
            )
        target = spec.target if spec.kind != InputKind.USER_INPUT else spec.arg.name
        if any(s.target == target and s.kind == kinds[spec.kind] for s in signature.output_specs):
            raise InplaceRemovalError(
                f"input {target!r} is mutated in place although the exported program "
                "already returns its mutated value"
            )
        new_spec = OutputSpec(kinds[spec.kind], TensorArgument(name=value.name), target)
        signature.output_specs.insert(first_user, new_spec)
        values.insert(first_user, value)
        first_user += 1
    output.args = (tuple(values),)


def propagate_values(graph: Graph, original: set[Node]) -> None:
    """Computes ``meta["val"]`` of the new nodes when the graph's nodes carry fake values.

    The new nodes (scatters of a write, ``reshape_as``, ``copy``) have the shape of one
    of their inputs; what torch's kernels decide on the way is their layout (whether a
    view of ``y[: n // 2]`` is contiguous asks ``(n//2) != 1``). Decided with a guard,
    that would be a fact taken from the example that nothing checks, and the graph's
    ShapeEnv would narrow the dimension for every later stage (the ONNX lowering made
    ``n`` the example's size). The guards are suppressed: the values' layouts are the
    example's, their sizes the fake values' own, and nothing is decided.
    """
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensor

    fakes = [
        example_value(n)
        for n in graph.find_nodes(op="placeholder")
        if isinstance(example_value(n), FakeTensor)
    ]
    try:
        mode = detect_fake_mode(fakes) if fakes else None
    except AssertionError:
        # make_fx in real mode snapshots every value in its own fake mode
        return
    if mode is None:
        return
    missing = object()

    def value(node: Node) -> Any:
        val = node.meta.get("val", missing)
        if val is missing:
            raise KeyError(node.name)
        return val

    quiet = mode.shape_env.suppress_guards() if mode.shape_env is not None else nullcontext()
    with mode, quiet:
        for node in graph.nodes:
            if node in original or "val" in node.meta:
                continue
            try:
                args = map_arg(node.args, value)
                kwargs = map_arg(node.kwargs, value)
                if node.op == "call_method":
                    node.meta["val"] = getattr(args[0], node.target)(*args[1:], **kwargs)
                elif node.op == "call_function":
                    node.meta["val"] = node.target(*args, **kwargs)
            except Exception:  # a value we cannot compute stays unknown, never guessed
                continue
