"""The walk of ``remove_inplace``: storages, their aliasing classes and the rewrites.

The walk visits the graph once in order and keeps, for every tensor node, the *root*
(storage) it shares and the chain of views leading from the root to it. Writing into a
node computes the functional value (``add_`` -> ``add``, ``x[i] = v`` -> ``copy`` or
``index_put``), writes it back into the root through the chain (``slice_scatter``,
``select_scatter``, the bounds of a ``split`` element, inverse permutations...) and bumps
the root's version. A later use of a node created before the write is re-routed to the
new value, re-running its views on the root's new value when needed (once per node and
version).

Roots that may share storage without a known view relation (inputs aliasing each other,
results that may alias their inputs) form one aliasing *class*. A write into a class is
rewritten only when no other member is read afterwards, and, unless the written root is
itself an input or a buffer, when no member is owned by the caller. Everything else is
left in place (the graph stays correct: a kept write mutates the current value).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Graph, Node
from torch.fx.node import map_arg

from ..node_text import describe
from ._indexing import apply_step, plan_index, scatter_step
from ._sizes import true_at_every_size
from ._targets import aten, copy_node, example_value, fetch_attr, is_tensor, module_of
from .aliasing import (
    MAY_ALIAS,
    NONTENSOR,
    VIEW,
    VIEWS,
    Alias,
    changes_metadata,
    classify,
    inplace_form,
    storage_key,
    writes,
)
from .result import Refusal

#: ``node.meta`` flag of the ``copy_`` nodes writing the final values back into the
#: mutated inputs and buffers (a later run recognizes them)
WRITE_BACK_KEY = "yobx_write_back"


class InplaceRemovalError(RuntimeError):
    """Raised by ``remove_inplace`` when an in-place node cannot be rewritten exactly."""


@dataclass(eq=False)
class Root:
    """A storage: the node creating it, its current value and its aliasing class.

    :param written: something wrote into it (rewritten or left in place)
    :param mutated: its value changed functionally (``value`` is not ``node``)
    """

    node: Node
    value: Node
    observable: bool
    last_use: int
    version: int = 0
    mutated: bool = False
    written: bool = False
    parent: Root | None = None
    members: list[Root] = field(default_factory=list)

    def find(self) -> Root:
        root = self
        while root.parent is not None:
            root = root.parent
        node = self
        while node.parent is not None and node.parent is not root:
            node.parent, node = root, node.parent
        return root

    @property
    def label(self) -> str:
        kind = "input" if self.node.op == "placeholder" else "attribute"
        return f"{kind} {self.node.target!r}" if self.observable else repr(self.node.name)


@dataclass(eq=False)
class _Info:
    root: Root
    chain: tuple[Node, ...]
    version: int


_UNKNOWN = object()


class InplaceWalk:
    """Rewrites the in-place nodes of one graph (see the module docstring).

    :param graph: the graph
    :param verbose: verbosity
    :param inputs_writable: writes into inputs and buffers are rewritten (their final
        values are collected by :meth:`final_values`); with False they are left in place
    :param assume_distinct_inputs: inputs whose storage the graph does not describe are
        assumed not to share storage with anything else
    """

    def __init__(
        self, graph: Graph, verbose: int, inputs_writable: bool, assume_distinct_inputs: bool
    ):
        self.graph = graph
        self.verbose = verbose
        self.inputs_writable = inputs_writable
        self.assume_distinct_inputs = assume_distinct_inputs
        self.infos: dict[Node, _Info] = {}
        self.aliases: dict[Node, Alias] = {}
        self.env: dict[Node, Node] = {}
        self.regenerated: dict[Node, tuple[int, Node]] = {}
        self.roots: list[Root] = []
        self.storages: dict[Any, list[Root]] = {}
        self.same_tensor: dict[Any, Root] = {}
        self.observables: list[Root] = []
        self.unknown_class: Root | None = None
        self.state_class: Root | None = None
        self.removed: list[Node] = []
        self.refused: list[Refusal] = []
        self.changed = 0
        self.pending: dict[Node, Node] = {}
        self.frozen = ""
        self.last_use: dict[Node, int] = {}

    # aliasing classes

    def _new_root(self, node: Node, observable: bool) -> Root:
        root = Root(node, node, observable, self.last_use[node])
        root.members.append(root)
        self.roots.append(root)
        self.infos[node] = _Info(root, (), 0)
        return root

    def _union(self, root: Root, other: Root) -> None:
        a, b = root.find(), other.find()
        if a is b:
            return
        if len(a.members) < len(b.members):
            a, b = b, a
        b.parent = a
        a.members.extend(b.members)
        b.members = []

    def _blocking_alias(self, root: Root, position: int) -> tuple[Root, str] | None:
        """Returns a member of the class preventing a functional write, with the reason."""
        representative = root.find()
        if len(representative.members) == 1:
            return None
        alive = [
            m
            for m in representative.members
            if m is root or m.last_use > position or m.observable or m.written
        ]
        representative.members = alive
        for member in alive:
            if member is root:
                continue
            if member.last_use > position:
                return member, "which is read later"
            if member.observable and not root.observable:
                return member, "which the caller owns"
            if member.observable and member.written:
                return member, "which is written too"
        return None

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
        """Re-runs the views of a chain on the root's current value."""
        root = info.root
        if not info.chain:
            return root.value
        view = info.chain[-1]
        cached = self.regenerated.get(view)
        if cached is not None and cached[0] == root.version:
            return cached[1]
        value = self._regenerate(_Info(root, info.chain[:-1], -1))
        for step in self.aliases[view].path:
            known = self.regenerated.get(step)
            if known is not None and known[0] == root.version and step is not view:
                value = known[1]
                continue
            value = self._copy(step, value)
            self.regenerated[step] = (root.version, value)
        return value

    def _copy(self, view: Node, parent: Node) -> Node:
        """Re-runs ``view`` on a new value of its first argument."""
        return copy_node(
            self.graph, view, lambda a: parent if a is view.args[0] else self.env.get(a, a)
        )

    # main loop

    def run(self) -> int:
        nodes = list(self.graph.nodes)
        position = {n: i for i, n in enumerate(nodes)}
        self.last_use = {n: max((position[u] for u in n.users), default=position[n]) for n in nodes}
        self._collect_pending(nodes)
        self.frozen = next(
            (
                f"{describe(n)} changes the metadata of a tensor in place"
                for n in nodes
                if changes_metadata(n)
            ),
            "",
        )
        # every input and attribute exists from the start: a write must know the
        # attributes sharing its storage even when they are read later
        for node in nodes:
            if node.op in ("placeholder", "get_attr") and not getattr(node, "_erased", False):
                self._record(node, classify(node), ())
        for index, node in enumerate(nodes):
            if getattr(node, "_erased", False) or node.op in ("placeholder", "get_attr"):
                continue
            if node.op == "output":
                with self.graph.inserting_before(node):
                    node.args = map_arg(node.args, self.current)
                break
            self._visit(node, index)
        self._erase_rewritten(nodes)
        return self.changed

    def _visit(self, node: Node, index: int) -> None:
        inputs = (node.args, node.kwargs)
        form = inplace_form(node)
        alias = classify(node, self.aliases, form)
        if form is not None and form.kind != "number":
            with self.graph.inserting_before(node):
                self._rewrite(node, form, index)
            self._record(node, alias, inputs)
            return
        written = writes(node) if node.op == "call_module" else []
        with self.graph.inserting_before(node):
            node.args = map_arg(node.args, self.current)
            node.kwargs = map_arg(node.kwargs, self.current)
        if form is not None:
            # augmented assignment on numbers: already functional in Python
            node.target = form.target
            self.changed += 1
        if written:
            module = type(module_of(node)).__name__
            self._leave(node, f"module {module} has in-place children", written)
        self._record(node, alias, inputs)

    def _collect_pending(self, nodes: list[Node]) -> None:
        """Write-backs of an earlier run: their values become the final values again."""
        for node in nodes:
            if node.meta.get(WRITE_BACK_KEY):
                self.pending[node.args[0]] = node.args[1]
                self.graph.erase_node(node)

    def _erase_rewritten(self, nodes: list[Node]) -> None:
        for node in reversed(self.removed):
            if node.users:
                node.replace_all_uses_with(self.env[node])
            self.graph.erase_node(node)
        # views whose every use was re-routed to a regenerated copy are now dead
        for node in reversed(nodes):
            if (
                node in self.regenerated
                and not getattr(node, "_erased", False)
                and not node.users
                and node.op in ("call_function", "call_method")
                and self.aliases.get(node, Alias(MAY_ALIAS)).kind in (VIEW, VIEWS)
                and not node.is_impure()
            ):
                self.graph.erase_node(node)

    # aliasing of each node

    def _attribute_root(self, node: Node) -> Root:
        """The root of a placeholder or an attribute, joined to the roots sharing storage."""
        owner = self.graph.owning_module
        same: Any = ("node", node)
        if node.op == "get_attr":
            same = ("attr", node.target)
            if owner is not None:
                try:
                    same = ("tensor", id(fetch_attr(owner, node)))
                except AttributeError:
                    same = ("attr", node.target)
        root = self.same_tensor.get(same)
        if root is not None:
            self.infos[node] = _Info(root, (), root.version)
            self.env[node] = root.value
            root.last_use = max(root.last_use, self.last_use[node])
            return root
        root = self._new_root(node, True)
        self.same_tensor[same] = root
        key = storage_key(node)
        if key is None and node.op == "get_attr" and owner is None:
            key = _UNKNOWN
        if key is None:
            key = ("distinct", node) if self.assume_distinct_inputs else _UNKNOWN
        if key is _UNKNOWN:
            # nothing says which storage it has: it may be any input or buffer
            if self.unknown_class is None:
                for other in self.observables:
                    self._union(root, other)
                self.unknown_class = root
            self._union(root, self.unknown_class)
        else:
            others = self.storages.setdefault(key, [])
            if others:
                self._union(root, others[0])
            others.append(root)
            if self.unknown_class is not None:
                self._union(root, self.unknown_class)
        if node.op == "get_attr" and self.state_class is not None:
            self._union(root, self.state_class)
        self.observables.append(root)
        return root

    def _record(self, node: Node, alias: Alias, inputs: tuple) -> None:
        """Registers the aliasing of a node given its original ``(args, kwargs)``."""
        self.aliases[node] = alias
        if alias.kind == NONTENSOR:
            return
        if node.op in ("placeholder", "get_attr"):
            if node not in self.infos and is_tensor(node) is not False:
                self._attribute_root(node)
            return
        if node in self.infos:
            # a rewritten in-place node: already the new value of what it wrote
            return
        base_info = self.infos.get(alias.base) if isinstance(alias.base, Node) else None
        if alias.kind in (VIEW, VIEWS) and base_info is not None:
            root = base_info.root
            if alias.path:
                self.infos[node] = _Info(root, (*base_info.chain, node), root.version)
            else:
                # the result is its base itself (in-place results, ``+x``, Identity)
                self.infos[node] = base_info
            root.last_use = max(root.last_use, self.last_use[node])
            return
        root = self._new_root(node, False)
        if alias.kind == "fresh":
            return
        arguments: list[Node] = []
        if alias.shares is not None:
            arguments.extend(alias.shares)
        else:
            map_arg(inputs, arguments.append)
        if isinstance(alias.base, Node):
            arguments.append(alias.base)
        for arg in arguments:
            info = self.infos.get(arg)
            if info is not None:
                self._union(root, info.root)
        if alias.module_state:
            self._join_module_state(node, root)

    def _join_module_state(self, node: Node, root: Root) -> None:
        """A module's result may be one of its parameters or buffers."""
        module = module_of(node)
        tensors = [] if module is None else [*module.parameters(), *module.buffers()]
        if module is not None and not tensors:
            return
        if self.state_class is None:
            self.state_class = root
            for other in self.observables:
                if other.node.op == "get_attr":
                    self._union(root, other)
        else:
            self._union(root, self.state_class)

    # rewriting

    def _leave(self, node: Node, reason: str, written: list[Any]) -> None:
        """Keeps a writing node as it is; what it writes is marked as written."""
        message = f"cannot remove in-place {describe(node)}: {reason}"
        if self.verbose:
            print(f"[remove_inplace] {message}")
        self.refused.append(Refusal(node.name, message))
        node.args = map_arg(node.args, self.current)
        node.kwargs = map_arg(node.kwargs, self.current)
        for target in written:
            info = self.infos.get(target)
            if info is not None:
                info.root.written = True
                info.root.last_use = max(info.root.last_use, self.last_use[node])

    def _rewrite(self, node: Node, form: Any, index: int) -> None:
        mutated = form.mutated if isinstance(form.mutated, Node) else None
        written = [mutated] if mutated is not None else list(node.all_input_nodes)
        if form.kind == "unsupported":
            self._leave(node, form.reason, written)
            return
        if self.frozen:
            self._leave(node, self.frozen, written)
            return
        info = self.infos.get(mutated)
        if info is None:
            self._leave(node, "the mutated value is not a tracked tensor", written)
            return
        root = info.root
        scatters = [self.aliases[v].scatter for v in info.chain]
        if None in scatters:
            blocked = info.chain[scatters.index(None)]
            reason = f"it writes through {blocked.name!r} which cannot be inverted"
            self._leave(node, reason, written)
            return
        blocking = self._blocking_alias(root, index)
        if blocking is not None:
            other, why = blocking
            reason = f"the mutated tensor may share storage with {other.label} {why}"
            self._leave(node, reason, written)
            return
        if root.observable and not self.inputs_writable:
            self._leave(node, f"it writes into {root.label} (kept in place)", written)
            return
        if form.kind == "out" and info.chain:
            self._leave(node, "out= tensor is a view", written)
            return
        new_value = self._functional_value(node, form, self.current(mutated))
        if new_value is None:
            return
        value = new_value
        for position in range(len(info.chain) - 1, -1, -1):
            view = info.chain[position]
            base = self._regenerate(_Info(root, info.chain[:position], -1))
            value = scatters[position](self.graph, view, base, value)
        root.value = value
        root.version += 1
        root.mutated = root.written = True
        root.last_use = max(root.last_use, self.last_use[node])
        # the written view is read again as a view of the root's new value, not as
        # ``new_value``: a write left in place later must reach the root's storage
        self.env[node] = new_value
        self.infos[node] = _Info(root, info.chain, -1)
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
        result = graph.create_node(form.op, form.target, tuple(args), kwargs)
        if form.kind == "out" or form.cast:
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
            self._leave(node, f"index {index!r} cannot be decomposed exactly", [form.mutated])
            return None
        value_kind = is_tensor(value)
        if value_kind is None and isinstance(value, Node):
            reason = "the assigned value is not known to be a tensor or a number"
            self._leave(node, reason, [form.mutated])
            return None
        graph = self.graph
        intermediates = [current]
        for step in plan.steps:
            intermediates.append(apply_step(graph, intermediates[-1], step))
        view = intermediates[-1]
        new_value = args[2]
        if value_kind:
            new_value = self._strip_leading_ones(new_value, value, _view_rank(rank, plan))
        if plan.advanced:
            indices = [
                None
                if entry is None
                else graph.call_function(torch.tensor, (list(entry),))
                if isinstance(entry, (list, tuple))
                else self.current(entry)
                for entry in plan.advanced
            ]
            if value_kind:
                # index_put needs the destination's dtype, __setitem__ casts
                new_value = graph.call_method("type_as", (new_value, view))
            else:
                new_value = graph.call_method("new_full", (view, (), new_value))
            if _scalar_mask(plan):
                # torch indexes with a 0-d mask as x[None][m[None]] (the mask's count of
                # true values, 0 or 1, selects all of x or nothing); index_put would
                # raise on a 0-d x, or take the mask for an index of x's first axis
                view = graph.call_function(aten.unsqueeze.default, (view, 0))
                indices = [graph.call_function(aten.unsqueeze.default, (indices[0], 0))]
            new_view = graph.call_function(aten.index_put.default, (view, indices, new_value))
            if _scalar_mask(plan):
                new_view = graph.call_function(aten.squeeze.dim, (new_view, 0))
        elif value_kind:
            new_view = graph.call_function(aten.copy.default, (view, new_value))
        else:
            new_view = graph.call_function(aten.fill.Scalar, (view, new_value))
        for step, base in zip(reversed(plan.steps), reversed(intermediates[:-1])):
            new_view = scatter_step(graph, base, new_view, step)
        return new_view

    def _strip_leading_ones(self, value: Node, original: Node, view_rank: int | None) -> Node:
        """``x[i] = v`` drops the leading dimensions of size 1 of ``v`` before copying
        (``x[0] = y[None]`` works): ``squeeze(0)`` removes one when its size is 1.

        Only the dimensions ``v`` has beyond the view's rank need it (``view_rank``,
        None when unknown): the copy broadcasts the others, and a squeeze of a dynamic
        size that is 1 at run time would drop a real dimension of the view (``v[:n//2]
        = y[:n//2]`` at ``n=2``).
        """
        val = example_value(original)
        if not isinstance(val, torch.Tensor):
            return value
        extra = val.dim() if view_rank is None else max(0, val.dim() - view_rank)
        for size in val.shape[:extra]:
            if true_at_every_size(size != 1):
                break
            value = self.graph.call_method("squeeze", (value, 0))
        return value

    # final values of inputs and buffers

    def final_values(self) -> list[tuple[Root, Node]]:
        """``(root, final value)`` of every input or buffer whose value changed."""
        result = []
        for root in self.roots:
            if not root.observable:
                continue
            if root.node in self.pending:
                result.append((root, self.current(self.pending[root.node])))
            elif root.mutated:
                result.append((root, root.value))
        return result


def _scalar_mask(plan: Any) -> bool:
    """Whether the index ``plan`` indexes its view with one 0-d boolean tensor and
    nothing else (``x[x.sum() > 0] = v``)."""
    if len(plan.advanced) != 1 or not isinstance(plan.advanced[0], Node):
        return False
    mask = example_value(plan.advanced[0])
    return isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() == 0


def _view_rank(rank: int | None, plan: Any) -> int | None:
    """The rank of the view an index plan selects from a tensor of ``rank`` (None when
    unknown: an advanced index)."""
    if rank is None or plan.advanced:
        return None
    kinds = [step[0] for step in plan.steps]
    return rank + kinds.count("unsqueeze") - kinds.count("select")
