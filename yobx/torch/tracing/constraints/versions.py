"""Never narrow: versions of a capture, one per side of each undecided decision.

A decision on dynamic dimensions the tracer cannot prove (``if x.shape[2] > 16``,
``if h == w``, a reshape needing ``n % 4 == 0``) takes the example's answer and becomes a
constraint: the graph is exact on that side only. With ``narrowing="versions"`` (the
default of :class:`~yobx.torch.tracing.CustomTracer`), the tracer then captures the
other side too:

1. it looks for a *witness*: sizes inside the declared ranges, satisfying the decisions
   made before, for which the decision goes the other way (a search over the declared
   dimensions, :mod:`.size_search`);
2. it runs the model eagerly on inputs of those sizes: if eager raises there (a position
   table of 512 rows, a reshape that cannot divide, an explicit ``raise``), no graph can
   do better, and the decision stays a constraint;
3. it captures the model again on those inputs, the decision's other side assumed (the
   *path* of the new version), and looks at that version's own undecided decisions in
   turn (nested decisions give nested choices);
4. it joins the captures into one graph choosing at run time from the input sizes: a
   ``torch.cond`` (:class:`~yobx.torch.tracing.CondCCOp`) on the decision, whose
   branches are the versions' graphs (ONNX ``If`` once exported; :mod:`.version_join`).

A version whose conditions pin a dimension declared without ``min`` to 2 (``n < 3``
from the default range), or that was captured at 1, takes it for a constant: the sizes
below it (a batch of one, an empty one) are decisions of their own, captured as the
others are (:meth:`Versioning._below_pinned`), or checked beyond the budget.

A budget bounds the cost: ``max_versions`` (8 by default) versions; decisions beyond
stay constraints. It is a count, so that a model gives the same versions on every
machine (a time limit, ``version_seconds``, is optional). The sides every caller passes
come first when the budget is short: one dimension at 0 or 1 where the example had more
(a decode step's single token, a prefill's empty cache) before relations between sizes
(a mask longer than the cache). :attr:`CustomTracer.versions` lists the versions with their
conditions in the user's dimension names and the source lines,
:attr:`CustomTracer.version_notes` says why a decision stayed a constraint.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time
from collections.abc import Iterator
from typing import Any

import sympy
import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.utils._sympy.functions import FloorDiv, Max

from ..dynamic_shapes import STRICT
from ..errors import exception_summary
from ..inputs import NO_EXAMPLE
from ..symbolic.expression_text import pretty
from ..symbolic.symbolic import DEFAULT_MIN
from .constraints import Constraint
from .refinement import DEFAULT_BOUND
from .runtime_checks import (
    RuntimeCheck,
    assumed_checks,
    condition_in_sizes,
    declared_checks,
)
from .size_search import (
    co_moved_inside,
    compile_condition,
    constants_of,
    holds,
    satisfying_moves,
)
from .witness_inputs import (
    bytes_text,
    eager_affordable,
    leaves_for,
    run_eagerly,
    witness_bytes,
)

#: candidate sizes tried at most to find a witness for one decision (conditions compile
#: to Python: a few microseconds per candidate, 30 for hundreds of operations)
_WITNESS_BUDGET = 10_000
#: operations in a condition an operator needed (a kernel's guard, not a branch of the
#: model) beyond which its other side is not looked for: reshapes of windowed attention
#: check products of padded sizes whose other side eager refuses anyway
_OPERATOR_CONDITION_OPS = 12
#: sizes tried eagerly at most to capture a model from beside a size its example fixes
_EAGER_TRIES = 6
#: the witnesses a version's side is captured from, in turn, until eager runs there
_SIDE_TRIES = 3


@dataclasses.dataclass(frozen=True)
class VersionCondition:
    """One decision a version of the capture stands on.

    :param condition: the condition, on symbols named after the user's dimensions
    :param expression: the condition in the user's names (``seq > 16``)
    :param location: the user's ``file:line`` of the decision
    """

    condition: sympy.Basic
    expression: str
    location: str = ""

    def __str__(self) -> str:
        return f"{self.expression}  [{self.location}]" if self.location else self.expression


@dataclasses.dataclass
class Version:
    """One capture of the model, for the inputs its conditions select.

    :param index: its number, from 1, in the order the joined graph lists them
    :param conditions: the decisions selecting it (all hold for its inputs)
    :param tracer: the tracer of this capture (its ``dims``, ``guards``, ``constraints``)
    :param graph: its graph
    :param example: the example inputs it was captured with (``concrete_args``)
    """

    index: int
    conditions: list[VersionCondition]
    tracer: Any
    graph: torch.fx.Graph
    example: dict[str, Any]
    #: the facts of this capture that became choices between versions
    routed: list[Any] = dataclasses.field(default_factory=list)
    #: the version whose graph computes this one's outputs in the joined graph, when
    #: their graphs compute alike (see :mod:`.version_merging`)
    computed_by: Version | None = None

    @property
    def when(self) -> str:
        """The conditions selecting this version, as one expression in the user's names
        (empty for a capture without choice)."""
        return " and ".join(f"({c.expression})" for c in self.conditions)

    @property
    def constraints(self) -> list[Constraint]:
        """What this version still assumes of its inputs beyond its conditions (each
        with :attr:`Constraint.when <yobx.torch.tracing.Constraint>` set to them)."""
        routed = {id(fact.constraint) for fact in self.routed}
        # a fact the conditions imply is no constraint (nor a check: version_checks)
        path = sympy.And(*(c.condition for c in self.conditions))
        dims = self.tracer.dims
        implied = {
            id(fact.constraint)
            for fact in self.tracer.refinements.adopted
            if self.conditions and implied_by(dims.user_expression(fact.condition), path)
        }
        when = self.when
        return [
            dataclasses.replace(c, when=when)
            for c in self.tracer.constraints
            if id(c) not in routed and id(c) not in implied
        ]

    @property
    def graph_module(self) -> torch.fx.GraphModule:
        """The version's own graph, runnable on inputs its conditions select."""
        return torch.fx.GraphModule(self.tracer.traced_model, self.graph)

    def __str__(self) -> str:
        conditions = " and ".join(str(c) for c in self.conditions) or "the example's side"
        text = f"version {self.index}: {conditions}"
        constraints = [dataclasses.replace(c, when="") for c in self.constraints]
        if constraints:
            text += "; constraints: " + ", ".join(str(c) for c in constraints)
        if self.computed_by is not None:
            text += f"; computed by version {self.computed_by.index}'s graph"
        return text


@dataclasses.dataclass
class Split:
    """A choice between versions: ``true`` where ``condition`` holds, else ``false``."""

    condition: VersionCondition
    true: Split | Version
    false: Split | Version


def leaves(tree: Split | Version) -> list[Version]:
    """The versions of a decision tree, true sides first."""
    if isinstance(tree, Version):
        return [tree]
    return leaves(tree.true) + leaves(tree.false)


def in_dimensions(dims: Any, condition: sympy.Basic) -> sympy.Basic:
    """A condition on user-named symbols written with the symbols of ``dims``."""
    # the symbols themselves, not what the ShapeEnv replaced them with since
    # (`w` by `h` once `h == w` was adopted): the sizes of the inputs read them
    names = {
        sympy.Symbol(name, integer=True): symint.node._expr for name, symint in dims.by_name.items()
    }
    mapped = condition.xreplace(names)
    if isinstance(mapped, sympy.logic.boolalg.BooleanAtom) and not isinstance(
        condition, sympy.logic.boolalg.BooleanAtom
    ):
        # The ShapeEnv's symbols are positive (sizes), the user's are not: `batch >= 1`
        # would fold to True on them, while it is a check on a size of 0, which the
        # declared range (from 2 by default, not checked so that 0 and 1 still run)
        # does not exclude. The condition keeps its form, as the capture recorded it.
        with sympy.evaluate(False):
            mapped = condition.xreplace(names)
    return mapped


#: ``meta`` key of a version's graph module, of a choice between versions and of the
#: ``cond`` choosing: the dimensions of the capture its sizes are written with
DIMENSIONS_KEY = "yobx_dimensions"
#: ``meta`` key of the ``cond`` choosing between versions: its condition, in the
#: symbols of the joined graph's dimensions, as the versions wrote it (the joined
#: graph's ranges, from 2, would fold ``past >= 1`` to True)
CONDITION_KEY = "yobx_version_condition"


class Versioning:
    """Captures the versions of a model from its first trace and joins them.

    :param tracer: the tracer that made the first trace (it becomes the joined one)
    :param root: the traced module or callable
    :param graph: the first trace's graph
    :param seconds: the time the versions may take (None: no limit but the budget of
        versions); decisions met after it stay constraints
    :param trace_arguments: ``dynamic_shapes``, ``remove_inplace`` and
        ``update_model_with_callable`` as :meth:`CustomTracer.trace` received them
    """

    def __init__(
        self,
        tracer: Any,
        root: Any,
        graph: torch.fx.Graph,
        seconds: float | None,
        **trace_arguments: Any,
    ):
        self.tracer = tracer
        self.seconds = seconds
        self.deadline = None if seconds is None else time.perf_counter() + seconds
        self.root = root
        self.trace_arguments = trace_arguments
        self.notes: list[str] = []
        self.count = 1
        #: decision location -> the captures of its other sides that failed: a line whose
        #: other side no capture took (a model failing at sizes that large) gets one try
        #: for its next decisions (diffusers' KVAE meets one line 12 times, 6 s a try)
        self.failed_captures: dict[str, int] = {}
        first = tracer._version_tracer([])
        # the first capture keeps its own state; the tracer becomes the joined one
        for name in ("dims", "refinements", "shape_rules", "guards", "state", "traced_model"):
            setattr(first, name, getattr(tracer, name))
        inputs = tracer.state.inputs
        example = dict(zip(inputs.arg_names, pytree.tree_unflatten(inputs.leaves, inputs.in_spec)))
        self.first = Version(0, [], first, graph, example)

    def run(self) -> Split | Version:
        """The decision tree of the versions (the first capture alone when none).

        The other sides are captured best first, while the budgets last: sides where
        one dimension takes a size below 2 (a decode step's single token, a
        prefill's empty cache, a batch of one: the decisions the default range
        settled, and the model's own tests of such a size, see :func:`_usual_side`)
        before the other sides (a mask longer than the cache, which only an unusual
        caller passes), and nearer the example first (a version's own decisions
        before those its captures meet in turn)."""
        splits: dict[int, list[tuple[int, VersionCondition, Version]]] = {}
        # a decision's position among the facts a version adopted, or a pinned
        # dimension's (position after them, name, size)
        pending: list[tuple[tuple[int, int], int, Version, int | tuple[int, str, int]]] = []
        counter = itertools.count()

        def look_at(version: Version, unusual: int) -> None:
            splits[id(version)] = []
            adopted = version.tracer.refinements.adopted
            dims = version.tracer.dims
            for position, fact in enumerate(adopted):
                odd = not _usual_side(fact, dims.user_expression(fact.condition))
                rank = (unusual + odd, len(version.conditions))
                heapq.heappush(pending, (rank, next(counter), version, position))
            # a dimension pinned to 2 (or 1) has sizes below it: a batch of one comes
            # with the usual sides, an empty one after them
            for offset, (name, size) in enumerate(pinned_sizes(version).items()):
                rank = (unusual + (size < DEFAULT_MIN), len(version.conditions))
                item = (rank, next(counter), version, (len(adopted) + offset, name, size))
                heapq.heappush(pending, item)

        look_at(self.first, 0)
        while pending:
            (unusual, _), _, version, position = heapq.heappop(pending)
            if isinstance(position, tuple):
                found = self._below_pinned(version, *position, splits[id(version)])
            else:
                found = self._side(version, position, splits[id(version)], unusual)
            if found is not None:
                splits[id(version)].append(found)
                look_at(found[2], unusual)
        for version_splits in splits.values():
            version_splits.sort(key=lambda split: split[0])

        def subtree(version: Version) -> Split | Version:
            # the version itself is on the side of its trace of each choice it makes
            version.conditions = [*version.conditions, *(c for _, c, _ in splits[id(version)])]
            tree: Split | Version = version
            for _, condition, other in reversed(splits[id(version)]):
                tree = Split(condition, tree, subtree(other))
            return tree

        tree = subtree(self.first)
        for index, version in enumerate(leaves(tree), start=1):
            version.index = index
        return tree

    # capturing

    def _side(
        self,
        version: Version,
        position: int,
        taken: list[tuple[int, VersionCondition, Version]],
        unusual: int = 1,
    ) -> tuple[int, VersionCondition, Version] | None:
        """The other side of the decision at ``position`` among those ``version``
        adopted: ``(position, the version's side, the version capturing the other)``,
        or None when it has none, the budgets are spent, or its capture fails (then a
        note says why). ``taken``: the choices of ``version`` made so far; ``unusual``:
        how many decisions the default ranges did not settle lead to ``version``
        (none: the other side of a default-bound decision is a size every caller
        passes, a prefill's empty cache or a decode's single token, captured beyond
        any time budget, within the budget of versions)."""
        dims = version.tracer.dims
        adopted = version.tracer.refinements.adopted
        fact = adopted[position]
        if fact.constraint.kind == "value":
            return None  # a dimension fixed to one size: no other side to capture
        if any(dims.policy_of(s) == STRICT for s in fact.condition.free_symbols):
            return None  # a named Dim stays strict
        user = dims.user_expression(fact.condition)
        if fact.origin in ("operator", DEFAULT_BOUND) and (
            sympy.count_ops(user) > _OPERATOR_CONDITION_OPS
        ):
            return None  # an operator's requirement on padded products (see above)
        path = [c.condition for c in version.conditions]
        # the version is on the side of the choices it made before (the earlier ones
        # in the trace are the sides it was captured on)
        before = [c for p, c, _ in taken if p < position]
        sides = [*path, *(c.condition for c in before)]
        if sides and implied_by(user, sympy.And(*sides)):
            return None  # what the version's conditions imply: no other side
        negation = sympy.Not(user)
        location = fact.constraint.location
        if self.count >= self.tracer.max_versions:
            budget = self.tracer.max_versions
            self._note(fact, f"beyond the budget of {budget} version{'s' * (budget != 1)}")
            return None
        usual = unusual == 0 and _usual_side(fact, user)
        if self.deadline is not None and time.perf_counter() > self.deadline and not usual:
            self._note(fact, f"beyond the time budget of {self.seconds:.3g} s")
            return None
        earlier = [dims.user_expression(f.condition) for f in adopted[:position]]
        # sizes that keep the example's later decisions too come first: a prefill
        # (`past == 0`) whose mask still spans `past + seq`, not a longer one
        later = [dims.user_expression(f.condition) for f in adopted[position + 1 :]]
        candidates = self._witnesses(version, [*path, *earlier, *later, negation])
        if not candidates and later:
            candidates = self._witnesses(version, [*path, *earlier, negation])
        if not candidates:
            self._note(fact, "no size inside the declared ranges takes the other side")
            return None
        side = VersionCondition(negation, pretty(negation), location)
        notes = len(self.notes)
        if self.failed_captures.get(location, 0) >= _SIDE_TRIES:
            candidates = candidates[:1]
        for witness in candidates:
            # the nearest sizes may be where eager fails (an empty sequence where the
            # model reshapes by -1): the next ones may take the side
            other = self._capture(version, witness, [*version.conditions, *before, side], fact)
            if other is not None:
                del self.notes[notes:]
                break
        else:
            return None
        self.count += 1
        version.routed.append(fact)
        return position, VersionCondition(user, pretty(user), location), other

    def _below_pinned(
        self,
        version: Version,
        position: int,
        name: str,
        size: int,
        taken: list[tuple[int, VersionCondition, Version]],
    ) -> tuple[int, VersionCondition, Version] | None:
        """The sizes below ``size`` of the dimension ``name`` that ``version``'s capture
        pins to ``size`` (2 by its conditions and the default range, ``n < 3`` with
        ``n`` from 2; 1 for a version captured there): ``(position, n >= size, the
        version capturing n < size)``, or None (then the version checks ``n >= size``,
        see :func:`pinned_checks`). The capture takes the dimension for a constant, and
        its conditions leave the sizes below to other versions; eager runs there."""
        symbol = sympy.Symbol(name, integer=True)
        user, negation = sympy.Ge(symbol, size), sympy.Lt(symbol, size)
        location = version.conditions[-1].location if version.conditions else ""
        fact = _Pinned(f"{name} >= {size} when {version.when}")
        if self.count >= self.tracer.max_versions:
            budget = self.tracer.max_versions
            self._note(fact, f"beyond the budget of {budget} version{'s' * (budget != 1)}")
            return None
        if self.deadline is not None and time.perf_counter() > self.deadline and size < DEFAULT_MIN:
            self._note(fact, f"beyond the time budget of {self.seconds:.3g} s")
            return None  # an empty input is no usual side (a batch of one is)
        sides = [*version.conditions, *(c for _, c, _ in taken)]
        candidates = self._witnesses(version, [*(c.condition for c in sides), negation])
        side = VersionCondition(negation, pretty(negation), location)
        for witness in candidates:
            other = self._capture(version, witness, [*sides, side], fact)
            if other is not None:
                break
        else:
            return None
        self.count += 1
        return position, VersionCondition(user, pretty(user), location), other

    def _note(self, fact: Any, why: str) -> None:
        note = f"`{fact.constraint}` stays a constraint: {why}"
        if note not in self.notes:  # versions meet the same decisions
            self.notes.append(note)

    def _witnesses(self, version: Version, conditions: list[sympy.Basic]) -> list[dict]:
        """Up to :data:`_SIDE_TRIES` sizes of the user's dimensions where every
        condition holds, near the version's example, as :func:`find_witness` orders
        them (inside the declared ranges, then from 0)."""
        dims = version.tracer.dims
        found = list(itertools.islice(witnesses(dims, conditions), _SIDE_TRIES))
        if not found:
            found = list(itertools.islice(witnesses(dims, conditions, True), _SIDE_TRIES))
        return found

    def _capture(
        self, version: Version, witness: dict, path: list[VersionCondition], fact: Any
    ) -> Version | None:
        """The version of the other side, captured on inputs of the witness's sizes;
        None (and a note) when eager or the trace fails there."""
        inputs = version.tracer.state.inputs
        sizes = ", ".join(f"{k}={v}" for k, v in witness.items() if v != _hint(version, k))
        reference = self.first.tracer.state.inputs
        needed, allowed = witness_bytes(version.tracer.dims, inputs, witness, reference)
        if needed > allowed:
            self._note(
                fact,
                f"its other side needs inputs of {bytes_text(needed)} ({sizes}), more "
                f"than the {bytes_text(allowed)} a version's capture may allocate",
            )
            return None
        leaves_ = leaves_for(version.tracer.dims, inputs, witness)
        # a witness much bigger than the example is checked by its capture alone
        if eager_affordable(version.tracer.dims, inputs, witness, reference):
            error = run_eagerly(self.root, inputs, leaves_)
            if error is not None:
                self._note(fact, f"eager raises for {sizes} ({error})")
                return None
        example = dict(zip(inputs.arg_names, pytree.tree_unflatten(leaves_, inputs.in_spec)))
        child = self.tracer._version_tracer(path)
        try:
            graph = child.trace(self.root, concrete_args=example, **self.trace_arguments)
        except Exception as exc:
            self._note(fact, f"the capture for {sizes} fails ({exception_summary(exc)})")
            # a pinned dimension's note names no decision (see _Pinned)
            location = getattr(fact.constraint, "location", "")
            self.failed_captures[location] = self.failed_captures.get(location, 0) + 1
            return None
        other = Version(0, path, child, graph, example)
        mismatch = _output_mismatch(self.first, other, self.tracer.versions_of_one_type)
        if mismatch:
            self._note(fact, f"the other side ({sizes}) returns {mismatch}")
            return None
        return other


def find_witness(dims: Any, conditions: list[sympy.Basic]) -> dict[str, int] | None:
    """Sizes of the user's dimensions (by name) inside the ranges the graph accepts
    where every condition (in the user's names) holds, near the example of ``dims``,
    the last condition's dimensions moved first; None when the search finds none.

    Sizes inside the declared ranges come first. When there are none, a dimension
    declared without ``min`` counts from 0, not from torch.export's default 2: the
    graph accepts one token and an empty cache, so a decision the default range
    settled (`cache.numel() == 0 -> False`) has its other side there, and that side
    becomes a version (a prefill beside a decode step) instead of a constraint
    refusing it. (Sizes 0 and 1 come last because a capture there is the more fragile:
    an empty slice's length can no longer be told from the sizes.)"""
    found = next(witnesses(dims, conditions), None)
    if found is None:
        found = next(witnesses(dims, conditions, from_zero=True), None)
    return found


def witnesses(
    dims: Any, conditions: list[sympy.Basic], from_zero: bool = False
) -> Iterator[dict[str, int]]:
    """Every witness :func:`find_witness` would find, nearest first, within the search
    budget; inside the declared ranges only unless ``from_zero`` (then a dimension
    declared without ``min`` starts at 0)."""
    names = list(dims.by_name)
    symbols = [sympy.Symbol(name, integer=True) for name in names]
    base = {s: int(dims.hint(dims.by_name[n])) for n, s in zip(names, symbols)}
    bounds = []
    for name, symbol in zip(names, symbols):
        expr = dims.by_name[name].node._expr
        low, high = dims.declared.get(expr, (0, None))
        if from_zero and expr in dims.default_min:
            low = 0
        bounds.append(sympy.Ge(symbol, low))
        if high is not None:
            bounds.append(sympy.Le(symbol, high))
    wanted = [*bounds, *conditions]
    if not all(c.free_symbols <= set(symbols) for c in wanted):
        return
    focus = [s for s in symbols if s in conditions[-1].free_symbols]
    constants = constants_of(*conditions)
    for assignment in satisfying_moves(base, wanted, focus, constants, _WITNESS_BUDGET):
        yield {s.name: v for s, v in assignment.items()}


def example_beyond(tracer: Any, root: Any, facts: list[sympy.Basic]) -> dict | None:
    """Example inputs (per parameter name) like the last trace's, at sizes inside the
    declared ranges where every one of ``facts`` is false, on which eager runs; None
    when there are none (see :meth:`CustomTracer.trace`: a dimension the example's
    side makes a constant, ``if d == 3``, is captured from another size first)."""
    inputs = tracer.state.inputs
    if inputs is None or any(leaf is NO_EXAMPLE for leaf in inputs.leaves):
        return None
    # the first sizes where eager runs: `x + y` beside `if x.shape[1] == 1` runs
    # where both sizes move together, not at the nearest size of `x` alone
    candidates = witnesses(tracer.dims, [sympy.Not(f) for f in facts])
    for witness in itertools.islice(candidates, _EAGER_TRIES):
        # the sizes the model relates move together first (a mask over the cache and
        # the new tokens): a model may run at sizes breaking the relation (a longer
        # mask sliced), but the capture there would not be the example's
        moved = co_moved_inside(tracer.dims, example_sizes(tracer.dims), witness)
        for sizes in (moved, witness):
            if sizes is None:
                continue
            needed, allowed = witness_bytes(tracer.dims, inputs, sizes)
            if needed > allowed or not eager_affordable(tracer.dims, inputs, sizes):
                continue  # inputs too big to allocate or to run (see witness_inputs)
            leaves_ = leaves_for(tracer.dims, inputs, sizes)
            if run_eagerly(root, inputs, leaves_) is None:
                return dict(zip(inputs.arg_names, pytree.tree_unflatten(leaves_, inputs.in_spec)))
    return None  # eager needs the example's side: the dimension is a constant


def example_sizes(dims: Any) -> dict[str, int]:
    """The sizes of the user's dimensions, by name, in the example of a trace."""
    return {name: int(dims.hint(symint)) for name, symint in dims.by_name.items()}


def covers(tracer: Any, sizes: dict[str, int], from_zero: bool = False) -> bool:
    """Whether the graph of the last trace (its versions joined) runs inputs of
    ``sizes`` (by dimension name): one version's conditions and constraints hold.

    :param from_zero: a dimension declared without ``min`` counts from 0, not from the
        default 2: the graph does not check that range, and the decisions it settled
        are versions or checks of their own (a prefill's ``past == 0``)"""
    symbols = [sympy.Symbol(name, integer=True) for name in sizes]
    values = list(sizes.values())
    for name, size in sizes.items():
        expr = tracer.dims.by_name[name].node._expr
        low, high = tracer.dims.declared.get(expr, (0, None))
        if from_zero and expr in tracer.dims.default_min:
            low = 0
        if size < low or (high is not None and size > high):
            return False
    for version in tracer.versions or [None]:
        own = tracer if version is None else version.tracer
        conditions = [] if version is None else [c.condition for c in version.conditions]
        conditions += [own.dims.user_expression(f.condition) for f in own.refinements.adopted]
        if all(
            c.free_symbols <= set(symbols) and holds(compile_condition(c, symbols), values)
            for c in conditions
        ):
            return True
    return False


def describe_versions(versions: list[Version], notes: list[str]) -> list[str]:
    """Lines telling the versions of a capture and why decisions stayed constraints
    (what ``yobx trace`` and ``yobx export`` print); empty for one capture without
    notes."""
    lines = [f"  {version}" for version in versions]
    lines += [f"  {note}" for note in notes]
    return lines


def version_constraints(versions: list[Version]) -> list[Constraint]:
    """What the ``versions`` assume beyond their conditions, each once (in the order of
    the versions), as :attr:`Version.constraints` says it."""
    constraints: list[Constraint] = []
    for version in versions:
        constraints += [c for c in version.constraints if c not in constraints]
    return constraints


def version_checks(first: Version, versions: list[Version]) -> list[RuntimeCheck]:
    """The conditions a graph joining ``versions`` checks on its inputs, on the symbols
    of the ``first`` capture (whose inputs the joined graph takes): the declarations,
    then what each version assumes beyond its conditions, checked when they select it
    (``seq <= 64 when (seq > 16)`` is ``Or(Not(seq > 16), seq <= 64)``). A condition
    every version assumes is checked once, unconditionally."""
    dims = first.tracer.dims
    per_version = []
    for version in versions:
        own = version.tracer.dims
        path = sympy.And(*(in_dimensions(dims, c.condition) for c in version.conditions))
        mapped = []
        for check in assumed_checks(version.tracer.refinements, version.routed):
            user = own.user_expression(condition_in_sizes(own, check.condition))
            mapped.append(dataclasses.replace(check, condition=in_dimensions(dims, user)))
        per_version.append((version, path, mapped))
    common = set.intersection(*({c.condition for c in m} for _, _, m in per_version))
    checks = declared_checks(dims)
    for version, path, mapped in per_version:
        for check in mapped:
            if implied_by(check.condition, path):
                continue  # `(h//8)**2 + 1 == 17` where `h == w` and `(h//8)*(w//8) == 16`
            if check.condition in common:
                if all(c.condition != check.condition for c in checks):
                    checks.append(check)
                continue
            checks.append(
                dataclasses.replace(
                    check,
                    condition=sympy.Or(sympy.Not(path), check.condition),
                    expression=f"{check.expression} when {version.when}",
                )
            )
    return checks + pinned_checks(first, versions)


@dataclasses.dataclass
class _Pinned:
    """What a note names when the sizes below a pinned dimension get no version."""

    constraint: str


def pinned_sizes(version: Version) -> dict[str, int]:
    """The user's dimensions that ``version``'s capture takes for a constant 2 or 1,
    with that size: declared without a ``min`` (the default range starts at 2, a graph
    accepts 1 and 0 too) and held there by the decisions it stands on (``n < 3``) or by
    a capture at 1 (whose conditions select 0 too, ``n < 2``)."""
    own = version.tracer.dims
    sizes = {}
    for name, symint in own.by_name.items():
        symbol = symint.node._expr
        bounds = own.shape_env.var_to_range.get(symbol)
        if symbol not in own.default_min or bounds is None:
            continue
        if bounds.lower == bounds.upper and 0 < bounds.lower <= DEFAULT_MIN:
            sizes[name] = int(bounds.lower)
    return sizes


def pinned_checks(first: Version, versions: list[Version]) -> list[RuntimeCheck]:
    """Checks that a dimension is at least 2 where a version's conditions and the
    default range pin it to 2 (``n < 3``, ``(n + 1)//2 == 1`` with ``n`` from 2), or at
    least 1 where a version captured at 1 is selected by ``n < 2`` (see
    :func:`pinned_sizes`), on the symbols of the ``first`` capture, checked when the
    version's conditions select it, unless they imply it (the sizes below have versions
    of their own, :meth:`Versioning._below_pinned`).

    Such a capture takes the dimension for a constant, while its conditions also select
    the sizes below, which the default range leaves unchecked (so that the other
    versions run there): without the check, the version computes sizes 1 and 0 as 2
    (``y[: n]`` keeps two rows)."""
    dims = first.tracer.dims
    # on sympy's non-negative twins of the ShapeEnv's symbols: positive ones would fold
    # `dim >= 1` to True, and the check of a version captured at 1 would vanish
    twins = {
        sympy.Symbol(name, integer=True): dims.twins(symint.node._expr)
        for name, symint in dims.by_name.items()
    }
    checks = []
    for version in versions:
        user_path = sympy.And(*(c.condition for c in version.conditions))
        path = user_path.xreplace(twins)
        for name, size in pinned_sizes(version).items():
            if name not in dims.by_name:
                continue
            if implied_by(sympy.Ge(sympy.Symbol(name, integer=True), size), user_path):
                continue  # the sizes below have versions (Versioning._below_pinned)
            at_least = sympy.Ge(twins[sympy.Symbol(name, integer=True)], size)
            checks.append(
                RuntimeCheck(
                    sympy.Or(sympy.Not(path), at_least),
                    f"{name} >= {size} when {version.when}",
                    version.conditions[-1].location if version.conditions else "",
                    "range",
                )
            )
    return checks


def _hint(version: Version, name: str) -> int:
    dims = version.tracer.dims
    return int(dims.hint(dims.by_name[name]))


def _usual_side(fact: Any, user: sympy.Basic) -> bool:
    """The other side of the decision ``fact`` (``user``: its condition in the user's
    dimensions) is one every caller of the model passes: a size the default range
    settled (``past >= 1`` from ``min=2``), or one dimension at 0 or 1 where the
    example had more (``seq != 1``: a decode step's single token; ``past >= 1``: a
    prefill's empty cache), not a relation between sizes (a mask longer than the
    cache)."""
    if fact.origin == DEFAULT_BOUND:
        return True
    negation = sympy.Not(user)
    if len(negation.free_symbols) != 1:
        return False
    (symbol,) = negation.free_symbols
    holds_at = [_holds_at(negation, symbol, size) for size in range(4)]
    if None in holds_at[2:]:
        return False
    return any(holds_at[:2]) and not any(holds_at[2:])


def _holds_at(condition: sympy.Basic, symbol: sympy.Symbol, size: int) -> bool | None:
    """Whether ``condition`` holds with ``symbol`` at ``size``; False where it cannot
    be evaluated there, None where it does not reduce to a truth value."""
    try:
        value = condition.subs(symbol, size)
    except Exception:
        # a division by zero, or torch's sympy functions refusing an argument outside
        # their domain (``Mod`` of a negative size raises AssertionError): no size there
        return False
    if isinstance(value, sympy.logic.boolalg.BooleanAtom):
        return bool(value)
    return None


def implied_by(condition: sympy.Basic, path: sympy.Basic) -> bool:
    """``condition`` follows from the equalities of ``path`` by substitution: a
    dimension equal to another replaced by it, then an expression equal to a number
    replaced by it (a check that no size can break, nor validation exercise)."""
    if condition in sympy.And.make_args(path):
        return True  # a decision the version was captured on, met again
    facts = [f for f in sympy.And.make_args(path) if isinstance(f, sympy.Eq)]
    renames = {}
    for fact in facts:
        if fact.lhs.is_Symbol and fact.lhs not in renames:
            renames[fact.lhs] = fact.rhs
        elif fact.rhs.is_Symbol and fact.rhs not in renames:
            renames[fact.rhs] = fact.lhs
        else:
            renames.update(_solved(fact, renames))
    condition = condition.xreplace(renames)
    values, positive = {}, set()
    for fact in facts:
        lhs, rhs = fact.lhs.xreplace(renames), fact.rhs.xreplace(renames)
        if lhs.is_Integer:
            lhs, rhs = rhs, lhs
        if rhs.is_Integer and not lhs.is_number:
            values[lhs] = rhs
            factors = [f.base if f.is_Pow else f for f in sympy.Mul.make_args(lhs)]
            if rhs > 0 and len(factors) > 1 and all(map(_never_negative, factors)):
                # never negative, with a positive product: each is at least 1
                positive.update(factors)
    # max(1, n) is n where n >= 1 (torch writes contiguous strides with it)
    at_least_one = {m: m.args[1] for m in condition.atoms(Max, sympy.Max) if _one_and(m, positive)}
    condition = condition.xreplace(at_least_one)
    return condition.xreplace(values) is sympy.true


def _solved(fact: sympy.Eq, renames: dict) -> dict:
    """``{d: 3}`` for an equality linear in one symbol with an integer solution (``d + 2
    == 5``, a decision as the model wrote it), else nothing."""
    if len(fact.free_symbols) != 1:
        return {}
    (symbol,) = fact.free_symbols
    if symbol in renames:
        return {}
    difference = fact.lhs - fact.rhs
    if not difference.is_polynomial(symbol) or sympy.degree(difference, symbol) != 1:
        return {}
    slope, offset = sympy.Poly(difference, symbol).all_coeffs()
    value = -offset / slope
    return {symbol: value} if value.is_Integer else {}


def _never_negative(factor: sympy.Basic) -> bool:
    """A size (a symbol) or a size divided by a positive number (``h // 8``)."""
    if factor.is_Symbol:
        return True
    return isinstance(factor, FloorDiv) and factor.args[0].is_Symbol and factor.args[1] > 0


def _one_and(extremum: sympy.Basic, positive: set) -> bool:
    """``extremum`` is ``max(1, n)`` of an ``n`` in ``positive`` (its arguments sorted,
    the number first)."""
    args = extremum.args
    return len(args) == 2 and args[0] == 1 and args[1] in positive


def _output_mismatch(first: Version, other: Version, one_type: bool = False) -> str:
    """How the outputs of two versions differ in structure, or with ``one_type`` in the
    rank or dtype of a tensor (empty when they do not): one graph cannot choose between
    them (``x.squeeze(0)`` has a rank less where ``x.shape[0] == 1``, which an ONNX
    ``If`` cannot return beside the other rank)."""
    if first.tracer.state.out_spec != other.tracer.state.out_spec:
        return "another output structure"
    mine = next(n for n in first.graph.nodes if n.op == "output").args[0]
    theirs = next(n for n in other.graph.nodes if n.op == "output").args[0]
    flat, flat_other = pytree.tree_leaves(mine), pytree.tree_leaves(theirs)
    for a, b in zip(flat, flat_other):
        if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node):
            differs = _type_difference(a.meta.get("val"), b.meta.get("val")) if one_type else ""
            if differs:
                return differs
            continue
        if _is_number(a) and _is_number(b):
            continue  # a size computed on one side, folded on the other
        if isinstance(a, torch.fx.Node) or isinstance(b, torch.fx.Node):
            return "a computed output where the example's side returns a constant"
        if a != b:
            return f"the constant {b!r} where the example's side returns {a!r}"
    return ""


def _type_difference(mine: Any, theirs: Any) -> str:
    """How the tensor ``theirs`` differs from ``mine`` in rank or dtype (empty when it
    does not, or when either is no tensor)."""
    if not isinstance(mine, torch.Tensor) or not isinstance(theirs, torch.Tensor):
        return ""
    if mine.dim() != theirs.dim():
        return (
            f"a tensor of rank {theirs.dim()} where the example's side returns one of "
            f"rank {mine.dim()}"
        )
    if mine.dtype != theirs.dtype:
        return f"a tensor of {theirs.dtype} where the example's side returns one of {mine.dtype}"
    return ""


def _is_number(value: Any) -> bool:
    """A Python number or a node computing one (a size returned by the model)."""
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
    return isinstance(value, (int, float, torch.SymInt, torch.SymFloat)) and not isinstance(
        value, bool
    )


__all__ = [
    "DIMENSIONS_KEY",
    "Split",
    "Version",
    "VersionCondition",
    "Versioning",
    "covers",
    "describe_versions",
    "example_beyond",
    "example_sizes",
    "find_witness",
    "implied_by",
    "in_dimensions",
    "leaves",
    "version_checks",
]
