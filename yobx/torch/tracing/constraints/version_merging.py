"""Versions that compute alike share one branch of the joined graph.

A decision on a size often changes nothing the graph computes. ``if keys.numel() == 0:
return 0`` (transformers' ``DynamicLayer.get_seq_length``) returns ``past`` anyway when
the cache is empty, and a decode step's ``is_causal = q_length > 1 and mask is None``
is False on both sides when a mask is passed. The versions of such a decision (see
:mod:`.versions`) are then the same graph, except that the version of the empty cache
writes ``0`` where the other reads ``past``. Every branch of the joined graph costs a
whole lowering and translation when the model is exported: a decoder's four versions
(``past >= 1`` x ``seq == 1``) cost four times one, then the ONNX optimizer merges most
of them back.

:func:`merged_tree` keeps one branch for versions that compute alike. A version
``general`` computes what a version ``pinned`` computes when ``pinned``'s capture holds
some dimensions at one size below the default range (``past`` at 0, ``seq`` at 1, each
declared without ``min``, which ``general`` leaves free), and the two graphs are the same
once those sizes are put in ``general``'s:

* node for node, with the same operators, modules and constants, reading the
  corresponding values (``x + n`` and ``x.add(n)`` are one operator);
* every size argument (a node computing a size, or a number) is the same expression of
  the user's dimensions once the pinned sizes are put in (``past + seq`` and ``seq``,
  ``past`` and ``0``); size arithmetic is compared where it is read, not node for node;
* every small tensor computed from constants and sizes alone (a capture folds
  ``torch.arange(1)`` to a constant, the other computes ``torch.arange(seq)``) has the
  same value, computed at the pinned sizes, where it is read;
* every value has the same dtype, and shape in those terms.

Then ``general``'s graph, run on ``pinned``'s inputs, calls the same operators on the
same values as ``pinned``'s graph: it computes the same outputs, exactly. Its lowering
to ONNX treats the pinned sizes as every lowering treats 0 and 1 for a dimension
declared without ``min`` (torch's default range starts at 2).

The tree of choices is then rewritten: a choice between versions computing alike is
the general one; a choice whose sides choose alike next may be taken second (``seq ==
1`` before ``past >= 1``); a version computing what one side of the next choice
computes takes both conditions at once (``past >= 1 or seq >= 2``), when neither
divides (evaluated where it was not before, a condition must stay defined).

Only the routing changes: :attr:`CustomTracer.versions
<yobx.torch.tracing.CustomTracer>` still lists every version captured, each with its
conditions and constraints, and the joined graph checks what each assumes when its
conditions select it (:func:`~.versions.version_checks`). A merged version says which
version's graph computes it (:attr:`~.versions.Version.computed_by`). A graph checking
its own inputs (``CustomTracer(runtime_checks=True)``, each version asserting what it
assumes) keeps every version.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import sympy
import torch
import torch.fx

from ...passes._views import LAYOUT_KEY
from ..symbolic.expression_text import pretty
from ..symbolic.symbolic import DEFAULT_MIN
from .versions import Split, Version, VersionCondition, leaves

_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)


def merged_tree(tree: Split | Version, first: Version) -> Split | Version:
    """``tree`` with each choice between versions that compute alike replaced by the
    version computing both sides (see the module's documentation); the versions
    merged away get :attr:`~.versions.Version.computed_by`.

    The joined graph takes the ``first`` capture's inputs and sizes: a tree reduced to
    one version other than ``first`` keeps its root's choice (each version is lowered on
    its own example, :mod:`yobx.torch.onnx.version_lowering`)."""
    merger = _Merger()
    merged, pairs = merger.merged(tree)
    if isinstance(merged, Version) and merged is not first and isinstance(tree, Split):
        true, true_pairs = merger.merged(tree.true)
        false, false_pairs = merger.merged(tree.false)
        merged, pairs = Split(tree.condition, true, false), true_pairs + false_pairs
    computed_by = {id(pinned): general for general, pinned in pairs}
    for _, pinned in pairs:
        general = computed_by[id(pinned)]
        while id(general) in computed_by:  # merged in turn into another version
            general = computed_by[id(general)]
        pinned.computed_by = general
    return merged


#: a merged tree and the (general, pinned) pairs of versions it merged
_Merged = tuple[Split | Version, list[tuple[Version, Version]]]


class _Merger:
    """Merges the versions of a tree, comparing each pair of versions once."""

    def __init__(self) -> None:
        self._alike: dict[tuple[int, int], bool] = {}

    def alike(self, general: Version, pinned: Version) -> bool:
        key = (id(general), id(pinned))
        if key not in self._alike:
            self._alike[key] = computes_alike(general, pinned)
        return self._alike[key]

    def merged(self, tree: Split | Version, swap: bool = True) -> _Merged:
        """The merged tree and the pairs it merged. ``swap``: a choice whose two sides
        make the same choice next may be taken second (see below)."""
        if isinstance(tree, Version):
            return tree, []
        true, true_pairs = self.merged(tree.true)
        false, false_pairs = self.merged(tree.false)
        pairs = true_pairs + false_pairs
        covering = self.covering(true, false)
        if covering is not None:
            return covering[0], pairs + covering[1]
        same = true is tree.true and false is tree.false
        merged = tree if same else Split(tree.condition, true, false)
        candidates: list[_Merged] = [(merged, [])]
        if (
            swap
            and isinstance(true, Split)
            and isinstance(false, Split)
            and true.condition.condition == false.condition.condition
        ):
            # `past >= 1` then `seq == 1` on both sides is `seq == 1` then `past >= 1`:
            # the versions of an empty cache may compute alike for one side of `seq`
            # only. Both sides evaluate the second condition, which may come first.
            swapped = Split(
                true.condition,
                Split(tree.condition, true.true, false.true),
                Split(tree.condition, true.false, false.false),
            )
            candidates.append(self.merged(swapped, swap=False))
        candidates += self.absorbed(tree.condition, true, false)
        best = min(candidates, key=lambda c: len(leaves(c[0])))
        return best[0], pairs + best[1]

    def absorbed(self, condition: VersionCondition, true: Any, false: Any) -> list[_Merged]:
        """The choice ``condition`` between ``true`` and ``false`` where a version on one
        side computes what a version of the other side's next choice computes: one
        choice on both conditions at once (``past >= 1 or seq >= 2``, the versions of a
        decoder where only an empty cache with one token computes otherwise)."""
        found: list[_Merged] = []
        for version, split, version_side in ((true, false, True), (false, true, False)):
            if not isinstance(version, Version) or not isinstance(split, Split):
                continue
            if not (_simple(condition.condition) and _simple(split.condition.condition)):
                continue
            for covered, other, covered_side in (
                (split.true, split.false, True),
                (split.false, split.true, False),
            ):
                covering = self.covering(version, covered)
                if covering is None:
                    continue
                # where `version` runs now: its side of `condition`, or the other side
                # and the covered side of the split's condition
                mine = condition.condition if version_side else sympy.Not(condition.condition)
                theirs = split.condition.condition
                theirs = theirs if covered_side else sympy.Not(theirs)
                either = sympy.Or(mine, theirs)
                joined = VersionCondition(either, pretty(either), condition.location)
                found.append((Split(joined, covering[0], other), covering[1]))
        return found

    def covering(self, a: Split | Version, b: Split | Version) -> _Merged | None:
        """A tree computing what ``a`` and ``b`` compute, each on its own inputs, with
        the pairs it merged; None when there is none."""
        if isinstance(a, Version) and isinstance(b, Version):
            if self.alike(a, b):
                return a, [(a, b)]
            if self.alike(b, a):
                return b, [(b, a)]
            return None
        if isinstance(a, Split) and isinstance(b, Split):
            if a.condition.condition != b.condition.condition:
                return None
            true = self.covering(a.true, b.true)
            false = self.covering(a.false, b.false) if true is not None else None
            if true is None or false is None:
                return None
            return Split(a.condition, true[0], false[0]), true[1] + false[1]
        return None


def _simple(condition: sympy.Basic) -> bool:
    """A condition comparing sizes without division: evaluated outside the choice it
    was made under (where a divisor may be 0), it is still defined."""
    if condition.atoms(sympy.Function):
        return False
    return not any(power.exp.is_negative for power in condition.atoms(sympy.Pow))


def computes_alike(general: Version, pinned: Version) -> bool:
    """Whether ``general``'s graph computes, on ``pinned``'s inputs, what ``pinned``'s
    graph computes (see the module's documentation)."""
    pins = pinned_below_default(general, pinned)
    if not pins:
        return False
    try:
        return _Comparison(general, pinned, pins).alike()
    except (ArithmeticError, TypeError, ValueError):
        # a size that has no value at the pinned sizes (`seq // past` where `past` is
        # 0): general's graph does not compute pinned's there
        return False


def pinned_below_default(general: Version, pinned: Version) -> dict[str, int]:
    """The dimensions ``pinned``'s capture holds at one size below the default range
    (0 or 1) that ``general``'s leaves free, by name; empty when ``pinned`` holds a
    dimension otherwise (at another size, or where ``general`` holds it elsewhere)."""
    pins = {}
    general_pins = _single_sizes(general)
    for name, size in _single_sizes(pinned).items():
        if general_pins.get(name) == size:
            continue
        symint = general.tracer.dims.by_name.get(name)
        if name in general_pins or symint is None or size >= DEFAULT_MIN:
            return {}
        if symint.node._expr not in general.tracer.dims.default_min:
            return {}
        pins[name] = size
    for name in general_pins:
        if name not in _single_sizes(pinned):
            return {}
    return pins


def _single_sizes(version: Version) -> dict[str, int]:
    """The user's dimensions the capture of ``version`` holds at one size."""
    dims = version.tracer.dims
    sizes = {}
    for name, symint in dims.by_name.items():
        symbol = symint.node._expr
        replaced = dims.shape_env.replacements.get(symbol)
        if replaced is not None and replaced.is_Integer:
            sizes[name] = int(replaced)
            continue
        bounds = dims.shape_env.var_to_range.get(symbol)
        if bounds is not None and bounds.lower == bounds.upper:
            sizes[name] = int(bounds.lower)
    return sizes


@dataclasses.dataclass
class _Comparison:
    """Compares the graphs of ``general`` and ``pinned`` with the sizes ``pins`` put in."""

    general: Version
    pinned: Version
    pins: dict[str, int]
    #: node of general's graph -> the corresponding node of pinned's
    pairs: dict[torch.fx.Node, torch.fx.Node] = dataclasses.field(default_factory=dict)
    #: the small tensors each graph computes from constants and sizes (see _folded)
    folded: tuple[dict, dict] = dataclasses.field(default_factory=lambda: ({}, {}))

    def alike(self) -> bool:
        if self._splits_empty_tensors():
            return False
        self.folded = (self._folded(self.general), self._folded(self.pinned))
        mine = [n for n in self.general.graph.nodes if self._compared_in_order(n, 0)]
        theirs = [n for n in self.pinned.graph.nodes if self._compared_in_order(n, 1)]
        if len(mine) != len(theirs):
            return False
        for a, b in zip(mine, theirs):
            if not self._same_target(a, b):
                return False
            if not self._same(a.args, b.args) or not self._same(a.kwargs, b.kwargs):
                return False
            if a.op != "output" and not self._same_value(a.meta.get("val"), b.meta.get("val")):
                return False
            self.pairs[a] = b
        return True

    def _splits_empty_tensors(self) -> bool:
        """Whether general's graph splits a tensor that is empty where a dimension is
        pinned to 0: lowered with that size unknown, ``x.chunk(2)`` splits by a size
        computed at run time (ONNX ``SplitToSequence``), which onnxruntime refuses when
        it is 0; the version captured at 0 splits by constants and runs."""
        empty = {name for name, size in self.pins.items() if size == 0}
        if not empty:
            return False
        for node in self.general.graph.nodes:
            if node.op == "call_method":
                name = node.target
            elif node.op == "call_function":
                name = getattr(node.target, "__name__", "")
            else:
                continue
            if name not in _SPLITS or not node.args or not isinstance(node.args[0], torch.fx.Node):
                continue
            value = node.args[0].meta.get("val")
            if not isinstance(value, torch.Tensor):
                continue
            for size in value.shape:
                expr = _expression(size, self.general)
                if expr is None or any(s.name in empty for s in expr.free_symbols):
                    return True
        return False

    def _compared_in_order(self, node: torch.fx.Node, side: int) -> bool:
        """Whether ``node`` (of general's graph, side 0, or pinned's, side 1) is paired
        with the node at the same position in the other graph; sizes and constants are
        compared where they are read, by value."""
        version = (self.general, self.pinned)[side]
        return not self._size_arithmetic(node, version) and node not in self.folded[side]

    def _size_arithmetic(self, node: torch.fx.Node, version: Version) -> bool:
        """A node computing numbers from the dimensions alone: compared where it is
        read, by value (the version of an empty cache writes ``0`` for ``past``)."""
        if node.op in ("placeholder", "output", "get_attr"):
            return False
        value = node.meta.get("val")
        values = value if isinstance(value, (tuple, list)) else [value]
        if not values or not all(isinstance(v, _SCALARS) for v in values):
            return False
        names = set(version.tracer.dims.by_name)
        for v in values:
            expr = _expression(v, version)
            if expr is None or any(s.name not in names for s in expr.free_symbols):
                return False  # a number read from data (``.item()``) is compared as a node
        return True

    def _folded(self, version: Version) -> dict[torch.fx.Node, torch.Tensor]:
        """The small tensors of ``version``'s graph computed from constants and sizes
        alone, with their values on pinned's inputs: a capture folds ``torch.arange(1)``
        to a constant, another computes ``torch.arange(seq)`` where ``seq`` is 1."""
        folded: dict[torch.fx.Node, torch.Tensor] = {}
        root = version.tracer.traced_model
        for node in version.graph.nodes:
            if node.op == "get_attr":
                value = operator.attrgetter(str(node.target))(root)
                if _small_constant(value):
                    folded[node] = value
                continue
            if node.op not in ("call_function", "call_method") or not _pure(node):
                continue
            if not self._small_value(node.meta.get("val"), version):
                continue
            args = self._concrete((node.args, node.kwargs), version, folded)
            if args is None:
                continue
            (positional, keywords) = args
            try:
                with torch.no_grad():
                    if node.op == "call_function":
                        value = node.target(*positional, **keywords)
                    else:
                        value = getattr(positional[0], node.target)(*positional[1:], **keywords)
            except Exception:
                continue
            if _small_constant(value):
                folded[node] = value
        return folded

    def _small_value(self, value: Any, version: Version) -> bool:
        """Whether ``value`` (a node's) is a tensor of at most :data:`_FOLDED_SIZE`
        elements on pinned's inputs."""
        if not isinstance(value, torch.Tensor):
            return False
        numel = 1
        for size in value.shape:
            expr = _expression(size, version)
            expr = None if expr is None else self._pinned(expr)
            if expr is None or expr.free_symbols:
                return False
            numel *= int(expr)
        return numel <= _FOLDED_SIZE

    def _concrete(self, arg: Any, version: Version, folded: dict) -> Any:
        """``arg`` of a node of ``version``'s graph with its sizes as Python numbers on
        pinned's inputs and its folded tensors as their values (None when a size is not
        a constant there, or another tensor is read)."""
        if isinstance(arg, torch.fx.Node) and arg in folded:
            return folded[arg]
        if self._is_size(arg, version):
            value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
            expr = _expression(value, version)
            expr = None if expr is None else self._pinned(expr)
            if expr is None or expr.free_symbols:
                return None
            if isinstance(value, (bool, torch.SymBool)):
                return bool(expr)
            return float(expr) if isinstance(value, (float, torch.SymFloat)) else int(expr)
        if isinstance(arg, (torch.fx.Node, torch.Tensor)):
            return None
        if isinstance(arg, (tuple, list)):
            items = [self._concrete(a, version, folded) for a in arg]
            if any(i is None and a is not None for i, a in zip(items, arg)):
                return None
            return tuple(items) if isinstance(arg, tuple) else items
        if isinstance(arg, dict):
            values = {k: self._concrete(v, version, folded) for k, v in arg.items()}
            return None if any(values[k] is None and arg[k] is not None for k in arg) else values
        if isinstance(arg, slice):
            bounds = self._concrete((arg.start, arg.stop, arg.step), version, folded)
            return None if bounds is None else slice(*bounds)
        return arg

    def _same_target(self, a: torch.fx.Node, b: torch.fx.Node) -> bool:
        if {a.op, b.op} & {"get_attr", "call_module"}:
            if a.op != b.op:
                return False
            mine = operator.attrgetter(str(a.target))(self.general.tracer.traced_model)
            theirs = operator.attrgetter(str(b.target))(self.pinned.tracer.traced_model)
            return _same_constant(mine, theirs)
        # a `contiguous()` or reshape a view in one version and a copy in the other
        # (see tracing.core.layout_copies): the writes through it differ (a call no
        # write goes through may be left unmarked, its layout not decided)
        layouts = {a.meta.get(LAYOUT_KEY), b.meta.get(LAYOUT_KEY)} - {None}
        if len(layouts) > 1:
            return False
        return _as_method(a) == _as_method(b)

    def _same(self, a: Any, b: Any) -> bool:
        """Whether arguments ``a`` (of general's graph) and ``b`` (of pinned's) hold the
        same values on pinned's inputs."""
        folded_a = self.folded[0].get(a) if isinstance(a, torch.fx.Node) else None
        folded_b = self.folded[1].get(b) if isinstance(b, torch.fx.Node) else None
        if folded_a is not None or folded_b is not None:
            return _same_constant(folded_a, folded_b)
        a_size = self._is_size(a, self.general)
        b_size = self._is_size(b, self.pinned)
        if a_size or b_size:
            return a_size and b_size and self._same_size(a, b)
        if isinstance(a, torch.fx.Node) or isinstance(b, torch.fx.Node):
            return isinstance(a, torch.fx.Node) and self.pairs.get(a) is b
        if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
            return type(a) is type(b) and _pairwise(a, b, self._same)
        if isinstance(a, dict) or isinstance(b, dict):
            return (
                type(a) is type(b) and list(a) == list(b) and all(self._same(a[k], b[k]) for k in a)
            )
        if isinstance(a, slice) or isinstance(b, slice):
            return (
                isinstance(a, slice)
                and isinstance(b, slice)
                and self._same((a.start, a.stop, a.step), (b.start, b.stop, b.step))
            )
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return _same_constant(a, b)
        return type(a) is type(b) and a == b

    def _is_size(self, arg: Any, version: Version) -> bool:
        if isinstance(arg, torch.fx.Node):
            return self._size_arithmetic(arg, version)
        return isinstance(arg, _SCALARS)

    def _same_size(self, a: Any, b: Any) -> bool:
        value_a = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
        value_b = b.meta.get("val") if isinstance(b, torch.fx.Node) else b
        return self._same_value(value_a, value_b)

    def _same_number(self, a: Any, b: Any) -> bool:
        """Whether two numbers (sizes, flags, scalars) are equal on pinned's inputs."""
        if isinstance(a, (bool, torch.SymBool)) != isinstance(b, (bool, torch.SymBool)):
            return False
        if isinstance(a, (float, torch.SymFloat)) != isinstance(b, (float, torch.SymFloat)):
            return False
        expr_a = _expression(a, self.general)
        expr_b = _expression(b, self.pinned)
        if expr_a is None or expr_b is None:
            return False
        expr_a, expr_b = self._pinned(expr_a), self._pinned(expr_b)
        if expr_a == expr_b:
            return True
        if isinstance(expr_a, sympy.Expr) and isinstance(expr_b, sympy.Expr):
            return sympy.expand(expr_a - expr_b) == 0
        return False

    def _pinned(self, expr: sympy.Basic) -> sympy.Basic:
        return expr.xreplace(
            {s: sympy.Integer(self.pins[s.name]) for s in expr.free_symbols if s.name in self.pins}
        )

    def _same_value(self, a: Any, b: Any) -> bool:
        """Whether the values two nodes computed (their ``meta["val"]``) have the same
        kind, dtype and sizes on pinned's inputs."""
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return (
                isinstance(a, torch.Tensor)
                and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype
                and a.dim() == b.dim()
                and all(self._same_number(x, y) for x, y in zip(a.shape, b.shape))
            )
        if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
            return _pairwise(a, b, self._same_value)
        if isinstance(a, _SCALARS) or isinstance(b, _SCALARS):
            return self._same_number(a, b)
        return type(a) is type(b)


def _pairwise(a: Any, b: Any, same: Any) -> bool:
    """Whether ``a`` and ``b`` are sequences of one length whose items are ``same``."""
    return (
        isinstance(a, (tuple, list))
        and isinstance(b, (tuple, list))
        and len(a) == len(b)
        and all(same(x, y) for x, y in zip(a, b))
    )


def _expression(value: Any, version: Version) -> sympy.Basic | None:
    """A number as an expression of the user's dimensions (None when it is not one)."""
    if isinstance(value, bool):
        return sympy.true if value else sympy.false
    if isinstance(value, (int, float)):
        return sympy.sympify(value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return version.tracer.dims.user_expression(value)
    return None


def _same_constant(a: Any, b: Any) -> bool:
    """Whether two constants of the graphs (a module, a tensor) are the same."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.device == b.device
            and not a.is_meta
            and torch.equal(a, b)
        )
    return False


def _as_method(node: torch.fx.Node) -> tuple[str, Any]:
    """``(op, target)`` of ``node``, an arithmetic or logical operator on a tensor under
    one name: ``x + n`` on a traced tensor is ``operator.add``, on a constant the capture
    folded (``torch.arange(1)``) it is the method ``add``; ``a & b`` is ``operator.and_``
    or ``__and__``."""
    if node.op == "call_method" and node.target in _METHOD_NAMES:
        return "operator", _METHOD_NAMES[node.target]
    if node.op == "call_function" and node.target in _OPERATOR_NAMES and node.args:
        first = node.args[0]
        if isinstance(first, torch.fx.Node) and isinstance(first.meta.get("val"), torch.Tensor):
            return "operator", _OPERATOR_NAMES[node.target]
    return node.op, node.target


#: operators on a tensor (its first operand) and the names of what they compute
_OPERATOR_NAMES = {
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.truediv: "div",
    operator.and_: "and",
    operator.or_: "or",
    operator.xor: "xor",
    operator.lt: "lt",
    operator.le: "le",
    operator.gt: "gt",
    operator.ge: "ge",
    operator.eq: "eq",
    operator.ne: "ne",
}

#: tensor methods computing what an operator computes, by the operator's name
_METHOD_NAMES = {
    **{name: name for name in ("add", "sub", "mul", "div", "lt", "le", "gt", "ge", "eq", "ne")},
    **{f"__{name}__": name for name in ("add", "sub", "mul", "lt", "le", "gt", "ge", "eq", "ne")},
    "__truediv__": "div",
    "__and__": "and",
    "__or__": "or",
    "__xor__": "xor",
    "bitwise_and": "and",
    "bitwise_or": "or",
    "bitwise_xor": "xor",
}


#: the most elements of a tensor computed from constants and sizes that the comparison
#: computes to compare it by value (a mask of one token, positions of a few)
_FOLDED_SIZE = 1 << 12

#: the modules of the functions a comparison may call on constants: torch's and the
#: operators (``x[None]``, ``a & b``)
_PURE_MODULES = ("torch", "torch.functional", "torch.nn.functional", "_operator")

#: the functions and methods splitting a tensor in pieces whose sizes depend on its own
_SPLITS = frozenset(
    [
        *("split", "chunk", "tensor_split", "unbind", "split_with_sizes"),
        *("hsplit", "vsplit", "dsplit", "unsafe_split", "unsafe_chunk"),
    ]
)

#: the functions of ``operator`` writing into their first argument
_WRITING_OPERATORS = frozenset(
    ["setitem", "delitem"]
    + [
        f"i{name}"
        for name in [
            *("add", "and", "concat", "floordiv", "lshift", "matmul", "mod"),
            *("mul", "or", "pow", "rshift", "sub", "truediv", "xor"),
        ]
    ]
)


def _pure(node: torch.fx.Node) -> bool:
    """Whether the call of ``node`` computes a new value from its arguments alone (torch
    functions and tensor methods, not those writing into their arguments)."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    module = None if node.op == "call_method" else getattr(node.target, "__module__", None)
    if not isinstance(name, str) or "out" in node.kwargs:
        return False
    if module == "_operator":
        # `operator.and_` is `a & b`; `operator.iand` is `a &= b`
        return name not in _WRITING_OPERATORS
    if name.endswith("_") and not name.endswith("__"):
        return False  # torch's convention for the functions writing into an argument
    if name.startswith("__i") or name in ("__setitem__", "__delitem__"):
        return False  # `x += 1`, `x[i] = v` as methods
    return node.op == "call_method" or module in _PURE_MODULES


def _small_constant(value: Any) -> bool:
    """A tensor constant compared by value: small, not a parameter."""
    return (
        isinstance(value, torch.Tensor)
        and not isinstance(value, torch.nn.Parameter)
        and not value.is_meta
        and value.numel() <= _FOLDED_SIZE
    )
