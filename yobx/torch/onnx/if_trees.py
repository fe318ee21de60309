"""Trees of nested ``If`` nodes run as one ``If``, choosing between their distinct leaves.

After :mod:`.branch_merging`, a model choosing between versions computes each stretch
where its versions differ in a tree of nested ``If`` nodes following the version tree:
a Llama decode step has three or four such stretches per layer (how the past is
concatenated, how the attention groups its heads, ...), each three or four ``If``
deep, while most of a tree's leaves compute the same thing (two distinct leaves among
five, typically). onnxruntime pays for each ``If`` it runs (a frame for the
subgraph, its feeds and fetches): 84 per decode step of an 8-layer Llama, about as much
time as the rest of the gap to a hand-built graph.

:func:`collapse_if_trees` rewrites such a tree::

    If(c, then=[If(d, then=A, else=B)], else=[A'])      (A' computes what A computes)
    ->  If(Gather([True, False, True], path), then=A, else=B)

where ``path`` is the index of the leaf the conditions select, computed once by an
``If`` tree returning a number (the *selector*), shared by every tree of the graph
taking the same conditions in the same order. A tree is rewritten only when its
selector is shared by another tree (otherwise the selector costs what it saves) and
when no leaf runs more ``If`` nodes than before; with a single distinct leaf, the tree
becomes the leaf's nodes.

A *dispatch level* is a branch whose nodes are one ``If`` (the next level) and
constants: its outputs are the inner ``If``'s outputs, its constants or values of the
enclosing graphs. Two leaves are the same when their nodes, attributes and the values
they read from outside are (the structural key of :mod:`.branch_merging`), constants of
the dispatch levels compared by value. The rewrite holds by construction: the selector
evaluates the conditions in the order the tree did (a condition computed on one side
only is read only on that side), and the leaf it selects computes what the tree's leaf
on that path computed, from the same values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from .branch_merging import _Names, _node_key

__all__ = ["collapse_if_trees"]


@dataclass
class _Path:
    """One way through a tree: the conditions and their sides, the leaf reached, and
    for each output of the tree's root the value standing for it on this path."""

    literals: tuple[tuple[ir.Value, bool], ...]
    leaf: ir.Graph
    outputs: list[ir.Value]
    #: the dispatch levels crossed, whose constants the leaf may read
    levels: tuple[ir.Graph, ...]


def collapse_if_trees(model: ir.Model) -> int:
    """Rewrites the trees of nested ``If`` nodes of ``model`` (see the module
    docstring), in every graph; returns how many trees were rewritten."""
    return _walk(model.graph, _Names(model.graph), dict(model.opset_imports))


def _walk(graph: ir.Graph, names: _Names, opsets: dict) -> int:
    """Rewrites the trees of ``graph``, then those of the subgraphs it holds after
    that (the leaves kept, not the levels dropped)."""
    collapsed = _collapse_in(graph, names, opsets)
    for node in list(graph):
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                collapsed += _walk(attribute.value, names, opsets)
            elif attribute.type == ir.AttributeType.GRAPHS:
                collapsed += sum(_walk(g, names, opsets) for g in attribute.value)
    return collapsed


def _is_if(node: ir.Node) -> bool:
    return node.op_type == "If" and node.domain in ("", "ai.onnx")


def _dispatch_if(graph: ir.Graph) -> ir.Node | None:
    """The ``If`` of a dispatch level (one ``If`` and constants, the ``If``'s condition
    from outside), None for a leaf."""
    ifs = [node for node in graph if _is_if(node)]
    if len(graph.inputs) or len(ifs) != 1:
        return None
    inner = ifs[0]
    others = [node for node in graph if node is not inner]
    if any(n.op_type != "Constant" or n.domain not in ("", "ai.onnx") for n in others):
        return None
    condition = inner.inputs[0]
    if condition is None or condition.producer() in others:
        return None
    return inner


def _paths(node: ir.Node, literals: tuple = (), levels: tuple = ()) -> list[_Path]:
    """The paths of the tree rooted at ``node``, then branch first."""
    paths = []
    for attribute, side in (("then_branch", True), ("else_branch", False)):
        graph = node.attributes[attribute].value
        taken = (*literals, (node.inputs[0], side))
        inner = _dispatch_if(graph)
        if inner is None:
            paths.append(_Path(taken, graph, list(graph.outputs), levels))
            continue
        for path in _paths(inner, taken, (*levels, graph)):
            outputs = [
                path.outputs[v.index()] if v.producer() is inner else v for v in graph.outputs
            ]
            paths.append(_Path(path.literals, path.leaf, outputs, path.levels))
    return paths


def _level_constant(value: ir.Value, path: _Path) -> ir.Node | None:
    """The constant node of a dispatch level of ``path`` defining ``value``, if any."""
    producer = value.producer()
    if producer is None or producer.graph is None:
        return None
    return producer if any(producer.graph is level for level in path.levels) else None


def _constant_key(node: ir.Node) -> tuple:
    attributes = []
    for name, attribute in sorted(node.attributes.items()):
        value = attribute.value
        if attribute.type == ir.AttributeType.TENSOR:
            value = (value.dtype, tuple(value.shape), value.tobytes())
        elif isinstance(value, list):
            value = tuple(value)
        attributes.append((name, value))
    return ("constant", tuple(attributes))


def _leaf_key(path: _Path) -> tuple:
    """Equal for two paths whose leaves compute the same outputs from the same values.

    Constants (the leaf's own or a dispatch level's) are compared by value wherever
    they are read: the filler a branch returns for an output only the other side needs
    is a constant of the leaf on one path and of a dispatch level on another."""
    numbers: dict[int, int] = {}

    def reference(value: ir.Value | None) -> tuple | None:
        if value is None:
            return None
        producer = value.producer()
        constant = producer is not None and _is_constant(producer)
        if constant and (producer.graph is path.leaf or _level_constant(value, path)):
            return _constant_key(producer)
        if id(value) in numbers:
            return ("defined", numbers[id(value)])
        return ("outer", id(value))

    nodes = []
    for node in path.leaf:
        if _is_constant(node):
            continue
        captured: dict[int, tuple] = {}
        structure = _node_key(node, numbers, captured)
        reads = [v for _, v in sorted(captured.values(), key=lambda c: c[0])]
        nodes.append((structure, tuple(reference(v) for v in (*node.inputs, *reads))))
        for value in node.outputs:
            numbers[id(value)] = len(numbers)
    return tuple(nodes), tuple(reference(v) for v in path.outputs)


def _is_constant(node: ir.Node) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and not node.inputs


def _collapse_in(graph: ir.Graph, names: _Names, opsets: dict) -> int:
    trees = []
    for node in graph:
        if not _is_if(node) or all(
            _dispatch_if(node.attributes[a].value) is None for a in ("then_branch", "else_branch")
        ):
            continue
        paths = _paths(node)
        if any(_level_constant(c, p) is not None for p in paths for c, _ in p.literals):
            continue  # a condition the tree computes itself: the selector cannot read it
        signature = tuple(tuple((id(c), side) for c, side in p.literals) for p in paths)
        trees.append((node, paths, signature))
    # the trees whose rewrite runs no more If nodes on any path than they do
    plans = []
    for node, paths, signature in trees:
        classes: dict[tuple, list[int]] = {}
        for index, path in enumerate(paths):
            classes.setdefault(_leaf_key(path), []).append(index)
        members = list(classes.values())
        if any(
            position + 1 > len(paths[i].literals)
            for position, indices in enumerate(members[:-1])
            for i in indices
        ) or any(len(members) - 1 > len(paths[i].literals) for i in members[-1]):
            continue
        plans.append((node, paths, signature, members))
    # a selector costs what it saves unless another tree shares it
    shared: dict[tuple, int] = {}
    for plan in plans:
        shared[plan[2]] = shared.get(plan[2], 0) + 1
    selectors: dict[tuple, ir.Value] = {}
    collapsed = 0
    for node, paths, signature, members in plans:
        if shared[signature] < 2:
            continue
        if signature not in selectors:
            selector = _selector(node, [0], names, opsets)
            graph.insert_before(node, [selector])
            selectors[signature] = selector.outputs[0]
        _rewrite(node, paths, members, selectors[signature], names, opsets)
        collapsed += 1
    return collapsed


def _named(node: ir.Node, names: _Names, label: str) -> ir.Node:
    node.name = names.fresh(label)
    for value in node.outputs:
        value.name = names.fresh(label)
    return node


def _constant(array: np.ndarray, names: _Names, label: str) -> ir.Node:
    node = _named(ir.node("Constant", [], attributes={"value": ir.tensor(array)}), names, label)
    node.outputs[0].dtype = ir.DataType.INT64 if array.dtype == np.int64 else ir.DataType.BOOL
    node.outputs[0].shape = ir.Shape(array.shape)
    return node


def _selector(node: ir.Node, counter: list[int], names: _Names, opsets: dict) -> ir.Node:
    """An ``If`` tree on the conditions of ``node``'s tree returning the index of the
    path taken (in the order of :func:`_paths`)."""
    branches = {}
    for attribute in ("then_branch", "else_branch"):
        inner = _dispatch_if(node.attributes[attribute].value)
        if inner is None:
            chosen = _constant(np.array(counter[0], np.int64), names, "yobx_path")
            counter[0] += 1
        else:
            chosen = _selector(inner, counter, names, opsets)
        branches[attribute] = ir.AttrGraph(
            attribute,
            ir.Graph(
                [],
                [chosen.outputs[0]],
                nodes=[chosen],
                opset_imports=opsets,
                name=names.fresh(f"yobx_path_{attribute}"),
            ),
        )
    selector = _named(ir.node("If", [node.inputs[0]], attributes=branches), names, "yobx_path")
    selector.outputs[0].dtype, selector.outputs[0].shape = ir.DataType.INT64, ir.Shape([])
    return selector


def _own_leaf(path: _Path, names: _Names) -> ir.Graph:
    """The leaf of ``path`` made to compute the tree's outputs by itself: the dispatch
    levels' constants it reads copied into it, its outputs those of the tree."""
    leaf = path.leaf
    inside = {id(n) for n in ir.traversal.RecursiveGraphIterator(leaf)}
    copies: dict[int, ir.Value] = {}
    added: list[ir.Node] = []

    def copy_of(value: ir.Value, constant: ir.Node) -> ir.Value:
        if id(value) not in copies:
            attributes = list(constant.attributes.values())
            copy = ir.Node(constant.domain, "Constant", [], attributes=attributes)
            _named(copy, names, f"{value.name}_leaf")
            copy.outputs[0].type, copy.outputs[0].shape = value.type, value.shape
            added.append(copy)
            copies[id(value)] = copy.outputs[0]
        return copies[id(value)]

    for level in path.levels:
        for constant in level:
            if constant.op_type != "Constant":
                continue
            value = constant.outputs[0]
            for use in list(value.uses()):
                if id(use.node) in inside:
                    use.node.replace_input_with(use.idx, copy_of(value, constant))
    outputs: list[ir.Value] = []
    for value in path.outputs:
        constant = _level_constant(value, path)
        if constant is not None:
            value = copy_of(value, constant)
        own = value.producer() is not None and (
            id(value.producer()) in inside or value in copies.values()
        )
        if not own or any(value is other for other in outputs):
            # a value of an enclosing graph, or one returned twice: a copy of its own
            identity = _named(ir.node("Identity", [value]), names, f"{value.name}_leaf")
            identity.outputs[0].type, identity.outputs[0].shape = value.type, value.shape
            added.append(identity)
            value = identity.outputs[0]
        outputs.append(value)
    constants = [node for node in added if node.op_type == "Constant"]
    if constants and len(leaf):
        leaf.insert_before(next(iter(leaf)), constants)
    else:
        leaf.extend(constants)
    leaf.extend(node for node in added if node.op_type != "Constant")
    leaf.outputs.clear()
    leaf.outputs.extend(outputs)
    return leaf


def _rewrite(
    node: ir.Node,
    paths: list[_Path],
    members: list[list[int]],
    path_index: ir.Value,
    names: _Names,
    opsets: dict,
) -> None:
    """Replaces the tree rooted at ``node`` by a chain of ``If`` on ``path_index``, one
    per distinct leaf but the last (none with a single one)."""
    graph = node.graph
    kept = [paths[indices[0]] for indices in members]
    leaves = [_own_leaf(path, names) for path in kept]
    inside = {id(n) for leaf in leaves for n in ir.traversal.RecursiveGraphIterator(leaf)}
    # the rest of the tree is dropped: its nodes must not count among the users of
    # the values they read (the kept leaves move to the new If nodes)
    for attribute in ("then_branch", "else_branch"):
        for old in ir.traversal.RecursiveGraphIterator(node.attributes[attribute].value):
            if id(old) not in inside:
                _read_nothing(old)
    added: list[ir.Node] = []
    if len(leaves) == 1:
        moved = list(leaves[0])
        for inner in moved:
            leaves[0].remove(inner)
        added.extend(moved)
        results = list(leaves[0].outputs)
        # the leaf graph is dropped: its outputs may become the graph's own (seed 6195)
        leaves[0].outputs.clear()
    else:
        chosen: ir.Node | None = None
        for position in range(len(leaves) - 2, -1, -1):
            table = np.array([i in members[position] for i in range(len(paths))], np.bool_)
            constant = _constant(table, names, "yobx_leaf_table")
            condition = _named(
                ir.node("Gather", [constant.outputs[0], path_index]), names, "yobx_leaf"
            )
            condition.outputs[0].dtype, condition.outputs[0].shape = ir.DataType.BOOL, ir.Shape([])
            if chosen is None:
                otherwise = leaves[-1]
            else:
                otherwise = ir.Graph(
                    [],
                    list(chosen.outputs),
                    nodes=[chosen],
                    opset_imports=opsets,
                    name=names.fresh("yobx_leaves"),
                )
            chosen = ir.node(
                "If",
                [condition.outputs[0]],
                attributes={
                    "then_branch": ir.AttrGraph("then_branch", leaves[position]),
                    "else_branch": ir.AttrGraph("else_branch", otherwise),
                },
                num_outputs=len(node.outputs),
            )
            _named(chosen, names, "yobx_leaves")
            for new, old in zip(chosen.outputs, node.outputs):
                new.type, new.shape = old.type, old.shape
            added[:0] = [constant, condition]
        added.append(chosen)
        results = list(chosen.outputs)
    graph.insert_before(node, added)
    for old, new in zip(node.outputs, results):
        # a leaf's value may have no type of its own: the tree's output had one
        new.type = new.type or old.type
        new.shape = new.shape or old.shape
        if old.is_graph_output():
            name = old.name
            old.name = names.fresh(f"{name}_tree")
            new.name = name
        old.replace_all_uses_with(new, replace_graph_outputs=True)
    graph.remove(node, safe=True)


def _read_nothing(node: ir.Node) -> None:
    """``node`` itself reads nothing any more (its subgraphs are left as they are)."""
    for index in range(len(node.inputs)):
        node.replace_input_with(index, None)
