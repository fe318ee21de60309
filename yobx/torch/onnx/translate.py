"""Translates a lowered aten graph into an onnx_ir model.

Each aten node goes through torch_lib (see :mod:`._torch_onnx_internals`); this module
adds what is ours: inputs named after the user's flat inputs, initializers named after
the parameters' qualified names, outputs with readable names, and ONNX values named
after the torch-level FX nodes whose values they hold.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import onnx_ir as ir
import torch

from yobx import __version__
from yobx.torch.onnx import _torch_onnx_internals as internals
from yobx.torch.onnx.empty_scans import guard_empty_scans
from yobx.torch.onnx.errors import OnnxExportError, UnsupportedOperatorError
from yobx.torch.onnx.lowering import SOURCE_NODE_KEY, LoweredGraph
from yobx.torch.onnx.opsets import DEFAULT_OPSET
from yobx.torch.tracing.constraints.versions import DIMENSIONS_KEY


def _rename_aten_nodes(
    graph_module: torch.fx.GraphModule, names: dict[str, str], reserved: set[str]
) -> None:
    """Renames aten nodes so that the ONNX values torch_lib creates get our names.

    torch_lib names each ONNX value after the aten node producing it. Nodes holding the
    value of a torch-level node take that node's name; all others keep theirs, made
    unique against the new names, except that a name of a torch-level node
    (``reserved``) is never reused for another value: tools matching ONNX values to
    graph nodes by name (``yobx.torch.inspect``) would compare unrelated values.
    """
    graph = graph_module.graph
    nodes = list(graph.nodes)
    wanted = {}
    for node in nodes:
        if node.op == "placeholder":
            continue
        source = node.meta.get(SOURCE_NODE_KEY)
        if source is not None and source not in wanted.values():
            wanted[node] = source
    # Node._rename keeps old names reserved in the graph's namespace, which would give
    # suffixed names (cos_1 for cos): the namespace is rebuilt, exact names first.
    namespace = torch.fx.graph._Namespace()
    graph._graph_namespace = namespace
    placeholders = [n for n in nodes if n.op == "placeholder"]
    others = [n for n in nodes if n.op != "placeholder" and n not in wanted]
    for node in placeholders:
        node.name = namespace.create_name(names[node.target], node)
    for node, name in wanted.items():
        node.name = namespace.create_name(name, node)
    for node in others:
        name = node.meta["_yobx_original_name"]
        node.name = namespace.create_name(f"{name}_aten" if name in reserved else name, node)


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    return getattr(target, "__name__", str(target))


def _error_node(
    exc: BaseException, lowered: LoweredGraph
) -> tuple[torch.fx.Node | None, torch.fx.Node | None]:
    """Finds the aten node named in torch.onnx's error and the torch-level node."""
    message = str(exc)
    match = re.search(r"translating node %?(\w+)", message) or re.search(r"%(\w+)", message)
    if match is None:
        return None, None
    name = match.group(1)
    for node in lowered.graph_module.graph.nodes:
        if node.name == name:
            return node, lowered.origins.get(node.meta.get("_yobx_aten_name", ""))
    return None, None


def sanitize_name(name: str) -> str:
    """Makes a readable identifier of a pytree key path such as ``['a'][0].key``."""
    name = re.sub(r"[^0-9A-Za-z_]+", "_", name).strip("_")
    return name or "output"


def _refuse_complex_inputs_and_outputs(lowered: LoweredGraph, output_names: Sequence[str]) -> None:
    """torch_lib computes complex tensors as float tensors with a trailing axis of 2
    (real, imaginary): fine inside the model, but an input or an output would silently
    change type and shape."""
    graph = lowered.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for name, node in zip(lowered.input_names, placeholders):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.is_complex():
            raise OnnxExportError(
                f"input {name!r} is a {value.dtype} tensor: ONNX models from torch_lib "
                f"cannot take complex inputs; pass torch.view_as_real(x) and rebuild "
                f"the complex tensor in the model with torch.view_as_complex"
            )
    output = next(n for n in graph.nodes if n.op == "output")
    flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    for name, arg in zip(output_names, flat):
        value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if isinstance(value, torch.Tensor) and value.is_complex():
            origin = lowered.origins.get(arg.name)
            raise OnnxExportError(
                f"output {name!r} is a {value.dtype} tensor: torch_lib represents complex "
                f"tensors as float tensors of shape (..., 2), which would silently change "
                f"the output; return torch.view_as_real(...) of it instead",
                origin,
            )


def build_model(
    lowered: LoweredGraph,
    output_names: Sequence[str],
    opset: int = DEFAULT_OPSET,
) -> ir.Model:
    """Builds the ONNX model of a lowered graph.

    :param lowered: the aten graph and the lifted state
    :param output_names: one name per flat output
    :param opset: ONNX opset torch_lib translates to
    :return: the model, not yet optimized
    """
    _refuse_complex_inputs_and_outputs(lowered, output_names)
    placeholders = _name_aten_nodes(lowered)
    model = ir.Model(
        graph=ir.Graph([], [], nodes=[], name="main_graph"),
        ir_version=10,
        producer_name="yobx",
        producer_version=__version__,
    )
    values = _translate_graphs(lowered, model, opset)
    _set_inputs_and_initializers(model.graph, lowered, placeholders, values)
    output_names = _set_outputs(model.graph, lowered.graph_module, values, output_names)
    _name_outputs(model.graph, output_names)
    internals.add_opset_imports(model)
    # onnxruntime refuses a scan of zero steps (a loop over an empty range)
    guard_empty_scans(model)
    return model


def _name_aten_nodes(lowered: LoweredGraph) -> list[torch.fx.Node]:
    """Names the placeholders after the inputs (``p_<name>`` for the lifted state) and
    the nodes after the torch-level graph, inserts the type promotions; returns the
    placeholders."""
    graph_module = lowered.graph_module
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    n_user = len(lowered.input_names)
    placeholder_names = {}
    for i, node in enumerate(placeholders):
        if i < n_user:
            placeholder_names[node.target] = lowered.input_names[i]
        else:
            placeholder_names[node.target] = "p_" + sanitize_name(lowered.state_names[i - n_user])
    for node in graph_module.graph.nodes:
        node.meta["_yobx_aten_name"] = node.name
        node.meta["_yobx_original_name"] = node.name
    torch_level_names = {n.name for n in lowered.origins.values()}
    _rename_aten_nodes(graph_module, placeholder_names, torch_level_names)
    internals.insert_type_promotion(graph_module)
    return placeholders


def _translate_graphs(lowered: LoweredGraph, model: ir.Model, opset: int) -> dict:
    """Translates the main graph and each subgraph (a local function) with torch_lib;
    returns the ONNX values of the main graph's nodes, by name.

    :raises UnsupportedOperatorError: an operator torch_lib has no translation for
    :raises OnnxExportError: any other translation failure, naming the user's line
    """
    graph_module = lowered.graph_module
    scoped: dict[str, dict[str, ir.Function]] = {}
    values = None
    module_name = ""
    try:
        for module_name, module in reversed(
            tuple(graph_module.named_modules(remove_duplicate=False))
        ):
            if not isinstance(module, torch.fx.GraphModule):
                continue
            owned = scoped.setdefault(module_name, {})
            if module_name == "":
                graph_like = model.graph
            else:
                function = ir.Function(
                    domain=internals.LOCAL_FUNCTION_DOMAIN,
                    name=module_name.replace(".", "__"),
                    graph=ir.Graph((), (), nodes=()),
                    attributes=(),
                )
                scope, _, sub_name = module_name.rpartition(".")
                scoped.setdefault(scope, {})[sub_name] = function
                model.functions[function.identifier()] = function
                graph_like = function
                dims = _dimensions_of(graph_module, module_name)
                if dims is not None:
                    function.meta[DIMENSIONS_KEY] = dims
            values = internals.translate_graph(
                module.graph, model, graph_like=graph_like, owned_graphs=owned, opset=opset
            )
    except internals.ConversionError as exc:
        aten_node, origin = _error_node(exc, lowered)
        cause: BaseException = exc
        while cause.__cause__ is not None:
            cause = cause.__cause__
        target = _target_name(aten_node) if aten_node is not None else "?"
        detail = f"{type(cause).__name__}: {cause}".splitlines()[0][:300]
        error_class = (
            UnsupportedOperatorError
            if isinstance(cause, internals.DispatchError)
            else OnnxExportError
        )
        where = f" in subgraph '{module_name}'" if module_name else ""
        message = f"no ONNX translation for operator '{target}'{where} ({detail})"
        if target in _IN_PLACE_WRITES:
            message += (
                ": the model writes in place into a tensor the passes could not prove "
                "to be its own or a view of an input at every size (a reshape of a "
                "tensor that is not contiguous is a view at some sizes, a copy at "
                "others); ONNX has no in-place writes. Write into a `.clone()` (or "
                "`.contiguous()`) of it, or into the input itself"
            )
        raise error_class(message, origin, target=target) from exc
    assert values is not None
    return values


def _dimensions_of(graph_module: torch.fx.GraphModule, module_name: str) -> Any:
    """The dimensions of the capture a subgraph belongs to: a version's graph (and any
    graph nested in it, a loop's body) was lowered with its own ShapeEnv, whose symbols
    (``s38``) are not the joined graph's; None for the joined graph's own."""
    parts = module_name.split(".")
    for end in range(len(parts), 0, -1):
        module = graph_module.get_submodule(".".join(parts[:end]))
        dims = getattr(module, "meta", {}).get(DIMENSIONS_KEY)
        if dims is not None:
            return dims
    return None


#: in-place writes the passes leave when they cannot tell what the target aliases
_IN_PLACE_WRITES = ("copy_", "index_put_", "fill_", "masked_fill_")


def _set_inputs_and_initializers(
    graph: ir.Graph, lowered: LoweredGraph, placeholders: list[torch.fx.Node], values: dict
) -> None:
    """The user's inputs stay inputs, the lifted state becomes initializers named after
    the state dict (translation registered every placeholder as an input)."""
    n_user = len(lowered.input_names)
    graph.inputs.clear()
    graph.outputs.clear()
    for i, node in enumerate(placeholders):
        value = values[node.name]
        if i < n_user:
            graph.inputs.append(value)
            continue
        qualified = lowered.state_names[i - n_user]
        tensor = lowered.state_values[i - n_user]
        if tensor.is_complex():
            # a complex buffer (rotary frequencies in polar form) is, as every complex
            # value of the graph, real in ONNX with a last axis of the two parts
            tensor = torch.view_as_real(tensor.resolve_conj())
        value.name = qualified
        value.const_value = internals.torch_tensor(tensor, qualified)
        graph.register_initializer(value)


def _set_outputs(
    graph: ir.Graph,
    graph_module: torch.fx.GraphModule,
    values: dict,
    output_names: Sequence[str],
) -> list[str]:
    """One output per flat output; ONNX needs distinct values that are not inputs.
    A ``None`` output (``nn.MultiheadAttention``'s weights with ``need_weights=False``)
    has no ONNX output, as in torch.onnx: returns the names of the outputs kept."""
    output_node = next(n for n in graph_module.graph.nodes if n.op == "output")
    flat = output_node.args[0]
    flat = flat if isinstance(flat, (list, tuple)) else [flat]
    if len(flat) != len(output_names):
        raise OnnxExportError(
            f"{len(flat)} outputs in the graph but {len(output_names)} output names"
        )
    used = set()
    kept = []
    for arg, name in zip(flat, output_names):
        if arg is None:
            continue
        if not isinstance(arg, torch.fx.Node):
            raise OnnxExportError(
                f"output '{name}' is a constant ({arg!r}), ONNX outputs must be computed"
            )
        value = values[arg.name]
        if isinstance(value, Sequence):
            raise OnnxExportError(f"output '{name}' is a sequence of tensors")
        if value.is_graph_input() or value.is_initializer() or id(value) in used:
            identity = ir.node("Identity", [value])
            graph.append(identity)
            identity.outputs[0].dtype = value.dtype
            identity.outputs[0].shape = value.shape
            value = identity.outputs[0]
        used.add(id(value))
        graph.outputs.append(value)
        kept.append(name)
    return kept


def _name_outputs(graph: ir.Graph, output_names: Sequence[str]) -> None:
    """Gives outputs their names, moving away any other value already named so. An
    output named like an input (a diffusers UNet takes ``sample`` and returns
    ``sample``) is ``<name>_output``: ONNX names each value once."""
    inputs = {value.name for value in graph.inputs}
    names: list[str] = []
    for name in output_names:
        if name in inputs:
            base, index = f"{name}_output", 2
            name = base
            while name in inputs or name in names or name in output_names:
                name, index = f"{base}_{index}", index + 1
        names.append(name)
    wanted = set(names)
    for node in graph:
        for value in node.outputs:
            if value.name in wanted and value not in graph.outputs:
                value.name = f"{value.name}__inner"
    for value, name in zip(graph.outputs, names):
        value.name = name
