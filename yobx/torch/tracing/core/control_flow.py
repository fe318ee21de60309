"""Control flow while tracing: ``torch.cond``, ``scan`` and ``torch.vmap``.

``torch.cond`` and ``scan`` become one node each (target :class:`CondCCOp` /
:class:`ScanCCOp`) whose branches / body are traced as subgraphs stored on the traced
model. ``torch.vmap`` is inlined: the function is traced per example, then batched with
functorch's own batching rules (``make_fx(torch.vmap(...))`` on the fake inputs), and
the batched ATen operations are spliced into the graph, so reductions and views over
per-example axes get their batched forms.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.fx.node import Node
from torch.fx.proxy import Proxy

from ..errors import TracingError, exception_summary
from ..graph_operators import CondCCOp, ScanCCOp
from .proxies import find_proxy

_ORIGINAL_VMAP = torch.vmap


def trace_subgraph(tracer, fn: Callable, inputs: list[Any], prefix: str):
    """Traces ``fn(*inputs)`` into a new graph with the same tracer.

    ``inputs`` are fake values (tensors, SymInts) or Python constants. Values of the
    enclosing graph that ``fn`` closes over become extra placeholders ("lifted").

    :return: (graph, lifted outer nodes in placeholder order, flat output vals,
        output spec)
    """
    graph = torch.fx.Graph(tracer_cls=type(tracer))
    with tracer.subgraph(graph) as lifted:
        args = []
        for i, value in enumerate(inputs):
            if isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
                node = graph.placeholder(f"{prefix}_arg{i}")
                node.meta["val"] = value
                args.append(tracer.proxy(node))
            else:
                args.append(value)
        out = fn(*args)
        flat, spec = pytree.tree_flatten(out)
        for value in flat:
            if not isinstance(value, Proxy):
                raise TracingError.at(
                    tracer.location(),
                    f"the traced function of {prefix} must return "
                    f"tensors, got {type(value).__name__}",
                )
        output = graph.output(tuple(tracer.create_arg(v) for v in flat))
        vals = [n.meta["val"] for n in output.args[0]]
    graph.lint()
    # a value of a graph enclosing the enclosing one (a vmap in a vmap closing over a
    # tensor of the model) is an input of the enclosing graph too
    lifted = [n if n.graph is tracer.graph else tracer._lift(n) for n in lifted]
    return graph, lifted, vals, spec


def _register_subgraph(tracer, graph: torch.fx.Graph, prefix: str) -> Node:
    return tracer.register_callable(f"_cb_{prefix}_{len(tracer.registered_callables)}", graph)


def _fake(value: Any) -> Any:
    return value.node.meta["val"] if isinstance(value, Proxy) else value


# torch.cond


def cond_function(original: Callable) -> Callable:
    """Replacement of ``torch.cond`` recording a :class:`CondCCOp` node on proxies."""

    @functools.wraps(original)
    def cond(pred, true_fn, false_fn, operands=()):
        proxy = find_proxy(pred, operands)
        if proxy is None:
            return original(pred, true_fn, false_fn, operands)
        tracer = proxy.tracer
        if isinstance(pred, bool):
            return (true_fn if pred else false_fn)(*operands)
        operands = tuple(operands)
        inputs = [_fake(o) if isinstance(o, Proxy) else o for o in operands]
        true_graph, true_lifted, true_vals, spec = trace_subgraph(
            tracer, true_fn, inputs, "cond_true"
        )
        false_graph, false_lifted, false_vals, false_spec = trace_subgraph(
            tracer, false_fn, inputs, "cond_false"
        )
        if spec != false_spec or len(true_vals) != len(false_vals):
            raise TracingError.at(
                tracer.location(),
                f"torch.cond branches return different structures ({spec} vs {false_spec})",
            )
        true_vals = _contiguous_data_dependent_outputs(tracer, true_graph, true_vals)
        false_vals = _contiguous_data_dependent_outputs(tracer, false_graph, false_vals)
        merged = [
            _merge_branch_outputs(tracer, a, b, i)
            for i, (a, b) in enumerate(zip(true_vals, false_vals))
        ]
        # Both branches take the same operands: the union of what each lifted.
        lifted = list(dict.fromkeys(true_lifted + false_lifted))
        _align_lifted(true_graph, true_lifted, lifted)
        _align_lifted(false_graph, false_lifted, lifted)
        true_node = _register_subgraph(tracer, true_graph, "cond_true")
        false_node = _register_subgraph(tracer, false_graph, "cond_false")
        args = (
            tracer.create_arg(pred),
            true_node,
            false_node,
            tuple(tracer.create_arg(o) for o in operands) + tuple(lifted),
        )
        node = tracer.create_node("call_function", CondCCOp(), args, {}, name="cond")
        node.meta["stack_trace"] = tracer.stack_trace()
        outputs = _outputs(tracer, node, merged, spec)
        tracer.bind_unbacked(node, node.meta["val"])
        return outputs

    return cond


def _contiguous_data_dependent_outputs(tracer, graph: torch.fx.Graph, vals: list) -> list:
    """Makes contiguous the branch outputs whose strides depend on the data
    (``nonzero`` returns ``(n, d)`` with strides ``(1, n)``): torch.cond merges the
    branches' strides by comparing them with 0 and 1, which has no answer for a
    data-dependent ``n``."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    results = list(output.args[0])
    new_vals = list(vals)
    for i, val in enumerate(vals):
        if not isinstance(val, torch.Tensor) or not free_unbacked_symbols(val.stride()):
            continue
        with graph.inserting_before(output):
            node = graph.call_method("contiguous", (results[i],))
        with tracer.fake_mode:
            node.meta["val"] = new_vals[i] = val.contiguous()
        node.meta["stack_trace"] = results[i].meta.get("stack_trace", "")
        results[i] = node
    output.args = (tuple(results),)
    return new_vals


def _merge_branch_outputs(tracer, a: Any, b: Any, index: int) -> Any:
    """The value of the cond's output ``index``: the branches' common value, or, when
    their sizes depend on the data (``x[mask]`` in a branch), a value whose differing
    sizes are new data-dependent symbols, as torch.cond's own fake kernel does."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    if (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype
        and a.dim() == b.dim()
        and (free_unbacked_symbols(a) or free_unbacked_symbols(b))
    ):
        from torch._higher_order_ops.cond import _merge_output

        return _merge_output(a, b, tracer.fake_mode)
    _check_same_metadata(tracer, a, b, index)
    return a


def _check_same_metadata(tracer, a: Any, b: Any, index: int) -> None:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = a.dtype == b.dtype and a.dim() == b.dim()
        if same:
            for da, db in zip(a.shape, b.shape):
                equal = da == db
                if equal is True or (
                    isinstance(equal, torch.SymBool) and tracer.dims.decide(equal) is True
                ):
                    continue
                same = False
        if not same:
            raise TracingError.at(
                tracer.location(),
                f"torch.cond branches return output {index} with "
                f"different dtypes or shapes: {a.dtype}{tuple(a.shape)} vs "
                f"{b.dtype}{tuple(b.shape)}",
            )


def _align_lifted(graph: torch.fx.Graph, own: list[Node], union: list[Node]) -> None:
    """Gives a branch one placeholder per value of ``union``, in that order.

    Both branches of a cond receive the same operands, so a value lifted by one branch
    only is an unused input of the other.
    """
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    lifted_placeholders = placeholders[len(placeholders) - len(own) :]
    by_outer = dict(zip(own, lifted_placeholders))
    first_non_placeholder = next(n for n in graph.nodes if n.op != "placeholder")
    for outer in union:
        placeholder = by_outer.get(outer)
        if placeholder is None:
            with graph.inserting_before(first_non_placeholder):
                placeholder = graph.placeholder(f"lifted_{outer.name}")
            placeholder.meta["val"] = outer.meta.get("val")
        # prepend moves the node: the lifted placeholders end up in union order
        first_non_placeholder.prepend(placeholder)


def _outputs(tracer, node: Node, vals: list[Any], spec) -> Any:
    """Sets the node's value to the tuple of outputs; returns proxies shaped by spec."""
    node.meta["val"] = tuple(vals)
    proxies = []
    for i, val in enumerate(vals):
        item = tracer.graph.call_function(operator.getitem, (node, i))
        item.meta["val"] = val
        item.meta["stack_trace"] = node.meta.get("stack_trace", "")
        proxies.append(tracer.proxy(item))
    return pytree.tree_unflatten(proxies, spec)


# scan


def scan_function(original: Callable) -> Callable:
    """Replacement of ``torch.ops.higher_order.scan`` recording a :class:`ScanCCOp`."""

    @functools.wraps(original)
    def scan(combine_fn, init, xs, additional_inputs=()):
        proxy = find_proxy(init, xs, additional_inputs)
        if proxy is None:
            return original(combine_fn, init, xs, additional_inputs)
        tracer = proxy.tracer
        init, xs, additional_inputs = list(init), list(xs), list(additional_inputs)
        with tracer.fake_mode:
            xs_slices = [_fake(x).select(0, 0) for x in xs]
        inputs = [_fake(v) for v in init] + xs_slices + [_fake(a) for a in additional_inputs]
        graph, lifted, vals, _ = trace_subgraph(
            tracer, lambda *a: tuple(combine_fn(*a)), inputs, "scan"
        )
        n_carry = len(init)
        if len(vals) < n_carry:
            raise TracingError.at(
                tracer.location(),
                f"the scan body returns {len(vals)} values but {n_carry} carries are needed",
            )
        length = _fake(xs[0]).shape[0] if xs else None
        with tracer.fake_mode:
            out_vals = list(vals[:n_carry]) + [
                torch.empty((length, *v.shape), dtype=v.dtype, device=v.device)
                for v in vals[n_carry:]
            ]
        body = _register_subgraph(tracer, graph, "scan")
        args = (
            body,
            [tracer.create_arg(v) for v in init],
            [tracer.create_arg(v) for v in xs],
            [tracer.create_arg(v) for v in additional_inputs] + lifted,
        )
        node = tracer.create_node("call_function", ScanCCOp(), args, {}, name="scan")
        node.meta["stack_trace"] = tracer.stack_trace()
        return tuple(_outputs(tracer, node, out_vals, pytree.tree_flatten(tuple(out_vals))[1]))

    return scan


# vmap


def vmap_function(original: Callable) -> Callable:
    """Replacement of ``torch.vmap`` that inlines the batched computation on proxies."""

    @functools.wraps(original)
    def vmap(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None):
        batched_eager = original(
            func, in_dims, out_dims, randomness=randomness, chunk_size=chunk_size
        )

        @functools.wraps(func)
        def call(*args, **kwargs):
            proxy = find_proxy(args, kwargs)
            if proxy is None:
                return batched_eager(*args, **kwargs)
            if kwargs:
                raise TracingError.at(
                    proxy.tracer.location(),
                    "keyword arguments to a vmapped function "
                    "are not supported while tracing; pass them positionally",
                )
            return _trace_vmap(proxy.tracer, func, in_dims, out_dims, randomness, args)

        return call

    return vmap


def _trace_vmap(tracer, func, in_dims, out_dims, randomness, args):
    from torch.fx.experimental.proxy_tensor import make_fx

    flat_args, args_spec = pytree.tree_flatten(args)
    flat_in_dims = _broadcast_in_dims(in_dims, args, len(flat_args), tracer.location())
    # Real tensors become graph constants so that every tensor input is a node.
    nodes = [
        tracer.create_arg(a) if isinstance(a, torch.Tensor) and not isinstance(a, Proxy) else a
        for a in flat_args
    ]
    values = [
        n.meta["val"]
        if isinstance(n, Node)
        else (n.node.meta["val"] if isinstance(n, Proxy) else n)
        for n in nodes
    ]
    with tracer.fake_mode:
        per_example = [
            v.select(d, 0) if d is not None and isinstance(v, torch.Tensor) else v
            for v, d in zip(values, flat_in_dims)
        ]
    graph, lifted, _, out_spec = trace_subgraph(
        tracer,
        lambda *flat: func(*pytree.tree_unflatten(list(flat), args_spec)),
        per_example,
        "vmap",
    )
    # Parameters read inside become explicit, unbatched inputs of the function.
    extra_outer: list[Node] = list(lifted)
    first = next(n for n in graph.nodes if n.op != "placeholder")
    for node in list(graph.nodes):
        if node.op == "get_attr":
            with graph.inserting_before(first):
                ph = graph.placeholder(f"attr_{node.name}")
            ph.meta["val"] = node.meta.get("val")
            node.replace_all_uses_with(ph)
            graph.erase_node(node)
            extra_outer.append(tracer.graph.get_attr(node.target))
            extra_outer[-1].meta["val"] = ph.meta["val"]
    tensor_inputs = [
        i
        for i, v in enumerate(per_example)
        if isinstance(v, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool))
    ]
    graph.lint()
    per_example_module = torch.fx.GraphModule(torch.nn.Module(), graph)
    n_extra = len(extra_outer)
    body_in_dims = tuple(flat_in_dims[i] for i in tensor_inputs) + (None,) * n_extra

    def body(*flat):
        return per_example_module(*flat)

    batched_inputs = [values[i] for i in tensor_inputs] + [n.meta["val"] for n in extra_outer]
    flat_out_dims = _flat_out_dims(out_dims, out_spec, tracer.location())
    try:
        batched = make_fx(
            _ORIGINAL_VMAP(
                body,
                in_dims=body_in_dims,
                out_dims=flat_out_dims,
                randomness=randomness,
            )
        )(*batched_inputs)
    except Exception as e:
        raise TracingError.at(
            tracer.location(),
            f"torch.vmap could not batch the traced function: {exception_summary(e)}",
        ) from e
    outer_inputs = [
        nodes[i] if isinstance(nodes[i], Node) else nodes[i].node for i in tensor_inputs
    ] + extra_outer
    return _inline(tracer, batched, outer_inputs, out_spec)


def _broadcast_in_dims(in_dims, args, n_flat: int, location: str) -> list:
    if isinstance(in_dims, int) or in_dims is None:
        return [in_dims] * n_flat
    if not isinstance(in_dims, (tuple, list)) or len(in_dims) != len(args):
        raise TracingError.at(
            location,
            f"vmap in_dims={in_dims!r} must be an int, None, or have one entry per argument "
            f"({len(args)})",
        )
    result = []
    for d, a in zip(in_dims, args):
        n = len(pytree.tree_leaves(a))
        if isinstance(d, int) or d is None:
            result.extend([d] * n)
        else:
            flat_d = pytree.tree_leaves(d, is_leaf=lambda x: x is None)
            if len(flat_d) != n:
                raise TracingError.at(
                    location, f"vmap in_dims entry {d!r} does not match argument structure"
                )
            result.extend(flat_d)
    return result


def _flat_out_dims(out_dims, out_spec, location: str):
    if isinstance(out_dims, int):
        return out_dims
    flat = pytree.tree_leaves(out_dims, is_leaf=lambda x: x is None)
    if len(flat) != out_spec.num_leaves:
        raise TracingError.at(location, f"vmap out_dims={out_dims!r} does not match the outputs")
    return tuple(flat)


def _inline(tracer, batched: torch.fx.GraphModule, outer_inputs: list[Node], out_spec):
    """Copies the batched ATen graph into the traced graph; returns output proxies."""
    stack_trace = tracer.stack_trace()
    for node in batched.graph.nodes:
        if node.op == "get_attr":
            value = getattr(batched, node.target)
            node.target = tracer.add_constant(value)
    for node in batched.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.sym_size.int:
            # x.size(d) has a batching rule (aten.sym_size.int has none): an inlined
            # vmap stays batchable by an enclosing vmap.
            node.op, node.target = "call_method", "size"
    placeholders = [n for n in batched.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(outer_inputs):
        raise TracingError.at(
            tracer.location(),
            f"internal error while inlining vmap "
            f"({len(placeholders)} inputs vs {len(outer_inputs)})",
        )
    val_map = dict(zip(placeholders, outer_inputs))
    before = set(tracer.graph.nodes)
    out = tracer.graph.graph_copy(batched.graph, val_map)
    for node in tracer.graph.nodes:
        if node not in before:
            node.meta.setdefault("stack_trace", stack_trace)
            if node.op == "get_attr":
                node.meta["val"] = tracer.dims.from_real(tracer.constant(node.target))
    flat = pytree.tree_leaves(out)
    proxies = [tracer.proxy(n) if isinstance(n, Node) else n for n in flat]
    return pytree.tree_unflatten(proxies, out_spec)


__all__ = ["CondCCOp", "ScanCCOp", "trace_subgraph"]
