"""Whether a loop region's steps are one computation: the plan of the scan replacing
them.

:func:`plan_scan` compares the steps a loop region recorded (see :mod:`.loops`): each
step must record the same operations, on the same values from before the loop, on
its own index, and on values of the step just before (the *carried* values: ``h`` in
``h = a[:, i] * h + x[:, i]``; their first step reads them from before the loop). The
values the operations compute must have the same shapes at every step. The index may
only select one slice of a tensor from before the loop (``x[:, i]``, ``x[i + 1]``,
``x.select(1, i)``, ``x.narrow(1, i, 1)``: the scan then runs over that tensor's axis)
or write one slice or chunk of a new tensor (``out[:, i] = h``,
``out[:, c*i : c*(i + 1)] = h``). :func:`without_first_step` is the region of the steps
after the first, planned when the first step differs from the others.

:mod:`.scan_emission` then writes the scan the plan describes.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import sympy
import torch
from torch.fx.node import Node

from .loops import (
    LoopRegion,
    ProxyToken,
    changed_locals,
    linear_in,
    loop_index,
    loop_stacked,
)


@dataclasses.dataclass
class StepWrite:
    """``out[item] = value`` in each step: the step writes the rows ``c*i + b`` of
    ``out``'s ``axis`` (``c`` of them for a ``chunk``, one otherwise)."""

    out: Node
    axis: int
    item: tuple
    #: the position in ``item`` of what reads the index
    position: int
    value: Node
    c: int = 1
    b: int = 0
    chunk: bool = False


@dataclasses.dataclass
class ScanPlan:
    """What :func:`plan_scan` found in a region whose steps are one computation."""

    #: each step's compared nodes (no ``size`` nor ``get_attr``: shared between steps)
    steps: list[list[Node]]
    #: carried values: position in a step -> the node before the loop it starts from
    carries: dict[int, Node]
    #: positions where the index selects a slice: position -> (tensor, axis, rest, offset)
    #: where ``rest`` is what indexes the slice after it (None: the slice itself;
    #: "narrow": the slice with the axis kept) and ``offset`` is added to the index
    #: (``x[i + 1]``)
    selections: dict[int, tuple[Node, int, Any, int]]
    #: positions where a step writes its slice of a tensor made before the loop
    #: (``out[:, i] = value``, ``out[:, c*i + b : c*i + b + c] = value``)
    writes: dict[int, StepWrite] = dataclasses.field(default_factory=dict)
    #: where each operand of the steps comes from (the scan hoists invariants with it)
    operands: Any = None
    #: positions of the values the steps compute from their index, ``c*i + b``: read by
    #: selections and writes, which the scan does without, and by ``numbers``
    index_values: set[int] = dataclasses.field(default_factory=set)
    #: positions of the tensor operations taking the index, or ``c*i + b``, as a number
    #: (``h + i``): the body gets the index as a 0-d tensor and computes them
    numbers: set[int] = dataclasses.field(default_factory=set)


class _NotUniform(Exception):
    """The steps differ (the message says where)."""


def is_size(node: Node) -> bool:
    """Whether ``node`` reads one size of a tensor (``x.size(d)``)."""
    return node.op == "call_method" and node.target == "size" and len(node.args) == 2


def _compared(nodes: list[Node], graph) -> list[Node]:
    return [
        n
        for n in nodes
        if not getattr(n, "_erased", False)
        and n.graph is graph
        and n.op != "get_attr"
        and not is_size(n)
        and n.target is not loop_index
        and n.target is not loop_stacked
    ]


#: what each step's index symbol becomes in :func:`value_key`
_INDEX = sympy.Symbol("loop_index", integer=True)


def value_key(val: Any, index: dict | None = None) -> Any:
    """What must be equal in the values two steps compute: shapes (the step's index
    written ``loop_index``: ``x.narrow(1, i, 1)`` has size ``Min(1, s - i)``, which
    the scan's slice of size 1 replaces), dtypes, devices."""

    def expr(s: Any) -> Any:
        return s if isinstance(s, int) else s.node.expr.xreplace(index or {})

    if isinstance(val, torch.Tensor):
        return ("tensor", tuple(expr(s) for s in val.shape), val.dtype, val.device.type)
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", expr(val))
    if isinstance(val, (tuple, list)):
        return ("seq", tuple(value_key(v, index) for v in val))
    return ("py", type(val).__name__)


class _Operands:
    """Operands of a step's nodes written independently of the step: ``("local", p)``
    a value of the same step, ``("prev", p)`` of the step before, ``("index",)`` the
    step's index, ``("outer", node)`` a value from before the loop."""

    def __init__(self, steps: list[list[Node]], index_nodes: list[Node]):
        self.where = {n: (k, p) for k, nodes in enumerate(steps) for p, n in enumerate(nodes)}
        self.index_of = {n: k for k, n in enumerate(index_nodes)}
        self.symbols = [{n.meta["val"].node.expr: _INDEX} for n in index_nodes]

    def of(self, value: Any, step: int) -> Any:
        if isinstance(value, Node):
            return self._node(value, step)
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, tuple(self.of(v, step) for v in value))
        if isinstance(value, dict):
            return ("dict", tuple((k, self.of(v, step)) for k, v in value.items()))
        if isinstance(value, slice):
            return ("slice", self.of(value.start, step), self.of(value.stop, step),
                    self.of(value.step, step))  # fmt: skip
        try:
            hash(value)
        except TypeError:
            return ("const", type(value).__name__, repr(value))
        return ("const", type(value).__name__, value)

    def _node(self, node: Node, step: int) -> Any:
        if node in self.index_of:
            if self.index_of[node] != step:
                raise _NotUniform(f"step {step} reads the index of step {self.index_of[node]}")
            return ("index",)
        if node.op == "get_attr":
            return ("attr", node.target)
        if is_size(node):
            return ("size", self.of(node.args[0], step), node.args[1])
        where = self.where.get(node)
        if where is None:
            return ("outer", node)
        other, position = where
        if other == step:
            return ("local", position)
        if other == step - 1:
            return ("prev", position)
        raise _NotUniform(
            f"step {step} reads `{node.name}` of step {other}, {step - other} steps back"
        )

    def signature(self, node: Node, step: int) -> tuple:
        return (
            node.op,
            node.target,
            self.of(node.args, step),
            self.of(node.kwargs, step),
            value_key(node.meta.get("val"), self.symbols[step]),
        )


def _unify(first: Any, second: Any, carries: dict[int, Node]) -> bool:
    """Whether an operand of step 0 and the same operand of step 1 are one: equal, or a
    value from before the loop where step 1 reads the step before (a carried value,
    recorded in ``carries``)."""
    if first == second:
        return True
    if not (isinstance(first, tuple) and isinstance(second, tuple)):
        return False
    if len(first) == 2 and first[0] == "outer" and second[0] == "prev":
        return carries.setdefault(second[1], first[1]) is first[1]
    return len(first) == len(second) and all(_unify(a, b, carries) for a, b in zip(first, second))


def _where(node: Node) -> str:
    trace = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("File "):
            return line.split(",")[0][5:].strip('"') + ":" + line.split("line ")[-1].split(",")[0]
    return node.name


def plan_scan(region: LoopRegion) -> ScanPlan | str:
    """The plan of the scan replacing a closed region, or why there is none."""
    count = region.count
    if count < 2:
        return (
            f"the example runs it {count} time{'' if count == 1 else 's'}; at least 2 steps "
            f"are needed to check that each step computes the same thing"
        )
    changed = _changed_locals(region, proxies=False)
    if changed:
        return f"the Python value of {changed} changes from one step to the next"
    steps = [_without_dead_scalars(_compared(nodes, region.graph)) for nodes in region.steps]
    operands = _Operands(steps, region.index_nodes)
    try:
        signatures = [[operands.signature(n, k) for n in nodes] for k, nodes in enumerate(steps)]
    except _NotUniform as e:
        return str(e)
    carries: dict[int, Node] = {}
    for k in range(1, count):
        if len(signatures[k]) != len(signatures[k - 1]):
            return (
                f"step {k - 1} records {len(signatures[k - 1])} operations and step {k} "
                f"{len(signatures[k])}"
            )
        for position, (a, b) in enumerate(zip(signatures[k - 1], signatures[k])):
            same = _unify(a, b, carries) if k == 1 else a == b
            if not same:
                node = steps[k][position]
                return f"steps {k - 1} and {k} differ at `{node.name}` ({_where(node)})"
    changed = _changed_locals(region, proxies=True)
    if changed:
        verb = "takes" if ", " not in changed else "take"
        return (
            f"{changed} {verb} a tensor from one step to the next that the step does not "
            f"compute (values exchanged in Python)"
        )
    for position, init in carries.items():
        if not isinstance(init.meta.get("val"), torch.Tensor):
            return f"it carries `{init.name}`, which is not a tensor, from one step to the next"
        if value_key(init.meta["val"]) != value_key(steps[0][position].meta.get("val")):
            return f"`{init.name}` does not keep its shape from one step to the next"
    plan = ScanPlan(steps, carries, {}, operands=operands)
    offsets, numeric = _index_values(plan, region.index_nodes[1])
    for position, node in enumerate(steps[1]):
        if position not in plan.index_values:
            why = _place(plan, position, node, region, offsets, numeric)
            if why is not None:
                return why
    if (overlapping := _overlapping_writes(plan)) is not None:
        return f"the steps write `{overlapping.name}` at rows of several offsets"
    for position in plan.index_values:
        for user in steps[1][position].users:
            p = operands.where.get(user, (None, None))[1]
            if p not in {*plan.index_values, *plan.selections, *plan.writes, *plan.numbers}:
                where = _where(user)
                return f"the index is used by `{user.name}`, not to select one slice ({where})"
    return plan


def _index_values(plan: ScanPlan, index: Node) -> tuple[dict[Node, tuple], set[Node]]:
    """The numbers a step computes from its index, filed in ``plan.index_values``:
    ``{node: (c, b)}`` for those of the form ``c*i + b`` (which select slices), and the
    set of all of them, the index included, with the others (``i % 2``, ``i * 0.5``:
    numbers the tensor operations of the step may take, see :func:`_index_number`)."""
    offsets: dict[Node, tuple] = {index: (1, 0)}
    numeric = {index}
    symbol = index.meta["val"].node.expr
    for position, node in enumerate(plan.steps[1]):
        val = node.meta.get("val")
        found = linear_in(val.node.expr, symbol) if isinstance(val, torch.SymInt) else None
        if found is not None and any(n in offsets for n in node.all_input_nodes):
            offsets[node] = found
        elif not _index_number(node, numeric):
            continue
        numeric.add(node)
        plan.index_values.add(position)
    return offsets, numeric


#: Python's arithmetic operators, which compute from a 0-d tensor as from a number
_ARITHMETIC = {
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.floordiv,
    operator.mod,
    operator.pow,
}
#: what computes a number from the index (``i % 2``, ``i * 0.5``, ``-i``) as it would
#: from a 0-d tensor holding it
_INDEX_ARITHMETIC = {*_ARITHMETIC, operator.neg}


def _index_number(node: Node, numeric: set[Node]) -> bool:
    """Whether ``node`` is a Python number computed from numbers of the index
    (``numeric``) and constants by arithmetic: the body computes it from the index it
    scans, a 0-d tensor (``i % 2`` and ``i // 2`` exactly, ``i * 0.5`` in the default
    float dtype, where Python computes in double before the tensor operation rounds)."""
    if node.op != "call_function" or node.target not in _INDEX_ARITHMETIC or node.kwargs:
        return False
    if not isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat)):
        return False
    inputs = node.all_input_nodes
    constants = [a for a in node.args if not isinstance(a, Node)]
    return (
        bool(inputs)
        and all(n in numeric for n in inputs)
        and all(type(c) in (int, float) for c in constants)
    )


def _place(
    plan: ScanPlan,
    position: int,
    node: Node,
    region: LoopRegion,
    offsets: dict,
    numeric: set[Node],
):
    """Files the node at ``position`` of a step under what the scan makes of it: a
    selection or a write at the index, a tensor operation taking a number of the index
    (``h + i``, ``h + i % 2``), or a node of the body; returns why the loop is no scan,
    or None."""
    operands, carries = plan.operands, plan.carries
    if not any(n in numeric for n in node.all_input_nodes):
        if _writes_in_place(node) and not _writes_into_its_own(node, operands):
            return f"`{node.name}` writes in place ({_where(node)})"
        return None
    if takes_index_as_number(node, numeric):
        plan.numbers.add(position)
        return None
    if not any(n in offsets for n in node.all_input_nodes):
        # a number of the index that is no `c*i + b` used otherwise (`x[i % 2]`): the
        # check of the uses of the index refuses it
        return None
    if node.target is operator.setitem:
        write = _write(node, region, operands, carries, offsets)
        if isinstance(write, str):
            return write
        first = write.c * region.start + write.b
        plan.writes[position] = write
    else:
        selection = _selection(node, offsets, operands)
        if isinstance(selection, str):
            return selection
        first = region.start + selection[3]
        plan.selections[position] = selection
    if first < 0:
        # `x[i - 1]` at i = 0 is the last row: no slice of rows a scan reads
        return f"`{node.name}` reads row {first} at the first index ({_where(node)})"
    return None


#: tensor operations taking a number where the index goes (``h + i``, ``x * (i + 1)``):
#: with the index a 0-d int64 tensor instead, they compute the same values in the same
#: dtype (a 0-d tensor promotes as a Python number does)
_NUMBER_OPERATORS = {
    *_ARITHMETIC,
    torch.add,
    torch.sub,
    torch.mul,
    torch.div,
    torch.pow,
    torch.true_divide,
    torch.floor_divide,
    torch.remainder,
    torch.rsub,
}
#: the same as tensor methods (``h.add(i)``; ``h.__add__(i)`` and ``2 - h`` are recorded
#: as the operators)
_NUMBER_METHODS = {"add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "pow"}


def takes_index_as_number(node: Node, offsets: Any) -> bool:
    """Whether ``node`` is a tensor operation (its value a tensor, an operand a tensor)
    taking the index, or a number computed from it (``offsets``: those nodes), as a
    number among its direct operands: the scan gives the body its index as a 0-d
    tensor, which the operation takes as well."""
    if node.kwargs or not isinstance(node.meta.get("val"), torch.Tensor):
        return False
    if node.op == "call_function":
        known = node.target in _NUMBER_OPERATORS
    else:
        known = node.op == "call_method" and node.target in _NUMBER_METHODS
    if not known or any(n in offsets for n in node.all_input_nodes if n not in node.args):
        return False
    tensors = [a for a in node.args if isinstance(a, Node) and a not in offsets]
    return bool(tensors) and all(isinstance(a.meta.get("val"), torch.Tensor) for a in tensors)


def _overlapping_writes(plan: ScanPlan) -> Node | None:
    """A tensor the steps write at rows of several offsets (``out[i - 1]``, then
    ``out[i]``), else None: the rows overlap from one step to the next, and written
    after the scan one write would win over the other where eager's last step does."""
    rows: dict[Node, tuple] = {}
    for write in plan.writes.values():
        at = (write.axis, write.c, write.b)
        if rows.setdefault(write.out, at) != at:
            return write.out
    return None


def without_first_step(region: LoopRegion) -> LoopRegion:
    """The steps of ``region`` after the first, as a region of their own (the region is
    left as it is): what :func:`plan_scan` compares when the first step differs from
    the others and runs before the scan, kept apart. Its frame is what the others
    start from."""
    return dataclasses.replace(
        region,
        steps=region.steps[1:],
        index_nodes=region.index_nodes[1:],
        frames=region.frames[1:],
        count=region.count - 1,
        before=region.frames[0] if region.frames else None,
        start=region.start if region.reverse else region.start + 1,
        apart=region.steps[0],
    )


_SCALARS = (torch.SymInt, torch.SymBool, torch.SymFloat)


def _without_dead_scalars(nodes: list[Node]) -> list[Node]:
    """``nodes`` without the symbolic numbers nothing reads: what a decision compared
    (``i == 0``, decided by Python; in the steps after the first the index's bounds
    decide it without recording anything else), which the scan needs no more than the
    unrolled steps do."""
    dead: set[Node] = set()
    for node in reversed(nodes):
        if isinstance(node.meta.get("val"), _SCALARS) and all(u in dead for u in node.users):
            dead.add(node)
    return [n for n in nodes if n not in dead]


def _writes_into_its_own(node: Node, operands: _Operands) -> bool:
    """Whether an in-place ``node`` writes into a new tensor its own step made
    (``t = s.clone(); t[::2] = ...``): no other step nor anything before the loop sees
    the write, the body repeats it."""
    written = node.args[0] if node.args else None
    if not isinstance(written, Node):
        return False
    where = operands.where.get(written)
    if where is None or where[0] != operands.where[node][0]:
        return False
    try:
        return written.target in _FRESH
    except TypeError:
        return False


def names_set_apart(before: dict[str, Any], after: dict[str, Any], plan: ScanPlan) -> list[str]:
    """The names of the loop's frame whose value after the first step (``after``) is
    not what a scan of no step leaves them (``before``): the same value, or a state
    whose first value it is."""
    position = {n: p for p, n in enumerate(plan.steps[0])}

    def kept(old: Any, new: Any) -> bool:
        if isinstance(new, ProxyToken):
            if isinstance(old, ProxyToken) and old.node is new.node:
                return True
            p = position.get(new.node)
            if new.node.target is loop_index or (p is not None and p not in plan.carries):
                # not a value the scan gives: a use after the loop unrolls it
                return True
            return p is not None and isinstance(old, ProxyToken) and plan.carries[p] is old.node
        if type(old) is tuple and type(new) is tuple and len(old) == len(new):
            return all(kept(o, n) for o, n in zip(old, new))
        return old == new

    return sorted(n for n, t in after.items() if n in before and not kept(before[n], t))


def _changed_locals(region: LoopRegion, proxies: bool) -> str:
    """The names of the loop's frame whose value changes between steps (see
    :func:`~.loops.changed_locals`), quoted, or an empty string."""
    changed = set()
    for k in range(1, len(region.frames)):
        recorded = {*region.steps[k], region.index_nodes[k]} if proxies else None
        changed.update(changed_locals(region.frames[k - 1], region.frames[k], recorded))
    return ", ".join(f"`{n}`" for n in sorted(changed))


def _writes_in_place(node: Node) -> bool:
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return node.target is operator.setitem or (name.endswith("_") and not name.endswith("__"))


_SELECT = ("select",)
_NARROW = ("narrow",)


def _selection(node: Node, offsets: dict, operands: _Operands) -> tuple | str:
    """(tensor, axis, rest, offset) when ``node`` selects the slice ``i + offset`` of a
    tensor from before the loop (``offsets``: the index and the values the step computes
    from it, see :func:`plan_scan`), else why the index cannot be scanned over."""
    why = f"the index is used by `{node.name}`, not to select one slice ({_where(node)})"
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    args, kwargs = node.args, node.kwargs
    if kwargs or not args or not isinstance(args[0], Node):
        return why
    if node.target is not operator.getitem and name not in _SELECT + _NARROW:
        return why
    source = args[0]
    if source in offsets or (
        operands.where.get(source) is not None and not _invariant(source, operands)
    ):
        return f"the index selects from `{source.name}`, computed in the loop ({_where(node)})"
    val = source.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() == 0:
        return why
    if node.target is operator.getitem:
        return _item_selection(args[1], source, offsets, val.dim()) or why
    moved = _offset(args[2], offsets) if len(args) > 2 else None
    if moved is None or type(args[1]) is not int:
        return why
    if name in _SELECT and len(args) == 3:
        return source, args[1] % val.dim(), None, moved
    if name in _NARROW and len(args) == 4 and args[3] == 1 and moved == 0:
        # at the index itself only: the tracer records `narrow(d, i, 1)` as a select
        # of size 1 (see loop_slice), other narrows have sizes `Min(1, n - i - b)`
        return source, args[1] % val.dim(), "narrow", moved
    return why


def _offset(value: Any, offsets: dict) -> int | None:
    """``b`` when ``value`` is the index plus ``b`` (see :func:`plan_scan`), else None."""
    found = offsets.get(value) if isinstance(value, Node) else None
    return found[1] if found is not None and found[0] == 1 else None


def _reads_index(value: Any, offsets: dict) -> bool:
    return any(isinstance(v, Node) and v in offsets for v in _leaves(value))


def _leaves(value: Any) -> list:
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, slice):
        return [value.start, value.stop, value.step]
    return [value]


def _invariant(node: Node, operands: _Operands) -> bool:
    """Whether a node of a step computes the same value at every step: made from values
    from before the loop only (``x[:, 0]`` in ``x[:, 0][i]``), nothing written; the
    scan reads it computed once before the loop (:func:`_hoisted`)."""
    step = operands.where[node][0]
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        if _writes_in_place(current) or current.op not in ("call_function", "call_method"):
            return False
        for value in current.all_input_nodes:
            if value in operands.index_of:
                return False
            where = operands.where.get(value)
            if where is not None and where[0] != step:
                return False
            if where is not None:
                pending.append(value)
    return True


def _item_selection(item: Any, source: Node, offsets: dict, ndim: int) -> tuple | None:
    """(source, axis, rest, offset) for ``source[item]`` selecting the index plus an
    offset on one axis (see :func:`_selection`), else None."""
    moved = _offset(item, offsets)
    if moved is not None:
        return source, 0, None, moved
    if not isinstance(item, tuple) or sum(1 for i in item if _offset(i, offsets) is not None) != 1:
        return None
    q = next(j for j, i in enumerate(item) if _offset(i, offsets) is not None)
    moved = _offset(item[q], offsets)
    full = slice(None, None, None)
    before, after = item[:q], item[q + 1 :]
    # a None after the index (``gate[:, :, t, None]``) adds an axis to the slice; an int
    # before it (``x[0, t]``) is taken from the slice as from the tensor
    if any(isinstance(i, Node) for i in after) or any(
        i is not Ellipsis and i != full and type(i) is not int for i in before
    ):
        return None
    if any(isinstance(i, slice) and any(isinstance(v, Node) for v in (i.start, i.stop, i.step))
           for i in after):  # fmt: skip
        return None
    axis = q if Ellipsis not in before else ndim - sum(i is not None for i in after) - 1
    rest = before + after
    if all(i is Ellipsis or i == full for i in rest):
        return source, axis, None, moved
    return source, axis, tuple(rest), moved


def _chunk_item(item: Any, offsets: dict) -> tuple[int, int, int] | None:
    """(axis, c, b) for an item writing the rows ``c*i + b`` to ``c*i + b + c`` of one
    axis (``out[:, c*i : c*(i + 1)]``, full slices before it, nothing read from the
    index after it), else None."""
    items = item if isinstance(item, tuple) else (item,)
    full = slice(None, None, None)
    axis = next((k for k, one in enumerate(items) if one != full), None)
    if axis is None or not isinstance(items[axis], slice):
        return None
    one = items[axis]
    start, stop = (offsets.get(v) if isinstance(v, Node) else None for v in (one.start, one.stop))
    if start is None or stop is None or one.step not in (None, 1):
        return None
    c, b = start
    if stop != (c, b + c) or _reads_index(items[axis + 1 :], offsets):
        return None
    return axis, c, b


#: what makes a new tensor: writing into it cannot change another value
_FRESH = {
    torch.zeros, torch.zeros_like, torch.empty, torch.empty_like, torch.ones, torch.ones_like,
    torch.full, torch.full_like, torch.clone, "new_zeros", "new_empty", "new_ones", "new_full",
    "clone", "zeros_like", "empty_like",
}  # fmt: skip


def _write(
    node: Node, region: LoopRegion, operands: _Operands, carries: dict[int, Node], offsets: dict
) -> StepWrite | str:
    """The write ``out[:, i + b] = value`` or ``out[:, c*i + b : c*i + b + c] = value``
    (a chunk) where ``out`` is a new tensor made before the loop and only written by
    the loop's steps, and ``value`` is computed by the step or carried into it (``out[i]
    = h`` before ``h`` is updated), else why not."""
    out, item, value = node.args
    why = f"`{node.name}` writes with the index ({_where(node)})"
    if not isinstance(value, Node):
        return f"{why} a value not computed in the step"
    if not isinstance(out, Node) or operands.where.get(out) is not None:
        return why
    try:
        fresh = out.op in ("call_function", "call_method") and out.target in _FRESH
    except TypeError:
        fresh = False
    if not fresh:
        return f"{why} into `{out.name}`, which is not a new tensor made for it"
    # the first step kept apart writes before the scan does
    writers = {
        n for nodes in (*region.steps, region.apart) for n in nodes if n.target is operator.setitem
    }
    if any(u not in writers for u in out.users):
        return f"{why} into `{out.name}`, which is also read while the loop writes it"
    step, position = (
        operands.where.get(value, (None, None)) if isinstance(value, Node) else (None, None)
    )
    if not (step == 1 or (step == 0 and position in carries)):
        return f"{why} a value not computed in the step"
    items = item if isinstance(item, tuple) else (item,)
    if any(i is None for i in items):
        return why
    chunk = _chunk_item(items, offsets)
    if chunk is not None:
        axis, c, b = chunk
        return StepWrite(out, axis, items, axis, value, c, b, chunk=True)
    selection = _item_selection(item, out, offsets, out.meta["val"].dim())
    if selection is None:
        return why
    _, axis, _, b = selection
    position = next(k for k, i in enumerate(items) if _offset(i, offsets) is not None)
    if any(type(i) is int for i in items[:position]):
        return why  # `out[0, i] = value`: the rows of the write are another axis of `out`
    return StepWrite(out, axis, items, position, value, b=b)


def outside_use_refusal(region: LoopRegion, node: Node | None, what: str) -> str | None:
    """Why a use of the region's ``node`` (every use after the region when None) is not
    one a scan gives, or None."""
    plan = region.plan
    last = region.count - 1
    inside = set(region.index_nodes).union(*map(set, region.steps))
    carried = {plan.steps[last][p] for p in plan.carries}
    nodes = [node] if node is not None else [n for n in inside if not getattr(n, "_erased", False)]
    for n in nodes:
        if n.target is loop_stacked:
            continue
        if node is None and all(u in inside for u in n.users):
            continue
        if n in carried:
            continue
        if (n.op == "get_attr" or is_size(n)) and (
            not isinstance(n.args[0] if n.args else None, Node)
            or n.args[0] not in inside
            or n.args[0] in carried
        ):
            continue
        step, _ = region.outputs.get(n, (None, None))
        if n in region.index_nodes:
            return f"its index is used after it by {what}"
        which = f"of step {step}" if step is not None else "computed in it"
        return f"`{n.name}` {which} is used after it by {what}, not a value a scan gives"
    return None
