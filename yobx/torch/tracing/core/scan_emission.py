"""How a planned loop region becomes a scan (see :mod:`.loop_rolling` for the plan).

:func:`emit_scan` writes the scan at the end of the trace: a body graph made from the
second step's nodes (:class:`_BodyBuilder`), a :class:`~..graph_operators.ScanCCOp`
over the loop's symbolic length with the tensors it scans, cut to the loop's steps
(:class:`_Emitter`), and the scan's outputs in place of the last step's carried values,
of the stacked per-step values and of the steps' writes; the unrolled steps are then
erased.
"""

from __future__ import annotations

import operator
from typing import Any, cast

import torch
from torch.fx.node import Node, map_arg

from ..errors import TracingError
from ..graph_operators import ScanCCOp
from .loop_rolling import ScanPlan, StepWrite, is_size
from .loops import LoopRegion, loop_index


def _hoisted(graph: torch.fx.Graph, node: Node, operands: Any, copies: dict) -> Node:
    """The copy, in ``graph`` at the insertion point, of an invariant node of a step
    (see :func:`_invariant`) and of the nodes of the step it reads."""
    if operands.where.get(node) is None:
        return node
    if node not in copies:
        copy = graph.node_copy(node, lambda n: _hoisted(graph, n, operands, copies))
        copy.meta.update(node.meta)
        copies[node] = copy
    return copies[node]


class _BodyBuilder:
    """Builds the scan's body graph from the second step's nodes."""

    def __init__(self, plan: ScanPlan, template: int, index: Node):
        self.plan = plan
        self.template = template
        self.index = index
        self.nodes = plan.steps[template]
        self.local = {n: p for p, n in enumerate(self.nodes)}
        #: the values computed from the index (``i + 1``) that the tensor operations
        #: taking it as a number read: the body computes them from its index
        self.numbered = self._numbered()
        self.previous = {n: p for p, n in enumerate(plan.steps[template - 1])}
        self.graph = torch.fx.Graph()
        self.env: dict[Node, Node] = {}
        self.sizes: dict[tuple, Node] = {}
        self.carry_order = sorted(plan.carries)
        self.sources: list[tuple[Node, int, int]] = []
        for position in sorted(plan.selections):
            source, axis, _, offset = plan.selections[position]
            if (source, axis, offset) not in self.sources:
                self.sources.append((source, axis, offset))
        self.additional: list[Node] = []
        #: positions of the nodes only hoisted sources of selections need (computed
        #: once before the scan: the body does without them)
        self.hoisted: set[int] = set()
        for position in reversed(range(len(self.nodes))):
            users = self.nodes[position].users
            if (
                position not in plan.carries
                and users
                and all(
                    self.local.get(u) in plan.selections or self.local.get(u) in self.hoisted
                    for u in users
                )
            ):
                self.hoisted.add(position)

    def _numbered(self) -> set[int]:
        found: set[int] = set()
        pending = [n for p in self.plan.numbers for n in self.nodes[p].all_input_nodes]
        while pending:
            position = self.local.get(pending.pop())
            if position in self.plan.index_values and position not in found:
                found.add(position)
                pending.extend(self.nodes[position].all_input_nodes)
        return found

    def collect(self) -> None:
        """First pass: the values from before the loop the body reads."""
        for position, node in enumerate(self.nodes):
            if position in self.plan.selections or position in self.plan.writes:
                continue
            if position in self.plan.index_values and position not in self.numbered:
                continue
            if position in self.hoisted:
                continue
            map_arg((node.args, node.kwargs), self._collect)

    def _collect(self, node: Node) -> Node:
        if node in self.local or node in self.previous:
            return node
        if is_size(node):
            # a size's first argument is the tensor's node
            return self._collect(cast(Node, node.args[0]))
        if node.target is loop_index:
            return node
        if node not in self.additional:
            self.additional.append(node)
        return node

    def build(self, fake_mode, outputs: list[int], written: list[Node]) -> torch.fx.Graph:
        """The body: carried values, the slices of the scanned tensors, the values from
        before the loop; it returns the new carried values, the values of
        ``outputs`` (positions) and the ``written`` values."""
        graph = self.graph
        self.carry_inputs = {}
        for c, position in enumerate(self.carry_order):
            ph = graph.placeholder(f"carry_{c}")
            ph.meta["val"] = self.plan.carries[position].meta["val"]
            self.carry_inputs[position] = ph
        self.slices = {}
        for j, (source, axis, offset) in enumerate(self.sources):
            ph = graph.placeholder(f"xs_{j}")
            with fake_mode:
                ph.meta["val"] = source.meta["val"].select(axis, 0).contiguous()
            self.slices[(source, axis, offset)] = ph
        if self.plan.numbers:
            # the index, scanned (see _Emitter.indices): a 0-d int64 tensor
            self.index_input = graph.placeholder("index")
            with fake_mode:
                self.index_input.meta["val"] = torch.empty((), dtype=torch.int64)
        elif not self.sources:
            # a scan runs as many steps as what it scans is long: a loop that reads no
            # slice scans its steps' numbers (see _Emitter.steps), which the body ignores
            ph = graph.placeholder("step")
            with fake_mode:
                ph.meta["val"] = torch.empty((), dtype=torch.int64)
        self.lifted = {}
        for j, outer in enumerate(self.additional):
            ph = graph.placeholder(f"in_{j}")
            ph.meta["val"] = outer.meta.get("val")
            self.lifted[outer] = ph
        skipped = {*self.plan.writes, *self.hoisted, *self.plan.index_values} - self.numbered
        for position, node in enumerate(self.nodes):
            if position not in skipped:
                self.env[node] = self._copy(position, node)
            if position in self.numbered:
                # a number in the step, a 0-d tensor in the body: an integer one from
                # the index, a float one in the default dtype (`i * 0.5`, `i / 2`)
                integral = isinstance(node.meta.get("val"), (int, torch.SymInt))
                dtype = torch.int64 if integral else torch.get_default_dtype()
                with fake_mode:
                    self.env[node].meta["val"] = torch.empty((), dtype=dtype)
        results = [self.env[self.nodes[p]] for p in self.carry_order]
        results += [self.env[self.nodes[p]] for p in outputs]
        # a value the step computes, or the carried one it received
        results += [self._value(n) for n in written]
        graph.output(tuple(results))
        graph.lint()
        return graph

    def _copy(self, position: int, node: Node) -> Node:
        selection = self.plan.selections.get(position)
        if selection is None:
            return self.graph.node_copy(node, self._value)
        source, axis, rest, offset = selection
        value = self.slices[(source, axis, offset)]
        if rest == "narrow":
            value = self.graph.call_method("unsqueeze", (value, axis))
        elif rest is not None:
            value = self.graph.call_function(operator.getitem, (value, rest))
        value.meta.update(node.meta)
        return value

    def _value(self, node: Node) -> Node:
        if node is self.index:
            return self.index_input
        if node in self.local:
            return self.env[node]
        if node in self.previous:
            return self.carry_inputs[self.previous[node]]
        if is_size(node):
            key = (node.args[0], node.args[1])
            if key not in self.sizes:
                tensor = cast(Node, node.args[0])  # a size's first argument: the tensor's node
                size = self.graph.call_method("size", (self._value(tensor), node.args[1]))
                size.meta.update(node.meta)
                self.sizes[key] = size
            return self.sizes[key]
        return self.lifted[node]


def emit_scan(tracer: Any, region: LoopRegion) -> None:
    """Replaces the region's steps with a scan (the plan must be complete: every use
    after the region is one :func:`outside_use_refusal` accepts)."""
    plan, graph = region.plan, region.graph
    # a stacked node's arguments: (values, position in the step, dim, how)
    positions: list[int] = []
    for node in region.stacked:
        if node.args[1] not in positions:
            positions.append(cast(int, node.args[1]))
    if not plan.carries and not positions and not plan.writes:
        # nothing the loop computes is used
        _erase_steps(graph, region)
        return
    builder = _BodyBuilder(plan, template=1, index=region.index_nodes[1])
    builder.collect()
    writes = sorted(plan.writes)
    body = builder.build(tracer.fake_mode, positions, [plan.writes[p].value for p in writes])
    emitter = _Emitter(tracer, region)
    assert region.last is not None, "a closed region has a last node"
    with graph.inserting_before(region.last.next):
        copies: dict[Node, Node] = {}
        xs = [
            emitter.scanned(_hoisted(graph, source, plan.operands, copies), axis, offset)
            for source, axis, offset in builder.sources
        ]
        if plan.numbers:
            xs.append(emitter.indices())
        if not xs:
            xs = [emitter.steps()]
        body_node = tracer.register_callable(f"loop{region.number}_body", body)
        inits = [plan.carries[p] for p in builder.carry_order]
        per_step = [builder.nodes[p].meta["val"] for p in positions]
        per_step += [plan.writes[p].value.meta["val"] for p in writes]
        outputs = emitter.scan(
            (body_node, inits, xs, builder.additional),
            [builder.nodes[p].meta["val"] for p in builder.carry_order],
            per_step,
        )
        stacked = outputs[len(inits) :]
        for j, position in enumerate(writes):
            emitter.write(plan.writes[position], stacked[len(positions) + j])
    inside = set(region.index_nodes).union(*map(set, region.steps))
    last = plan.steps[region.count - 1]
    for c, position in enumerate(builder.carry_order):
        last[position].replace_all_uses_with(outputs[c], delete_user_cb=lambda u: u not in inside)
    for node in region.stacked:
        _, position, dim, how, first = cast(tuple[Any, int, int, str, tuple], node.args)
        with graph.inserting_before(node):
            values = stacked[positions.index(position)]
            if how == "last":
                # the value of the last step (`y` after the loop), the last of them
                value = emitter.node(torch.select, (values, 0, -1))
            else:
                value = emitter.stacked(values, dim, how, first)
        node.replace_all_uses_with(value)
        graph.erase_node(node)
    _erase_steps(graph, region)


class _Emitter:
    """Writes the nodes around the scan in the region's graph, with their values."""

    def __init__(self, tracer: Any, region: LoopRegion):
        self.tracer = tracer
        self.region = region
        self.graph = region.graph
        self.length = region.length.node
        self.trace = region.index_nodes[0].meta.get("stack_trace", "")

    def node(self, target: Any, args: tuple, kind: str = "call_function") -> Node:
        """A node whose value is computed from its arguments' values."""
        node = self.graph.create_node(kind, target, args, {})
        values = map_arg(args, lambda n: n.meta["val"])
        with self.tracer.fake_mode:
            node.meta["val"] = target(*values) if kind == "call_function" else None
        node.meta["stack_trace"] = self.trace
        return node

    def scanned(self, source: Node, axis: int, offset: int = 0) -> Node:
        """``source`` with the loop's axis first, cut to the loop's steps (each reading
        its index plus ``offset``), in the order the loop runs them."""
        region = self.region
        moved = self.node(torch.movedim, (source, axis, 0))
        size = source.meta["val"].shape[axis]
        length = self.length.meta["val"].node.expr
        first = region.start + offset
        if first != 0 or not (isinstance(size, torch.SymInt) and size.node.expr == length):
            moved = self.node(torch.narrow, (moved, 0, first, self.length))
        if region.reverse:
            moved = self.node(torch.flip, (moved, [0]))
        return moved

    def steps(self) -> Node:
        """``torch.arange(length)``: what a scan of a loop reading no slice scans, so
        that it runs the loop's number of steps."""
        return self.node(torch.arange, (self.length,))

    def indices(self) -> Node:
        """The index of each step, in the order the loop runs them: what the body
        reads where a step takes its index as a number (``h + i``)."""
        region = self.region
        values = self.steps()
        if region.start != 0:
            values = self.node(operator.add, (values, region.start))
        if region.reverse:
            values = self.node(torch.flip, (values, [0]))
        return values

    def scan(self, args: tuple, carried: list, per_step: list) -> list[Node]:
        """The scan node and one ``getitem`` per output."""
        scan = self.graph.create_node("call_function", ScanCCOp(), args, {})
        length = self.length.meta["val"]
        with self.tracer.fake_mode:
            stacked = [v.unsqueeze(0).expand(length, *v.shape).contiguous() for v in per_step]
        scan.meta["val"] = tuple(carried + stacked)
        scan.meta["stack_trace"] = self.trace
        outputs = []
        for j, val in enumerate(scan.meta["val"]):
            item = self.graph.call_function(operator.getitem, (scan, j))
            item.meta["val"] = val
            item.meta["stack_trace"] = self.trace
            outputs.append(item)
        return outputs

    def stacked(self, values: Node, dim: int, how: str, first: tuple = ()) -> Node:
        """``torch.stack``/``torch.cat`` of the per-step values, from the scan's, after
        ``first`` (the value of a first step kept apart): a new contiguous tensor, as
        they make (a view of the scan's output would share its memory with another join
        of the same values, and ``flatten()`` of it would copy where eager's is a view
        that in-place updates go through)."""
        moved = self.node(torch.movedim, (values, 0, dim))
        if how == "cat":
            moved = self.node(torch.flatten, (moved, dim, dim + 1))
        if first:
            pieces = [self.node(torch.unsqueeze, (v, dim)) if how == "stack" else v for v in first]
            return self.node(torch.cat, ([*pieces, moved], dim))
        fresh = self.graph.create_node(
            "call_function", torch.clone, (moved,), {"memory_format": torch.contiguous_format}
        )
        with self.tracer.fake_mode:
            fresh.meta["val"] = moved.meta["val"].clone(memory_format=torch.contiguous_format)
        fresh.meta["stack_trace"] = self.trace
        return fresh

    def write(self, write: StepWrite, values: Node) -> None:
        """``out[..., c*start + b : c*stop + b, ...] = values``, for the steps' writes
        ``out[..., i + b, ...] = value`` (``c`` is 1) and ``out[..., c*i + b : c*i + b +
        c, ...] = value`` (a ``chunk``)."""
        out, axis, value, c, b, chunk = (
            write.out,
            write.axis,
            write.value,
            write.c,
            write.b,
            write.chunk,
        )
        region = self.region
        if region.reverse:
            values = self.node(torch.flip, (values, [0]))
        stop: Any = region.stop.node
        if c != 1:
            stop = self.node(operator.mul, (stop, c))
        if b != 0:
            stop = self.node(operator.add, (stop, b))
        rows = slice(c * region.start + b, stop)
        new_item = tuple(rows if k == write.position else i for k, i in enumerate(write.item))
        fake_item = map_arg(new_item, lambda n: n.meta["val"])
        with self.tracer.fake_mode:
            target = out.meta["val"][fake_item].movedim(axis, 0).shape[1:]
        missing = len(target) + (1 if chunk else 0) - value.meta["val"].dim()
        if missing > 0:
            values = self.node(operator.getitem, (values, (slice(None),) + (None,) * missing))
        moved = self.node(torch.movedim, (values, 0, axis))
        if chunk:
            moved = self.node(torch.flatten, (moved, axis, axis + 1))
        self.node(operator.setitem, (out, new_item, moved))


def _erase_steps(graph, region: LoopRegion) -> None:
    order = [n for nodes in region.steps for n in nodes] + list(region.index_nodes)
    order = [n for n in order if not getattr(n, "_erased", False)]
    remaining = set(order)
    progress = True
    while progress:
        progress = False
        for node in reversed(order):
            if node in remaining and not node.users:
                graph.erase_node(node)
                remaining.discard(node)
                progress = True
    kept = [n for n in remaining if n.op != "get_attr" and not is_size(n)]
    if kept:
        raise TracingError.at(
            region.location,
            f"the loop became a scan but its steps are still used by "
            f"{sorted(u.name for n in kept for u in n.users)}",
        )
