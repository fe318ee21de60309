"""Replaces the per-example regions ``torch.vmap`` leaves in exported graphs by batched code.

``torch.export.export`` of a model calling ``torch.vmap`` produces::

    _vmap_increment_nesting(batch_size, randomness)
    a = _add_batch_dim(x, in_dim, level)
    ... operations written for one example (``a`` has the per-example shape) ...
    y = _remove_batch_dim(r, level, batch_size, out_dim)
    _vmap_decrement_nesting()

Moving the batch dimension around is not enough: the operations in between reduce, view
or multiply over per-example axes. The pass extracts each region as a function, re-traces
``torch.vmap(region, in_dims, out_dims)`` with ``make_fx`` on the fake values recorded in
``meta["val"]`` (same fake mode and ShapeEnv, so dynamic dimensions stay symbolic) and
splices the batched graph in place of the region, letting functorch's batching rules do
the work. Nested vmaps are processed from the innermost one outwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Graph, Node
from torch.fx.node import map_arg

from ._targets import copy_node, example_value, recompile_owner
from .aliasing import has_side_effect
from .erase import graph_erase_node
from .result import PassResult

_FUNCTORCH_MODULES = ("torch._functorch", "torch._C._functorch", "torch.func")


def _functorch_name(node: Node) -> str | None:
    """Returns the name of a functorch bookkeeping function called by a node, or None."""
    if node.op != "call_function":
        return None
    name = getattr(node.target, "__name__", None)
    module = getattr(node.target, "__module__", None) or ""
    if name not in (
        "_add_batch_dim",
        "_remove_batch_dim",
        "_vmap_increment_nesting",
        "_vmap_decrement_nesting",
        "lazy_load_decompositions",
    ):
        return None
    if module.startswith(_FUNCTORCH_MODULES) or module == "":
        return name
    return None


class BatchDimRemovalError(RuntimeError):
    """Raised when a vmap region cannot be rewritten into batched code."""


@dataclass(eq=False)
class _Span:
    """Nodes of one ``torch.vmap`` call."""

    depth: int
    randomness: str = "error"
    adds: list[Node] = field(default_factory=list)
    removes: list[Node] = field(default_factory=list)
    bookkeeping: list[Node] = field(default_factory=list)


def _collect_spans(graph: Graph) -> tuple[list[_Span], int]:
    """Groups the functorch nodes by vmap call, returns the groups and the erased nodes."""
    spans: list[_Span] = []
    stack: list[_Span] = []
    by_level: dict[Any, _Span] = {}
    pending_lazy: list[Node] = []
    for node in graph.nodes:
        name = _functorch_name(node)
        if name is None:
            continue
        if name == "lazy_load_decompositions":
            pending_lazy.append(node)
        elif name == "_vmap_increment_nesting":
            randomness = node.args[1] if len(node.args) > 1 else "error"
            span = _Span(len(stack), randomness, bookkeeping=[*pending_lazy, node])
            pending_lazy = []
            stack.append(span)
            spans.append(span)
        elif name == "_vmap_decrement_nesting":
            if not stack:
                raise BatchDimRemovalError(f"{node.name!r} closes a vmap which was not opened")
            stack.pop().bookkeeping.append(node)
        else:
            level = node.args[2] if name == "_add_batch_dim" else node.args[1]
            if stack:
                span = stack[-1]
            else:
                # graphs without the nesting calls: group by level, higher levels are inner
                if level not in by_level:
                    by_level[level] = _Span(level if isinstance(level, int) else 0)
                    spans.append(by_level[level])
                span = by_level[level]
            (span.adds if name == "_add_batch_dim" else span.removes).append(node)
    for node in pending_lazy:
        graph.erase_node(node)
    return spans, len(pending_lazy)


def _region(span: _Span) -> tuple[list[Node], list[Node], set[Node]]:
    """Returns the nodes computed per example (in graph order), the free inputs and the
    nodes depending on a batched value without contributing to any output."""
    removes = set(span.removes)
    forward: set[Node] = set(span.adds)
    stack = list(span.adds)
    while stack:
        for user in stack.pop().users:
            if user not in forward and user not in removes:
                forward.add(user)
                stack.append(user)
    needed: set[Node] = set()
    stack = [r.args[0] for r in span.removes if isinstance(r.args[0], Node)]
    while stack:
        node = stack.pop()
        if node in needed or node not in forward:
            continue
        needed.add(node)
        stack.extend(node.all_input_nodes)
    useless = forward - needed - set(span.adds)
    for node in useless:
        if any(u not in forward for u in node.users):
            raise BatchDimRemovalError(
                f"node {node.name!r} depends on a batched value but is used outside the vmap"
            )
    # adds precede every node of the region and the removes follow it
    first = (span.adds or span.removes)[0]
    ordered: list[Node] = []
    free: list[Node] = []
    seen_free: set[Node] = set()
    node = first
    remaining = len(span.removes)
    while remaining:
        if node in needed and node not in span.adds:
            ordered.append(node)
            for arg in node.all_input_nodes:
                if arg not in needed and arg not in span.adds and arg not in seen_free:
                    seen_free.add(arg)
                    free.append(arg)
        if node in removes:
            remaining -= 1
            arg = node.args[0]
            if (
                isinstance(arg, Node)
                and arg not in needed
                and arg not in span.adds
                and arg not in seen_free
            ):
                seen_free.add(arg)
                free.append(arg)
        node = node.next
    return ordered, free, useless


_SIZE_QUERIES = {
    torch.ops.aten.sym_size.int: "size",
    torch.ops.aten.sym_stride.int: "stride",
    torch.ops.aten.sym_numel.default: "numel",
    torch.ops.aten.sym_storage_offset.default: "storage_offset",
}


def _run_node(node: Node, env: dict[Node, Any]) -> Any:
    args = map_arg(node.args, env.__getitem__)
    kwargs = map_arg(node.kwargs, env.__getitem__)
    if node.op == "call_function":
        if node.target in _SIZE_QUERIES:
            # functorch batches the Python size queries, not their aten overloads
            return getattr(args[0], _SIZE_QUERIES[node.target])(*args[1:])
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        return getattr(args[0], node.target)(*args[1:], **kwargs)
    if node.op == "call_module":
        return node.graph.owning_module.get_submodule(node.target)(*args, **kwargs)
    if node.op == "get_attr":
        value: Any = node.graph.owning_module
        for part in node.target.split("."):
            value = getattr(value, part)
        return value
    raise BatchDimRemovalError(f"unexpected node {node.name!r} ({node.op}) in a vmap region")


def _value_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        shape = tuple(str(s) for s in value.shape)
        stride = tuple(str(s) for s in value.stride())
        return ("tensor", shape, stride, value.dtype, str(value.device))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("symbol", str(value))
    hash(value)
    return value


def _region_key(span: _Span, region: list[Node], free: list[Node], values: list) -> Any:
    """What the batched graph of a region depends on, None if it cannot be hashed.

    Two regions with the same key (same operations on inputs of the same symbolic
    shapes, same in/out dims) have the same batched graph: it is traced once.
    """
    index: dict[Node, tuple] = {n: ("add", i) for i, n in enumerate(span.adds)}
    index.update({n: ("free", i) for i, n in enumerate(free)})
    index.update({n: ("node", i) for i, n in enumerate(region)})

    def encode(value: Any) -> Any:
        if isinstance(value, Node):
            return index[value]
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, tuple(encode(v) for v in value))
        if isinstance(value, dict):
            return ("dict", tuple((k, encode(v)) for k, v in sorted(value.items())))
        if isinstance(value, slice):
            return ("slice", encode(value.start), encode(value.stop), encode(value.step))
        return _value_key(value)

    try:
        return (
            tuple((n.op, n.target, encode(n.args), encode(n.kwargs)) for n in region),
            tuple(encode(r.args[0]) for r in span.removes),
            tuple(_value_key(v) for v in values),
            tuple(encode(a.args[1]) for a in span.adds),
            tuple(encode(r.args[3]) for r in span.removes),
            span.randomness,
        )
    except (TypeError, KeyError):
        return None


def _batched_graph(
    span: _Span, region: list[Node], free: list[Node], cache: dict[Any, torch.fx.GraphModule]
) -> torch.fx.GraphModule:
    inputs = [a.args[0] for a in span.adds] + free
    values = [example_value(n) for n in inputs]
    missing = [n.name for n, v in zip(inputs, values) if v is None and isinstance(n, Node)]
    if missing:
        raise BatchDimRemovalError(
            f"nodes {missing} have no meta['val']; the vmap region cannot be re-traced"
        )
    key = _region_key(span, region, free, values)
    traced = cache.get(key) if key is not None else None
    if traced is None:
        traced = _trace_batched(span, region, free, inputs, values)
        if key is not None:
            cache[key] = traced
    return traced


def _trace_batched(
    span: _Span, region: list[Node], free: list[Node], inputs: list[Node], values: list
) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    adds, removes = span.adds, span.removes

    def per_example(*args: Any) -> tuple:
        env: dict[Node, Any] = dict(zip(adds, args[: len(adds)]))
        env.update(zip(free, args[len(adds) :]))
        for node in region:
            env[node] = _run_node(node, env)
        return tuple(env[r.args[0]] for r in removes)

    in_dims = tuple(a.args[1] for a in adds) + (None,) * len(free)
    out_dims = tuple(r.args[3] for r in removes)
    batched = torch.vmap(per_example, in_dims, out_dims, randomness=span.randomness)
    fake_mode = _fake_mode(inputs, values)
    mode = "symbolic" if fake_mode.shape_env is not None else "fake"
    with fake_mode:
        # values inside an enclosing vmap region are functorch wrappers of a dead level:
        # fresh fake tensors with the same (symbolic) sizes and strides replace them
        values = [
            torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
            if isinstance(v, torch.Tensor)
            else v
            for v in values
        ]
        traced = make_fx(batched, tracing_mode=mode)(*values)
    traced.graph.eliminate_dead_code()
    return traced


def _fake_mode(inputs: list[Node], values: list[Any]) -> Any:
    """Finds the fake mode of the graph (the one of its placeholders if needed)."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    candidates = [v for v in values if isinstance(v, FakeTensor)]
    if not candidates:
        graph = inputs[0].graph
        candidates = [
            example_value(n)
            for n in graph.find_nodes(op="placeholder")
            if isinstance(example_value(n), FakeTensor)
        ]
    mode = detect_fake_mode(candidates) if candidates else None
    return mode if mode is not None else FakeTensorMode()


def _splice(graph: Graph, span: _Span, traced: torch.fx.GraphModule, free: list[Node]) -> None:
    inputs = [a.args[0] for a in span.adds] + free
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    env: dict[Node, Any] = dict(zip(placeholders, inputs))
    owner = graph.owning_module
    first_remove = span.removes[0]
    outputs: Any = None
    with graph.inserting_before(first_remove):
        for node in traced.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                outputs = map_arg(node.args[0], env.__getitem__)
                continue
            if node.op == "get_attr":
                if owner is None:
                    raise BatchDimRemovalError("the batched region needs a constant tensor")
                value = getattr(traced, node.target)
                name = _fresh_attribute(owner, node.target)
                if isinstance(value, torch.Tensor):
                    owner.register_buffer(name, value)
                else:
                    setattr(owner, name, value)
                env[node] = graph.get_attr(name)
                env[node].meta.update(node.meta)
                continue
            env[node] = copy_node(graph, node, env.__getitem__)
    for remove, new in zip(span.removes, outputs):
        remove.replace_all_uses_with(new)


def _erase(graph: Graph, node: Node) -> None:
    if node.users:
        users = ", ".join(u.name for u in node.users)
        raise BatchDimRemovalError(f"node {node.name!r} of a vmap region is used by {users}")
    graph.erase_node(node)


def _fresh_attribute(owner: torch.nn.Module, base: str) -> str:
    index = 0
    while hasattr(owner, f"_yobx_vmap{base}_{index}"):
        index += 1
    return f"_yobx_vmap{base}_{index}"


def remove_batch_dim_nodes(graph: Graph, verbose: int = 0) -> PassResult:
    """Rewrites the vmap regions of a graph (``_add_batch_dim`` ... ``_remove_batch_dim``).

    Each region is re-traced with ``make_fx(torch.vmap(region, in_dims, out_dims))`` on the
    fake values of its inputs and replaced by the batched graph, so that the result runs
    without functorch and computes the same values. The bookkeeping nodes
    (``_vmap_increment_nesting``, ``_vmap_decrement_nesting``,
    ``lazy_load_decompositions``) are removed. Nodes must carry ``meta["val"]`` (graphs
    from ``torch.export`` do).

    :param graph: graph to modify in place
    :param verbose: verbosity
    :return: the number of removed nodes (a :class:`PassResult`)
    :raises BatchDimRemovalError: a region that cannot be rewritten into batched code

    Example (the vmap region of a ``torch.export`` graph becomes batched operators)::

        >>> import torch
        >>> from yobx.torch.passes import remove_batch_dim_nodes
        >>> class Model(torch.nn.Module):
        ...     def forward(self, x, y):
        ...         return torch.vmap(lambda a, b: a * b.sum())(x, y)
        >>> x, y = torch.randn(3, 4), torch.randn(3, 2)
        >>> ep = torch.export.export(Model(), (x, y))
        >>> remove_batch_dim_nodes(ep.graph_module.graph).count > 0
        True
        >>> torch.allclose(ep.module()(x, y), Model()(x, y))
        True
    """
    spans, removed = _collect_spans(graph)
    cache: dict[Any, torch.fx.GraphModule] = {}
    for span in sorted(spans, key=lambda s: -s.depth):
        if not span.removes:
            raise BatchDimRemovalError("a vmap region has no _remove_batch_dim node")
        region, free, useless = _region(span)
        # sizes computed only for the bookkeeping nodes die with them
        bookkeeping_inputs = {
            i for n in [*span.removes, *span.bookkeeping] for i in n.all_input_nodes
        }
        traced = _batched_graph(span, region, free, cache)
        _splice(graph, span, traced, free)
        for node in [*span.removes, *reversed(region)]:
            _erase(graph, node)
        while useless:
            dead = [n for n in useless if not n.users]
            if not dead:
                raise BatchDimRemovalError(f"nodes {sorted(n.name for n in useless)} are used")
            for node in dead:
                _erase(graph, node)
                useless.discard(node)
        for node in [*span.adds, *span.bookkeeping]:
            _erase(graph, node)
        for node in bookkeeping_inputs:
            if (
                not getattr(node, "_erased", False)
                and not node.users
                and node.op != "placeholder"
                and not has_side_effect(node)
            ):
                removed += graph_erase_node(graph, node)
        removed += len(span.removes) + len(region) + len(span.adds) + len(span.bookkeeping)
        if verbose:
            print(
                f"[remove_batch_dim_nodes] replaced a vmap region of {len(region)} node(s) "
                f"by {len(traced.graph.nodes)} batched node(s)"
            )
    if spans or removed:
        # (an unchanged graph is as well-formed as it was: most graphs have no vmap)
        graph.lint()
    recompile_owner(graph)
    return PassResult("remove_batch_dim_nodes", removed)
