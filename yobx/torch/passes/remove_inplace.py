"""Rewrites in-place operations of an FX graph into their functional forms.

The pass walks the graph once in order and keeps, for every tensor node, the *root* whose
storage it shares and the chain of view nodes leading from the root to it. Writing into a
node computes the functional value (``add_`` -> ``add``, ``x[i] = v`` -> ``copy`` or
``index_put``), writes it back to the root through the chain (``slice_scatter``,
``select_scatter``, inverse permutations, ...) and bumps the root's version. A later use
of a node created before the write is re-routed to the new value, regenerating the view
chain on the new root value when needed (once per node and version).

Values that may or may not share storage with their inputs (``contiguous``, ``to``,
``reshape`` of a possibly non-contiguous tensor, unknown modules...) are *opaque*: they
join their inputs in one aliasing class, and a write into a class is only rewritten when
no other member of the class is read afterwards nor observable by the caller. Otherwise
the pass refuses (exception or negative count).

Mutation convention (torch-level graphs): when a graph input (``placeholder``) or a
buffer (``get_attr``) is written, its final value is appended to the outputs: the output
becomes ``(original_output, new_value_1, ..., new_value_k)`` and
``output_node.meta["yobx_mutations"]`` lists, in the same order, dictionaries
``{"kind": "USER_INPUT_MUTATION" | "BUFFER_MUTATION", "target": name, "node": name,
"output_index": i}`` (``i`` is the position in the output tuple, starting at 1). When an
``ExportedProgram`` is given, the graph follows torch.export's convention instead:
mutated values are inserted before the user outputs and the graph signature receives
``BUFFER_MUTATION`` / ``PARAMETER_MUTATION`` / ``USER_INPUT_MUTATION`` output specs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx import Graph, Node
from torch.fx.node import map_arg

from ._node_kinds import aten, describe, example_value, inplace_form, is_tensor
from ._views import apply_step, classify, plan_index, scatter_step
from .erase import graph_erase_node

MUTATIONS_KEY = "yobx_mutations"


class InplaceRemovalError(RuntimeError):
    """Raised by :func:`remove_inplace` when an in-place node cannot be rewritten exactly."""


@dataclass(eq=False)
class _Root:
    """A storage: the node creating it, its current value and its aliasing class."""

    node: Node
    value: Node
    observable: bool
    last_use: int
    version: int = 0
    mutated: bool = False
    parent: _Root | None = None
    members: list[_Root] = field(default_factory=list)

    def find(self) -> _Root:
        root = self
        while root.parent is not None:
            root = root.parent
        node = self
        while node.parent is not None and node.parent is not root:
            node.parent, node = root, node.parent
        return root


@dataclass(eq=False)
class _Info:
    root: _Root
    chain: tuple[Node, ...]
    version: int


class _InplaceRemover:
    def __init__(self, graph: Graph, verbose: int, exc: bool, allow_observable: bool):
        self.graph = graph
        self.verbose = verbose
        self.exc = exc
        self.allow_observable = allow_observable
        self.infos: dict[Node, _Info] = {}
        self.env: dict[Node, Node] = {}
        self.regenerated: dict[Node, tuple[int, Node]] = {}
        self.roots: list[_Root] = []
        self.attributes: dict[Any, _Root] = {}
        self.removed: list[Node] = []
        self.left = 0
        self.changed = 0

    # aliasing bookkeeping

    def _new_root(self, node: Node, observable: bool) -> _Root:
        root = _Root(node, node, observable, self.last_use[node])
        root.members.append(root)
        self.roots.append(root)
        self.infos[node] = _Info(root, (), 0)
        return root

    def _union(self, root: _Root, other: _Root) -> None:
        a, b = root.find(), other.find()
        if a is b:
            return
        if len(a.members) < len(b.members):
            a, b = b, a
        b.parent = a
        a.members.extend(b.members)
        b.members = []

    def _blocking_alias(self, root: _Root, position: int) -> _Root | None:
        """Returns another member of the class still read later or observable, if any."""
        representative = root.find()
        if len(representative.members) == 1:
            return None
        alive = [
            m for m in representative.members if m is root or m.last_use > position or m.observable
        ]
        representative.members = alive
        return next((m for m in alive if m is not root), None)

    # values

    def current(self, node: Any) -> Any:
        """Returns the node holding the current value of an original node."""
        if not isinstance(node, Node):
            return node
        info = self.infos.get(node)
        if info is None or info.version == info.root.version:
            return self.env.get(node, node)
        return self._regenerate(info)

    def _regenerate(self, info: _Info) -> Node:
        root = info.root
        if not info.chain:
            return root.value
        view = info.chain[-1]
        cached = self.regenerated.get(view)
        if cached is not None and cached[0] == root.version:
            return cached[1]
        parent = self._regenerate(_Info(root, info.chain[:-1], -1))
        value = self.graph.node_copy(
            view, lambda a: parent if a is view.args[0] else self.env.get(a, a)
        )
        self.regenerated[view] = (root.version, value)
        return value

    # main loop

    def run(self) -> int:
        nodes = list(self.graph.nodes)
        position = {n: i for i, n in enumerate(nodes)}
        self.last_use = {n: max((position[u] for u in n.users), default=position[n]) for n in nodes}
        for index, node in enumerate(nodes):
            if node.op == "output":
                with self.graph.inserting_before(node):
                    node.args = map_arg(node.args, self.current)
                break
            form = inplace_form(node)
            if form is not None and form.kind != "number":
                with self.graph.inserting_before(node):
                    self._rewrite(node, form, index)
                continue
            alias = classify(node)
            inputs = (node.args, node.kwargs)
            with self.graph.inserting_before(node):
                node.args = map_arg(node.args, self.current)
                node.kwargs = map_arg(node.kwargs, self.current)
            if form is not None:
                # augmented assignment on numbers: already functional in Python
                node.target = form.target
                self.changed += 1
            self._record(node, alias.kind, inputs)
        for node in reversed(self.removed):
            if node.users:
                node.replace_all_uses_with(self.env[node])
            self.graph.erase_node(node)
        # views whose every use was re-routed to a regenerated copy are now dead
        for node in nodes:
            erased = getattr(node, "_erased", False)
            if node in self.regenerated and not erased and not node.users and not node.is_impure():
                graph_erase_node(self.graph, node)
        return self.changed

    def _attribute_root(self, node: Node) -> _Root | None:
        """Returns the root of an attribute already read by another ``get_attr`` node."""
        owner = self.graph.owning_module
        key: Any = node.target
        if owner is not None:
            try:
                key = id(owner.get_parameter(node.target))
            except AttributeError:
                try:
                    key = id(owner.get_buffer(node.target))
                except AttributeError:
                    key = node.target
        root = self.attributes.get(key)
        if root is None:
            root = self._new_root(node, True)
            self.attributes[key] = root
            if owner is None:
                # without the module, two names may hold the same tensor
                for other in self.attributes.values():
                    self._union(root, other)
            return root
        self.infos[node] = _Info(root, (), root.version)
        self.env[node] = root.value
        root.last_use = max(root.last_use, self.last_use[node])
        return root

    def _record(self, node: Node, kind: str, inputs: tuple) -> None:
        """Registers the aliasing of a node given its original ``(args, kwargs)``."""
        if kind == "nontensor":
            return
        if node.op == "get_attr":
            self._attribute_root(node)
            return
        observable = node.op == "placeholder"
        base = inputs[0][0] if inputs[0] else None
        base_info = self.infos.get(base) if isinstance(base, Node) else None
        if kind == "view" and base_info is not None:
            root = base_info.root
            self.infos[node] = _Info(root, (*base_info.chain, node), root.version)
            root.last_use = max(root.last_use, self.last_use[node])
            return
        root = self._new_root(node, observable)
        if kind == "opaque":
            arguments: list[Node] = []
            map_arg(inputs, arguments.append)
            for arg in arguments:
                info = self.infos.get(arg)
                if info is not None:
                    self._union(root, info.root)

    def _refuse(self, node: Node, reason: str, form: Any = None) -> None:
        message = f"cannot remove in-place {describe(node)}: {reason}"
        if self.exc:
            raise InplaceRemovalError(message)
        if self.verbose:
            print(f"[remove_inplace] {message}")
        self.left += 1
        info = self.infos.get(getattr(form, "mutated", None))
        node.args = map_arg(node.args, self.current)
        node.kwargs = map_arg(node.kwargs, self.current)
        if info is not None:
            self.infos[node] = _Info(info.root, info.chain, info.root.version)

    def _rewrite(self, node: Node, form: Any, index: int) -> None:
        if form.kind == "unsupported":
            self._refuse(node, form.reason, form)
            return
        info = self.infos.get(form.mutated)
        if info is None:
            self._refuse(node, "the mutated value is not a tracked tensor", form)
            return
        root = info.root
        scatters = [classify(v).scatter for v in info.chain]
        if None in scatters:
            blocked = info.chain[scatters.index(None)]
            self._refuse(node, f"it writes through {blocked.name!r} which cannot be inverted", form)
            return
        other = self._blocking_alias(root, index)
        if other is not None:
            self._refuse(
                node,
                f"the mutated tensor may share storage with {other.node.name!r} "
                "which is read later or owned by the caller",
                form,
            )
            return
        if root.observable and not self.allow_observable:
            self._refuse(node, "it writes into a graph input or a buffer (kept in place)", form)
            return
        if form.kind == "out" and info.chain:
            self._refuse(node, "out= tensor is a view", form)
            return
        current = self.current(form.mutated)
        new_value = self._functional_value(node, form, current)
        if new_value is None:
            return
        value = new_value
        for position in range(len(info.chain) - 1, -1, -1):
            view = info.chain[position]
            base = self._regenerate(_Info(root, info.chain[:position], -1))
            value = scatters[position](self.graph, view, base, value)
        root.value = value
        root.version += 1
        root.mutated = True
        root.last_use = max(root.last_use, self.last_use[node])
        if info.chain:
            self.regenerated[info.chain[-1]] = (root.version, new_value)
        self.env[node] = new_value
        self.infos[node] = _Info(root, info.chain, root.version)
        self.removed.append(node)
        self.changed += 1
        if self.verbose > 1:
            print(f"[remove_inplace] rewrote {describe(node)}")

    def _functional_value(self, node: Node, form: Any, current: Node) -> Node | None:
        graph = self.graph
        args = map_arg(form.args, self.current)
        kwargs = map_arg(form.kwargs or {}, self.current)
        if form.kind == "setitem":
            return self._setitem_value(node, form, current, args)
        if form.kind == "out":
            result = graph.create_node(form.op, form.target, tuple(args), kwargs)
            return self._cast(result, current, form.mutated, node)
        result = graph.create_node(form.op, form.target, tuple(args), kwargs)
        if form.cast:
            result = self._cast(result, current, form.mutated, node)
        return result

    def _cast(self, result: Node, current: Node, mutated: Node, node: Node) -> Node:
        """Casts a functional result back to the dtype of the tensor it replaces."""
        val = example_value(mutated)
        aten_level = isinstance(node.target, torch._ops.OpOverload)
        if aten_level:
            if isinstance(val, torch.Tensor):
                return self.graph.call_function(
                    aten._to_copy.default, (result,), {"dtype": val.dtype}
                )
            return self.graph.call_function(aten.type_as.default, (result, current))
        if isinstance(val, torch.Tensor):
            return self.graph.call_method("to", (result, val.dtype))
        return self.graph.call_method("type_as", (result, current))

    def _setitem_value(self, node: Node, form: Any, current: Node, args: tuple) -> Node | None:
        _, index, value = form.args
        base_val = example_value(form.mutated)
        rank = base_val.dim() if isinstance(base_val, torch.Tensor) else None
        plan = plan_index(index, rank)
        if plan is None:
            self._refuse(node, f"index {index!r} cannot be decomposed exactly", form)
            return None
        value_kind = is_tensor(value)
        if value_kind is None and isinstance(value, Node):
            self._refuse(node, "the assigned value is not known to be a tensor or a number", form)
            return None
        graph = self.graph
        intermediates = [current]
        for step in plan.steps:
            intermediates.append(apply_step(graph, intermediates[-1], step))
        view = intermediates[-1]
        new_value = args[2]
        if plan.advanced:
            indices = [
                None
                if entry is None
                else graph.call_function(torch.tensor, (list(entry),))
                if isinstance(entry, (list, tuple))
                else self.current(entry)
                for entry in plan.advanced
            ]
            if not value_kind:
                new_value = graph.call_method("new_full", (view, (), new_value))
            new_view = graph.call_function(aten.index_put.default, (view, indices, new_value))
        elif value_kind:
            new_view = graph.call_function(aten.copy.default, (view, new_value))
        else:
            new_view = graph.call_function(aten.fill.Scalar, (view, new_value))
        for step, base in zip(reversed(plan.steps), reversed(intermediates[:-1])):
            new_view = scatter_step(graph, base, new_view, step)
        return new_view

    # mutations of inputs and buffers

    def mutated_roots(self) -> list[_Root]:
        return [r for r in self.roots if r.mutated and r.observable]


def _record_mutations(graph: Graph, roots: list[_Root]) -> None:
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
            out_spec=pytree.TreeSpec(tuple, None, [out_spec] + [leaf] * (extra + len(roots)))
        )
        next_index = extra + 1
    else:
        values = list(output.args[0]) if records else [output.args[0]]
        next_index = len(values)
    for root in roots:
        kind = "USER_INPUT_MUTATION" if root.node.op == "placeholder" else "BUFFER_MUTATION"
        records.append(
            {
                "kind": kind,
                "target": root.node.target,
                "node": root.value.name,
                "output_index": next_index,
            }
        )
        next_index += 1
        values.append(root.value)
    output.args = (tuple(values),)
    output.meta[MUTATIONS_KEY] = records


def _record_exported_mutations(exported_program: Any, roots: list[_Root]) -> None:
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
    for root in roots:
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
        new_spec = OutputSpec(kinds[spec.kind], TensorArgument(name=root.value.name), target)
        signature.output_specs.insert(first_user, new_spec)
        values.insert(first_user, root.value)
        first_user += 1
    output.args = (tuple(values),)


def _propagate_values(graph: Graph, original: set[Node]) -> None:
    """Computes ``meta["val"]`` of the new nodes when the graph's nodes carry fake values."""
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

    with mode:
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


def remove_inplace(
    graph: Graph,
    exported_program: Any = None,
    verbose: int = 0,
    exc: bool = True,
    recursive: bool = False,
    observable: bool = True,
) -> int:
    """Rewrites every in-place operation of a graph into its functional form.

    Later uses of a mutated tensor, of its base and of its other views are re-routed to
    the new value. Writes into graph inputs or buffers are kept observable (see the
    module docstring for the convention), unless ``observable=False``.

    :param graph: graph to modify in place (torch-level or aten-level)
    :param exported_program: the ``ExportedProgram`` owning ``graph``, if any; its graph
        signature is updated with the new mutation outputs
    :param verbose: verbosity
    :param exc: raise :class:`InplaceRemovalError` when an in-place node cannot be
        removed; otherwise leave it and return a negative count
    :param recursive: also process subgraphs stored as submodules (cond/scan branches)
    :param observable: with True, a write into a graph input or a buffer becomes an
        extra output; with False, such writes stay in-place (the graph keeps its
        output structure and eager's side effects) and count as left
    :return: number of rewritten nodes, or ``-k`` if ``k`` in-place nodes were left
        (only with ``exc=False``)
    """
    return _remove_inplace(graph, exported_program, verbose, exc, recursive, observable)


def _remove_inplace(
    graph: Graph,
    exported_program: Any,
    verbose: int,
    exc: bool,
    recursive: bool,
    allow_observable: bool,
) -> int:
    changed, left = 0, 0
    owner = graph.owning_module
    if recursive and owner is not None:
        for node in graph.nodes:
            if node.op != "get_attr":
                continue
            try:
                sub = owner.get_submodule(node.target)
            except AttributeError:
                continue
            if isinstance(sub, torch.fx.GraphModule):
                result = _remove_inplace(sub.graph, None, verbose, exc, True, False)
                sub.recompile()
                if result < 0:
                    left -= result
                else:
                    changed += result
    remover = _InplaceRemover(graph, verbose, exc, allow_observable)
    original = set(graph.nodes)
    changed += remover.run()
    _propagate_values(graph, original)
    left += remover.left
    roots = remover.mutated_roots()
    if roots:
        if exported_program is not None:
            _record_exported_mutations(exported_program, roots)
        else:
            _record_mutations(graph, roots)
    graph.lint()
    if owner is not None:
        owner.recompile()
    if verbose:
        print(f"[remove_inplace] {changed} node(s) rewritten, {left} left")
    return -left if left else changed
