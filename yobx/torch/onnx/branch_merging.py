"""The two branches of an ``If`` merged: what both compute is computed once, outside.

A capture choosing between versions (:mod:`yobx.torch.tracing.constraints.versions`) becomes an
``If`` whose branches each hold a whole model: a Llama decode step chooses between six
versions (the first token or not, one new token or several, a mask longer or shorter
than the cache) nested four ``If`` deep, and every branch repeats every layer's weight
multiplications. The versions differ in a few places only (how the mask is padded, how
the attention groups its heads), but onnxruntime runs each weight multiplication inside
the nested branches, where it does not prepack 4-bit weights (ten times slower), the
fusions for onnxruntime do not look, and the model is six times larger than it needs.

:func:`merge_if_branches` rewrites each ``If`` (the innermost first) so that a node
both branches compute alike runs once in the enclosing graph, and only the nodes that
differ stay in smaller ``If`` nodes on the same condition, one for each stretch of the
branches where they differ::

    If(c, then=[a, b, x, d], else=[a, b, y, z, d])
    ->  a, b, If(c, then=[x], else=[y, z]), d

where ``d`` multiplies by a weight what ``x`` and ``z`` compute.

The nodes of the two branches are aligned in their order (the longest matching
subsequences of their operators, attributes, subgraphs and inputs). A pair of aligned
nodes can be computed once when each of its inputs (and each value its subgraphs read
from outside) is the same value in both branches: a value of the enclosing graph, the
output of another pair computed once, or the outputs of a stretch that differs, paired
as one output of that stretch's ``If``. Otherwise the two nodes stay in their branches.
Once the branches differ, a stretch goes on until the next pair reading a weight (a
constant of rank 2 or more): the pairs in between stay in it, one ``If`` instead of one
per difference (an ``If`` costs a few microseconds to run; only one side of it runs,
so nothing runs twice). Two weights are never paired as an output: a product choosing
between two weights reads no weight.

The rewrite holds by construction: on either side of the condition, every value
computed once equals the value the original branch computed, since it is the same
operator on the same inputs; an output a stretch only needs on one side is an empty
tensor on the other, which nothing reads on that side.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

__all__ = ["FILLER_KEY", "merge_if_branches", "merged_shape", "node_key"]

#: ``node.meta`` key (in memory only) of the constants filling an output a stretch only
#: needs on the other side: nothing reads them on their side
FILLER_KEY = "yobx_filler"


def merge_if_branches(model: ir.Model) -> int:
    """Merges the branches of every ``If`` of ``model`` (functions aside), the innermost
    first; returns how many nodes now run once instead of once in each branch."""
    return _merge_in(model.graph, _Names(model.graph))


class _Names:
    """Names not yet given to a node or a value of the model (onnxruntime refuses a
    model where two nodes, or two values, share a name)."""

    def __init__(self, graph: ir.Graph):
        self.taken = {v.name for v in (*graph.inputs, *graph.initializers.values())}
        for node in ir.traversal.RecursiveGraphIterator(graph):
            self.taken.add(node.name)
            self.taken.update(v.name for v in node.outputs)
            for attribute in node.attributes.values():
                if attribute.type == ir.AttributeType.GRAPH:
                    self.taken.update(v.name for v in attribute.value.inputs)

    def fresh(self, wanted: str) -> str:
        name, suffix = wanted, 0
        while name in self.taken:
            suffix += 1
            name = f"{wanted}_{suffix}"
        self.taken.add(name)
        return name


def _merge_in(graph: ir.Graph, names: _Names) -> int:
    moved = 0
    for node in list(graph):
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                moved += _merge_in(attribute.value, names)
            elif attribute.type == ir.AttributeType.GRAPHS:
                for subgraph in attribute.value:
                    moved += _merge_in(subgraph, names)
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
            moved += _merge(node, names)
    return moved


@dataclass
class _Stretch:
    """Nodes of both branches between two pairs computed once."""

    then_nodes: list[ir.Node] = field(default_factory=list)
    else_nodes: list[ir.Node] = field(default_factory=list)
    #: the values each side exports, in the order of the If's outputs: a value of the
    #: stretch, or None where that side only fills the output with an empty tensor
    exports: list[tuple[ir.Value | None, ir.Value | None]] = field(default_factory=list)


@dataclass
class _Plan:
    """What :func:`_merge` does, decided before anything changes."""

    #: in order: ``("pair", then_node, else_node)`` or ``("stretch", _Stretch)``
    steps: list[tuple] = field(default_factory=list)
    shared: int = 0
    #: the key (see :class:`_Planner`) of the value standing for each output of the If
    outputs: list[tuple] = field(default_factory=list)
    #: for each pair's then node (by id), the keys of the values it reads (its inputs,
    #: then what its subgraphs read from outside them)
    inputs: dict[int, list[tuple | None]] = field(default_factory=dict)
    #: the values of the enclosing graphs the branches read, by id
    outer: dict[int, ir.Value] = field(default_factory=dict)
    #: for each side, the key of each value of the branch the merged graph computes
    resolved: list[dict[int, tuple]] = field(default_factory=list)
    #: the nodes of stretches nothing reads, dropped with the branches
    unused: list[ir.Node] = field(default_factory=list)
    #: the ``Identity`` nodes copying outputs the merged graph would not compute as one
    #: value (see :meth:`_Planner.select_outputs`), not yet in any graph
    copies: list[ir.Node] = field(default_factory=list)


class _Branch:
    """One branch of the ``If``: its nodes, and for every node nested in them, the
    node of the branch holding it."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.nodes = list(graph)
        self.top: dict[int, ir.Node] = {}
        for node in self.nodes:
            for inner in _nested(node):
                self.top[id(inner)] = node
        self.produced = {id(out) for node in self.nodes for out in node.outputs}
        self._constant: dict[int, bool] = {}
        self._descriptions: dict[int, tuple[tuple, list[ir.Value | None]]] = {}

    def is_local(self, value: ir.Value | None) -> bool:
        return value is not None and id(value) in self.produced

    def inputs_of(self, node: ir.Node) -> list[ir.Value | None]:
        """``node``'s inputs, then the values its subgraphs read from outside them."""
        return self._described(node)[1]

    def key_of(self, node: ir.Node) -> tuple:
        """``node``'s operator, attributes and subgraphs' structure (:func:`_node_key`)."""
        return self._described(node)[0]

    def _described(self, node: ir.Node) -> tuple[tuple, list[ir.Value | None]]:
        # one walk of a node's subgraphs gives both its key and what it reads from
        # outside them (a subgraph can hold a whole model)
        found = self._descriptions.get(id(node))
        if found is None:
            captured: dict[int, tuple] = {}
            key = _node_key(node, {}, captured)
            outside = [value for _, value in sorted(captured.values(), key=lambda c: c[0])]
            found = self._descriptions[id(node)] = (key, [*node.inputs, *outside])
        return found

    def constant(self, value: ir.Value) -> bool:
        """``value`` is computed from initializers and constants only (a weight, maybe
        transposed or cast)."""
        # depth first without recursion: a chain of activations is as long as the model
        stack = [value]
        while stack:
            current = stack[-1]
            if id(current) in self._constant:
                stack.pop()
                continue
            producer = current.producer()
            if producer is None:
                self._constant[id(current)] = (
                    current.is_initializer() or current.const_value is not None
                )
                stack.pop()
                continue
            holds_graph = any(
                a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                for a in producer.attributes.values()
            )
            inputs = [v for v in producer.inputs if v is not None]
            known = [self._constant.get(id(v)) for v in inputs]
            if holds_graph or False in known:
                self._constant[id(current)] = False
                stack.pop()
            elif None in known:
                stack.append(inputs[known.index(None)])
            else:
                self._constant[id(current)] = True
                stack.pop()
        return self._constant[id(value)]


def _nested(node: ir.Node):
    yield node
    for graph in _subgraphs(node):
        for inner in graph:
            yield from _nested(inner)


def _subgraphs(node: ir.Node):
    """The graphs ``node`` holds (an ``If``'s branches, a ``Scan``'s body), in order."""
    for attribute in node.attributes.values():
        if attribute.type == ir.AttributeType.GRAPH:
            yield attribute.value
        elif attribute.type == ir.AttributeType.GRAPHS:
            yield from attribute.value


def _merge(node: ir.Node, names: _Names) -> int:
    then_branch = _Branch(node.attributes["then_branch"].value)
    else_branch = _Branch(node.attributes["else_branch"].value)
    plan = _plan(then_branch, else_branch, names)
    if plan is None:
        return 0
    if not plan.shared:
        # nothing to merge: the copies made for the outputs read nothing any more
        for copy in plan.copies:
            _detach(copy)
        return 0
    _apply(node, then_branch, else_branch, plan, names)
    return plan.shared


def _signature(node: ir.Node, branch: _Branch) -> tuple:
    """What two nodes must share to be aligned: operator, attributes (the structure of
    a subgraph), and for each input (the values a subgraph reads from outside it
    included) the value itself when it comes from outside the branch, else nothing."""
    inputs = []
    for value in branch.inputs_of(node):
        if value is None:
            inputs.append(None)
        elif branch.is_local(value):
            inputs.append(("local",))
        else:
            inputs.append(("outer", id(value)))
    return (*branch.key_of(node), *inputs)


def _node_key(node: ir.Node, numbers: dict[int, int], captured: dict[int, tuple]) -> tuple:
    """The operator and attributes of ``node``; a subgraph by its structure, its values
    numbered in the order they are defined (``numbers``) and the values it reads from
    outside in the order it reads them (``captured``: id -> (order, value)))."""
    attributes = []
    for name, attribute in sorted(node.attributes.items()):
        if attribute.type == ir.AttributeType.GRAPH:
            key: Any = _graph_key(attribute.value, numbers, captured)
        elif attribute.type == ir.AttributeType.GRAPHS:
            key = tuple(_graph_key(g, numbers, captured) for g in attribute.value)
        elif attribute.type == ir.AttributeType.TENSOR:
            tensor = attribute.value
            key = ("tensor", tensor.dtype, tuple(tensor.shape), tensor.tobytes())
        else:
            value = attribute.value
            key = tuple(value) if isinstance(value, (list, tuple)) else value
        attributes.append((name, attribute.type, key))
    return (node.domain, node.op_type, node.overload, len(node.outputs), tuple(attributes))


def node_key(node: ir.Node) -> tuple:
    """What two nodes computing the same function of the same inputs share: operator,
    attributes, and the structure of their subgraphs (:func:`_node_key`)."""
    return _node_key(node, {}, {})


def _graph_key(graph: ir.Graph, numbers: dict[int, int], captured: dict[int, tuple]) -> tuple:
    """The structure of a subgraph (see :func:`_node_key`): two subgraphs with equal
    keys compute the same function of the values they read from outside, in order."""

    def reference(value: ir.Value | None) -> tuple | None:
        if value is None:
            return None
        if id(value) in numbers:
            return ("defined", numbers[id(value)])
        if id(value) not in captured:
            captured[id(value)] = (len(captured), value)
        return ("captured", captured[id(value)][0])

    def define(value: ir.Value) -> None:
        numbers[id(value)] = len(numbers)

    for value in graph.inputs:
        define(value)
    nodes = []
    for inner in graph:
        key = _node_key(inner, numbers, captured)
        nodes.append((key, tuple(reference(v) for v in inner.inputs)))
        for value in inner.outputs:
            define(value)
    return (len(graph.inputs), tuple(nodes), tuple(reference(v) for v in graph.outputs))


def _plan(then_branch: _Branch, else_branch: _Branch, names: _Names) -> _Plan | None:
    """Aligns the branches and decides which pairs are computed once; None when the
    merge cannot be written (an output without a known type)."""
    then_sigs = [_signature(n, then_branch) for n in then_branch.nodes]
    else_sigs = [_signature(n, else_branch) for n in else_branch.nodes]
    matcher = difflib.SequenceMatcher(None, then_sigs, else_sigs, autojunk=False)
    events: list[tuple] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            events += [("pair", i, j) for i, j in zip(range(i1, i2), range(j1, j2))]
        else:
            events += [("then", i) for i in range(i1, i2)]
            events += [("else", j) for j in range(j1, j2)]
    return _Planner(then_branch, else_branch, events, names).run()


class _Planner:
    """Walks the aligned events and groups them into pairs and stretches.

    A value of the merged graph is named by a key: ``("outer", id)`` for a value of
    the enclosing graphs, ``("pair", id of the then node, index)`` for an output of a
    pair computed once, ``("stretch", step, index)`` for an output of a stretch's
    ``If``. ``resolved[side]`` gives the key of a value of a branch (the first that
    carries it), ``joined`` the key carrying two values side by side.
    """

    def __init__(
        self, then_branch: _Branch, else_branch: _Branch, events: list[tuple], names: _Names
    ):
        self.branches = (then_branch, else_branch)
        self.names = names
        self.events = events
        self.plan = _Plan()
        self.resolved: list[dict[int, tuple]] = [{}, {}]
        self.joined: dict[tuple[int, int], tuple] = {}
        self.stretch = _Stretch()
        self.in_stretch: list[set[int]] = [set(), set()]
        self.extra: list[tuple[ir.Value, ir.Value]] = []

    def resolve(self, side: int, value: ir.Value) -> tuple | None:
        if not self.branches[side].is_local(value):
            self.plan.outer[id(value)] = value
            return ("outer", id(value))
        return self.resolved[side].get(id(value))

    def key(self, a: ir.Value, b: ir.Value) -> tuple | None:
        """The key of a value standing for ``a`` and ``b`` alike, if there is one."""
        joined = self.joined.get((id(a), id(b)))
        if joined is not None:
            return joined
        resolved = self.resolve(0, a)
        return resolved if resolved is not None and resolved == self.resolve(1, b) else None

    def pairable(self, a: ir.Value, b: ir.Value) -> bool:
        """``a`` and ``b`` come from the stretch being built and can be one of its
        outputs: of one type, and not two weights (a product choosing between two
        weights reads no weight: onnxruntime does not prepack it, quantizers skip it)."""
        return (
            id(a) in self.in_stretch[0]
            and id(b) in self.in_stretch[1]
            and a.type == b.type
            and not (self.branches[0].constant(a) and not _fills(a))
            and not (self.branches[1].constant(b) and not _fills(b))
        )

    def run(self) -> _Plan | None:
        for position, event in enumerate(self.events):
            if event[0] == "pair":
                then_node = self.branches[0].nodes[event[1]]
                else_node = self.branches[1].nodes[event[2]]
                if self.computable_once(then_node, else_node):
                    if self.open() and not self.reads_a_weight(then_node):
                        # the stretch goes on to the next weight: one If instead of
                        # one per stretch (only one side runs, nothing runs twice)
                        self.add(0, then_node)
                        self.add(1, else_node)
                        continue
                    if not self.close(position):
                        return None
                    self.share(then_node, else_node)
                    continue
                self.add(0, then_node)
                self.add(1, else_node)
            else:
                side = 0 if event[0] == "then" else 1
                self.add(side, self.branches[side].nodes[event[1]])
        self.select_outputs()
        self.plan.copies = [v.producer() for pair in self.extra for v in pair]
        if not self.close(len(self.events)):
            # the copies made for the outputs read nothing any more
            for copy in self.plan.copies:
                _detach(copy)
            return None
        outputs = zip(self.branches[0].graph.outputs, self.branches[1].graph.outputs)
        self.plan.outputs = [self.key(a, b) for a, b in outputs]
        for index, (a, b) in self.final.items():
            self.plan.outputs[index] = self.key(a, b)
        if None in self.plan.outputs:
            # an output neither computed once nor paired in a stretch (the copies of a
            # constant of one side and a value of the other, after a pair closed the
            # stretch before them): the branches stay as they are
            for copy in self.plan.copies:
                _detach(copy)
            return None
        self.plan.resolved = self.resolved
        return self.plan

    def select_outputs(self) -> None:
        """Each output of the branches the merged graph does not compute as one value
        (one side returns a value computed once, the other a value of its own) is
        copied by an ``Identity`` on each side in the last stretch, paired there."""
        self.final: dict[int, tuple[ir.Value, ir.Value]] = {}
        outputs = zip(self.branches[0].graph.outputs, self.branches[1].graph.outputs)
        for index, (a, b) in enumerate(outputs):
            if self.pairable(a, b) or self.key(a, b) is not None:
                continue
            copies = []
            for side, value in enumerate((a, b)):
                copy = ir.node("Identity", [value], name=self.names.fresh(f"{value.name}_returned"))
                copy.outputs[0].type, copy.outputs[0].shape = value.type, value.shape
                copy.outputs[0].name = self.names.fresh(f"{value.name}_returned")
                self.add(side, copy)
                copies.append(copy.outputs[0])
            self.extra.append((copies[0], copies[1]))
            self.final[index] = (copies[0], copies[1])

    def open(self) -> bool:
        """A stretch is being built."""
        return bool(self.stretch.then_nodes or self.stretch.else_nodes)

    def reads_a_weight(self, node: ir.Node) -> bool:
        """``node`` reads a weight (a constant matrix or more, maybe transposed; not a
        shape or a scalar): computed once in the enclosing graph, onnxruntime prepacks
        it there, quantizers and fusions find it."""
        branch = self.branches[0]
        return any(
            value is not None and branch.constant(value) and _rank(value) >= 2
            for value in branch.inputs_of(node)
        )

    def computable_once(self, then_node: ir.Node, else_node: ir.Node) -> bool:
        then_inputs = self.branches[0].inputs_of(then_node)
        for a, b in zip(then_inputs, self.branches[1].inputs_of(else_node)):
            if a is None or b is None:
                if a is not b:
                    return False
            elif self.key(a, b) is None and not self.pairable(a, b):
                return False
        return True

    def add(self, side: int, node: ir.Node) -> None:
        nodes = self.stretch.else_nodes if side else self.stretch.then_nodes
        nodes.append(node)
        self.in_stretch[side].update(id(out) for out in node.outputs)

    def share(self, then_node: ir.Node, else_node: ir.Node) -> None:
        pairs = zip(self.branches[0].inputs_of(then_node), self.branches[1].inputs_of(else_node))
        self.plan.inputs[id(then_node)] = [None if a is None else self.key(a, b) for a, b in pairs]
        for index, (a, b) in enumerate(zip(then_node.outputs, else_node.outputs)):
            key = ("pair", id(then_node), index)
            self.resolved[0][id(a)] = key
            self.resolved[1][id(b)] = key
        self.plan.steps.append(("pair", then_node, else_node))
        self.plan.shared += 1

    def close(self, position: int) -> bool:
        """Ends the stretch being built (if any) before the event at ``position``:
        decides its outputs, pairing the values later pairs read side by side."""
        stretch = self.stretch
        if not stretch.then_nodes and not stretch.else_nodes:
            return True
        pairs = self.pairs_read_later(position)
        used = [self.used_after(side) for side in (0, 1)]
        paired = [{id(a) for a, _ in pairs}, {id(b) for _, b in pairs}]
        exports = list(pairs)
        exports += [(a, None) for a in used[0] if id(a) not in paired[0]]
        exports += [(None, b) for b in used[1] if id(b) not in paired[1]]
        for a, b in exports:
            if (a is None or b is None) and not _can_stand_empty(a if b is None else b):
                return False
        self.stretch = _Stretch()
        self.in_stretch = [set(), set()]
        if not exports:
            # nothing reads what the stretch computes: it is dropped with the branches
            self.plan.unused += [*stretch.then_nodes, *stretch.else_nodes]
            return True
        stretch.exports = exports
        number = len(self.plan.steps)
        for index, (a, b) in enumerate(exports):
            key = ("stretch", number, index)
            if a is not None:
                self.resolved[0].setdefault(id(a), key)
            if b is not None:
                self.resolved[1].setdefault(id(b), key)
            if a is not None and b is not None:
                self.joined[id(a), id(b)] = key
        self.plan.steps.append(("stretch", stretch))
        return True

    def pairs_read_later(self, position: int) -> list[tuple[ir.Value, ir.Value]]:
        """The pairs of values of the stretch that later aligned pairs (and the
        branches' outputs) read side by side, each pair once."""
        candidates: list[tuple[ir.Value, ir.Value]] = []
        for event in self.events[position:]:
            if event[0] != "pair":
                continue
            then_node = self.branches[0].nodes[event[1]]
            else_node = self.branches[1].nodes[event[2]]
            candidates += zip(
                self.branches[0].inputs_of(then_node), self.branches[1].inputs_of(else_node)
            )
        candidates += zip(self.branches[0].graph.outputs, self.branches[1].graph.outputs)
        candidates += self.extra
        pairs: dict[tuple[int, int], tuple[ir.Value, ir.Value]] = {}
        for a, b in candidates:
            if a is not None and b is not None and self.pairable(a, b):
                pairs.setdefault((id(a), id(b)), (a, b))
        return list(pairs.values())

    def used_after(self, side: int) -> list[ir.Value]:
        """The values of the stretch's side read outside it (or returned)."""
        branch = self.branches[side]
        nodes = self.stretch.else_nodes if side else self.stretch.then_nodes
        inside = {id(n) for n in nodes}
        outputs = {id(v) for v in branch.graph.outputs}
        outputs |= {id(pair[side]) for pair in self.extra}
        found = []
        for node in nodes:
            for value in node.outputs:
                outside = any(
                    id(branch.top.get(id(user), user)) not in inside for user, _ in value.uses()
                )
                if outside or id(value) in outputs:
                    found.append(value)
        return found


def _rank(value: ir.Value) -> float:
    """The rank of ``value``; infinite when unknown."""
    return float("inf") if value.shape is None else len(value.shape)


def _defined_alike(first: ir.Node, second: ir.Node):
    """The values two nodes of equal keys define alike: their outputs, the inputs of
    their subgraphs (a scan's body: onnxruntime allocates its states after their
    declared shapes), and the outputs of the nodes their subgraphs hold, in order."""
    for a, b in zip(_nested(first), _nested(second)):
        yield from zip(a.outputs, b.outputs)
        for graph_a, graph_b in zip(_subgraphs(a), _subgraphs(b)):
            yield from zip(graph_a.inputs, graph_b.inputs)


def merged_shape(first: ir.Shape | None, second: ir.Shape | None) -> ir.Shape | None:
    """The shape a value has on both sides: the dimensions they agree on, the others
    unknown."""
    if first is None or second is None or len(first) != len(second):
        return None
    return ir.Shape([a if a == b else None for a, b in zip(first, second)])


def _source(value: ir.Value) -> ir.Value:
    """The value an ``Identity`` chain copies (a copy made for a graph returning a value
    twice is the same value)."""
    producer = value.producer()
    while (
        producer is not None
        and producer.op_type == "Identity"
        and producer.domain == ""
        and producer.inputs[0] is not None
    ):
        value = producer.inputs[0]
        producer = value.producer()
    return value


def _fills(value: ir.Value) -> bool:
    """``value`` is a filler (or a copy of one): a constant, but not a weight."""
    producer = _source(value).producer()
    return producer is not None and bool(producer.meta.get(FILLER_KEY))


def _can_stand_empty(value: ir.Value) -> bool:
    """An empty tensor can fill this value's output on the side that does not compute
    it (a tensor of known element type)."""
    return isinstance(value.type, ir.TensorType) and value.dtype is not None


def _empty_like(value: ir.Value, name: str) -> ir.Node:
    """A ``Constant`` empty tensor of ``value``'s element type and rank (a zero for a
    scalar)."""
    rank = len(value.shape) if value.shape is not None else 1
    dtype = value.dtype
    # a scalar stands for itself with a zero (a tensor of rank 0 is never empty)
    tensor = ir.tensor(np.zeros([0] * rank, dtype=dtype.numpy()), dtype=dtype)
    node = ir.node("Constant", [], attributes={"value": tensor}, name=name)
    node.outputs[0].name = name
    node.outputs[0].type = ir.TensorType(dtype)
    node.meta[FILLER_KEY] = True
    return node


def _apply(
    node: ir.Node, then_branch: _Branch, else_branch: _Branch, plan: _Plan, names: _Names
) -> None:
    """Rewrites ``node`` as the plan says, in its graph."""
    graph = node.graph
    base = node.name or "if"
    # the branches are emptied and dropped: their outputs first (the plan has them)
    then_branch.graph.outputs.clear()
    else_branch.graph.outputs.clear()
    values: dict[tuple, ir.Value] = {("outer", i): v for i, v in plan.outer.items()}
    dropped = []
    for number, step in enumerate(plan.steps):
        if step[0] == "pair":
            _share(step[1], step[2], plan.inputs[id(step[1])], values, then_branch)
            # removed once the stretches after it read the merged values instead
            dropped.append(step[2])
            then_branch.graph.remove(step[1])
            graph.insert_before(node, step[1])
            for index, output in enumerate(step[1].outputs):
                values["pair", id(step[1]), index] = output
            continue
        stretch = step[1]
        for side, branch in enumerate((then_branch, else_branch)):
            nodes = stretch.else_nodes if side else stretch.then_nodes
            _read_merged(nodes, branch, plan.resolved[side], values)
        name = names.fresh(f"{base}_part{number}")
        new_if = _stretch_if(
            name, node.inputs[0], stretch, dict(then_branch.graph.opset_imports), names
        )
        graph.insert_before(node, new_if)
        for index, output in enumerate(new_if.outputs):
            values["stretch", number, index] = output
    for output, key in zip(node.outputs, plan.outputs):
        merged = values[key]
        if output.is_graph_output() and _own_value(graph, merged):
            # the graph's output keeps its name, given to the merged value: an
            # Identity would copy it (a decode step's whole cache, at each level of
            # nested versions), and in a branch the enclosing If's merge would find
            # the copy on one side only and copy it again
            name, output.name = output.name, None
            merged.name = name
            if output.shape is not None:
                # the If's own shape: its dimensions keep their names (``past+seq``)
                # where the stretch computing the value only knows they vary
                merged.shape = output.shape
        elif output.is_graph_output():
            # a value of an enclosing graph, or one the graph already returns: copied
            identity = ir.node("Identity", [merged], name=names.fresh(f"{base}_{output.name}"))
            graph.insert_before(node, identity)
            name, output.name = output.name, None
            merged = identity.outputs[0]
            merged.name, merged.type, merged.shape = name, output.type, output.shape
        output.replace_all_uses_with(merged, replace_graph_outputs=True)
    for unused in plan.unused:
        _detach(unused)
    for else_node in dropped:
        else_branch.graph.remove(else_node, safe=True)
    graph.remove(node, safe=True)


def _own_value(graph: ir.Graph, value: ir.Value) -> bool:
    """``value`` is computed by a node of ``graph`` itself and not yet one of its
    outputs: it can become an output under another name."""
    producer = value.producer()
    return producer is not None and producer.graph is graph and not value.is_graph_output()


def _share(
    then_node: ir.Node, else_node: ir.Node, keys: list, values: dict, then_branch: _Branch
) -> None:
    """Makes ``then_node`` compute the pair for both sides: it reads the merged values
    (its subgraphs too), its sizes are those both sides agree on; ``else_node`` reads
    nothing any more."""
    explicit = len(then_node.inputs)
    for index, key in enumerate(keys[:explicit]):
        if key is not None and values[key] is not then_node.inputs[index]:
            then_node.replace_input_with(index, values[key])
    captured = then_branch.inputs_of(then_node)[explicit:]
    replacements = {
        id(v): values[k] for v, k in zip(captured, keys[explicit:]) if values[k] is not v
    }
    for inner in list(_nested(then_node))[1:]:
        for index, value in enumerate(inner.inputs):
            if value is not None and id(value) in replacements:
                inner.replace_input_with(index, replacements[id(value)])
    for a, b in _defined_alike(then_node, else_node):
        a.shape = merged_shape(a.shape, b.shape)
    if not else_node.meta.get(FILLER_KEY):
        # a filler paired with a real constant (a zero scalar) is read on one side
        then_node.meta.pop(FILLER_KEY, None)
    _detach(else_node)


def _detach(node: ir.Node) -> None:
    """``node`` (and the nodes of its subgraphs) read nothing: it is dropped, and the
    values it read must not count it among their users."""
    for inner in _nested(node):
        for index in range(len(inner.inputs)):
            inner.replace_input_with(index, None)


def _read_merged(nodes: list[ir.Node], branch: _Branch, resolved: dict, values: dict) -> None:
    """Makes the nodes of one side of a stretch (and their subgraphs) read the merged
    values for the values of their branch computed before the stretch."""
    produced = {id(out) for n in nodes for out in n.outputs}
    for node in nodes:
        for inner in _nested(node):
            for index, value in enumerate(inner.inputs):
                if branch.is_local(value) and id(value) not in produced:
                    merged = values[resolved[id(value)]]
                    if merged is not value:
                        inner.replace_input_with(index, merged)


def _stretch_if(
    name: str, condition: ir.Value, stretch: _Stretch, opsets: dict, names: _Names
) -> ir.Node:
    """The ``If`` computing a stretch: each side's nodes, its exports as outputs."""
    sides = []
    for side, nodes in enumerate((stretch.then_nodes, stretch.else_nodes)):
        outputs, fillers = [], []
        for index, pair in enumerate(stretch.exports):
            value = pair[side]
            label = names.fresh(f"{name}_{'else' if side else 'then'}{index}")
            if value is None:
                filler = _empty_like(pair[1 - side], label)
                fillers.append(filler)
                value = filler.outputs[0]
            elif any(value is other for other in outputs):
                # a value paired with several others: a graph returns a value once
                copy = ir.node("Identity", [value], name=label)
                copy.outputs[0].name, copy.outputs[0].type = label, value.type
                copy.outputs[0].shape = value.shape
                fillers.append(copy)
                value = copy.outputs[0]
            outputs.append(value)
        for n in nodes:
            if n.graph is not None:
                n.graph.remove(n)
        sides.append(
            ir.Graph(
                (),
                outputs,
                nodes=[*nodes, *fillers],
                opset_imports=opsets,
                name=f"{name}_{'else' if side else 'then'}",
            )
        )
    new_if = ir.node(
        "If",
        [condition],
        attributes={"then_branch": sides[0], "else_branch": sides[1]},
        num_outputs=len(stretch.exports),
        name=name,
    )
    for out, (a, b) in zip(new_if.outputs, stretch.exports):
        known = a if a is not None else b
        out.type = known.type
        if a is None or b is None:
            # the empty stand-in's size on one side, the value's on the other:
            # onnxruntime would allocate a static size ahead and refuse the other
            rank = len(known.shape) if known.shape is not None else None
            out.shape = ir.Shape([None] * rank) if rank is not None else None
        else:
            out.shape = merged_shape(a.shape, b.shape)
        out.name = names.fresh(f"{name}_{known.name}")
    return new_if
