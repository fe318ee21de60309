"""The tracer's side of loop regions (see :mod:`.loops`): opening one, recording its
steps, closing it, watching how the rest of the code uses what it computed, and, at
the end of the trace, making each region still standing a scan."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, cast

import sympy
import torch
import torch.utils._pytree as pytree
from torch.fx.node import Node, map_arg
from torch.fx.proxy import Proxy

from ..errors import exception_summary
from .loop_rolling import (
    ScanPlan,
    names_set_apart,
    outside_use_refusal,
    plan_scan,
    value_key,
    without_first_step,
)
from .loops import (
    LoopRegion,
    ProxyToken,
    SymbolicPieces,
    SymbolicRange,
    SymbolicRepeat,
    frame_tokens,
    iterated_at_once,
    linear_in,
    listed_nodes,
    loop_index,
    loop_stacked,
    loop_symbol,
    loop_symbols_in,
)
from .scan_emission import emit_scan
from .tracer_contract import MixinBase

_STACKING = {torch.stack: "stack", torch.cat: "cat", torch.concat: "cat", torch.concatenate: "cat"}
#: operations returning one piece per index of an axis
_PIECES = {"unbind": "unbind", torch.unbind: "unbind", "split": "split", torch.split: "split"}
#: the same, for a membership test that needs no hashing (targets may be unhashable)
PIECE_TARGETS = tuple(_PIECES)


class LoopsMixin(MixinBase):
    """Mixed into :class:`~yobx.torch.tracing.CustomTracer` (``state``, ``dims``,
    ``graph``, ``python_number``, ``location``...: see
    :class:`~.tracer_contract.TracerContract`)."""

    def loops_allowed(self) -> bool:
        """Whether a loop over a symbolic size may open a region here: one at a time,
        in the graph being traced (not inside a ``torch.cond`` branch or a scan body)."""
        return (
            self.dims is not None and self.state.active_loop is None and not self.state.lift_stack
        )

    def symbolic_pieces(self, kind: str, target, args, kwargs) -> SymbolicPieces | None:
        """``x.unbind(d)`` / ``x.split(s, d)`` into a symbolic number of pieces: pieces
        to iterate over as a loop region (when iterated right away where a loop may
        open) or to join with ``torch.stack``/``torch.cat`` (None: the operation as
        usual)."""
        how = _PIECES[target]
        if kind not in ("call_method", "call_function") or not args:
            return None
        tensor, rest = args[0], dict(kwargs)
        names: tuple[str, ...]
        if how == "unbind":
            names = ("dim",)
        else:
            names = ("split_size_or_sections" if kind == "call_function" else "split_size", "dim")
        for name, value in zip(names, args[1:]):
            rest.setdefault(name, value)
        dim = rest.pop("dim", 0)
        size = rest.pop(names[0], 1) if how == "split" else 1
        val = getattr(tensor, "node", None) and tensor.node.meta.get("val")
        if rest or not isinstance(val, torch.Tensor) or type(dim) is not int:
            return None
        if type(size) is not int or size < 1 or not -val.dim() <= dim < val.dim():
            return None
        dim %= val.dim()
        length = val.shape[dim]
        if not isinstance(length, torch.SymInt) or length.node.maybe_as_int() is not None:
            return None
        loop = size == 1 and self.loops_allowed() and iterated_at_once(self._user_frame())

        def call():
            self.state.pieces_made += 1
            try:
                return self.create_proxy(kind, target, args, kwargs)
            finally:
                self.state.pieces_made -= 1

        self.state.pieces_out += 1
        return SymbolicPieces(self, self.proxy(tensor.node), dim, how, call, size, loop)

    def repeated_list(self, items: list | tuple, count: Proxy) -> SymbolicRepeat:
        """``items * count`` (``[0] * batch_size``) for a symbolic ``count``: a list as
        long as a size (see :class:`~.loops.SymbolicRepeat`)."""
        # the tracer looks for joins of pieces once some are handed out
        self.state.pieces_out += 1
        return SymbolicRepeat(self, items, count)

    def join_pieces(self, target, args, kwargs) -> Proxy | None:
        """``torch.stack``/``torch.cat`` of :class:`SymbolicPieces` or of a
        :class:`SymbolicRepeat` (``[x] * n``): their join, or None; pieces given to
        anything else are made for real."""
        values = args[0] if args else kwargs.get("tensors")
        if not isinstance(values, (SymbolicPieces, SymbolicRepeat)):
            return None
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        joined = None
        if (
            target in _STACKING
            and type(dim) is int
            and len(args) <= 2
            and set(kwargs) <= {"tensors", "dim"}
        ):
            joined = values.joined(_STACKING[target], dim)
        if joined is not None:
            return joined
        real = values._real()
        args = (real, *args[1:]) if args else args
        kwargs = {**kwargs, "tensors": real} if "tensors" in kwargs else kwargs
        return self.create_proxy("call_function", target, args, kwargs)

    def loop_begin(self, symbolic_range: SymbolicRange, reverse: bool, frame=None) -> LoopRegion:
        """Opens the region of a loop over ``symbolic_range`` (``reversed()`` of it when
        ``reverse``) in the user's ``frame``."""
        length = symbolic_range.length()
        count = max(0, int(self.trace_dims().hint(length.node.meta["val"])))
        region = LoopRegion(
            number=len(self.state.loops),
            graph=self.graph,
            location=self.location(),
            start=symbolic_range.start,
            stop=symbolic_range.stop,
            length=length,
            count=count,
            reverse=reverse,
            before=frame_tokens(frame),
        )
        self.state.loops.append(region)
        self.state.active_loop = region
        return region

    def loop_next(self, region: LoopRegion, frame) -> Proxy:
        """The next step's index, or StopIteration after the example's last step."""
        step = len(region.index_nodes)
        if step > 0:
            region.frames.append(frame_tokens(frame))
        if step >= region.count:
            self.state.active_loop = None
            region.listed = listed_nodes(frame)
            self._loop_close(region)
            raise StopIteration
        symint = loop_symbol(self.dims, region, step)
        self.state.loop_symbols[symint.node.expr] = region
        node = self.create_node(
            "call_function", loop_index, (region.number, step), {}, name=f"loop{region.number}_i"
        )
        node.meta["val"] = symint
        node.meta["stack_trace"] = self.stack_trace()
        region.index_nodes.append(node)
        region.steps.append([])
        return self.proxy(node)

    def record_in_loop(self, node: Node) -> None:
        """Called for every node created: keeps the nodes of the step being run."""
        region = self.state.active_loop
        if (
            region is not None
            and region.steps
            and node.graph is region.graph
            and node.target is not loop_index
        ):
            region.steps[-1].append(node)

    def _loop_close(self, region: LoopRegion) -> None:
        region.last = next(reversed(region.graph.nodes))
        if region.refusal is None:
            plan = self._plan(region)
            if isinstance(plan, str):
                region.refuse(plan)
            else:
                region.plan = plan
                for step, nodes in enumerate(plan.steps):
                    for position, node in enumerate(nodes):
                        region.outputs[node] = (step, position)
                for step, node in enumerate(region.index_nodes):
                    region.outputs[node] = (step, -1)
                for node in region.outputs:
                    self.state.loop_outputs[node] = region
                self._decide_reads_fit(region)
                if region.refusal is None:
                    self._decide_the_loop_runs(region)
        if region.refusal is not None:
            self.unroll_loop(region, region.refusal)

    def _plan(self, region: LoopRegion) -> ScanPlan | str:
        """The plan of the scan of all the steps, else of the steps after the first, which
        then runs before the scan (a first step that differs from the others: a
        decision on its index, ``if i == 0:``, or a state starting as a constant, which
        the first step computes with in Python), else why there is none."""
        if region.first_apart is None:
            plan = plan_scan(region)
            if not isinstance(plan, str) or region.count < 3 or region.reverse:
                # the first step of `reversed()` has the index `stop - 1`, not a
                # constant: the decisions the example made on it would not hold
                return plan
        elif region.count < 3:
            return (
                f"its first step differs from the others ({region.first_apart}), and the "
                f"example runs it {region.count} time{'' if region.count == 1 else 's'}: at "
                f"least 2 more steps are needed to check that the others compute the same "
                f"thing"
            )
        later = without_first_step(region)
        found = plan_scan(later)
        if isinstance(found, str):
            return found if region.first_apart is not None else plan
        self._keep_first_step_apart(region, later)
        return found

    def _keep_first_step_apart(self, region: LoopRegion, later: LoopRegion) -> None:
        """The first step runs before the scan of the others: its index becomes the
        constant it is, the capture decides that the loop runs, and the region is the
        steps after it (``later``)."""
        self._decide_it_runs(region.length)
        first = region.index_nodes[0]
        value = region.index_value(0)
        for user in list(first.users):
            user.args = map_arg(user.args, _replacing(first, value))
            user.kwargs = map_arg(user.kwargs, _replacing(first, value))
        if not first.users:
            first.graph.erase_node(first)
        for name in ("steps", "index_nodes", "frames", "count", "before", "start", "apart"):
            setattr(region, name, getattr(later, name))
        region.length = region.length - 1
        if region.reverse:
            region.stop = region.stop - 1
        region.last = next(reversed(region.graph.nodes))

    def _decide_the_loop_runs(self, region: LoopRegion) -> None:
        """Where the loop runs no step, the scan gives each state its first value, and
        every other name keeps its value from before the loop. A name the steps set to
        something else (a tensor from before the loop, another state, a Python value:
        ``prev = s``, ``seen = True``) would have the value of the steps there: the
        capture decides that the loop runs (a version for the sizes where it does
        not)."""
        if region.before is None or not region.frames:
            return
        names = names_set_apart(region.before, region.frames[0], region.plan)
        if names:
            self._decide_it_runs(region.length)

    def _decide_reads_fit(self, region: LoopRegion) -> None:
        """Decides that the rows the steps read past their index (``x[i + 1]``) lie
        within their tensor at the last step: ``stop + offset <= size`` (eager raises an
        IndexError where they do not, and so does the scan). Where the example's last
        step reads past the end, the loop is no scan."""
        dims = self.trace_dims()
        stop = region.stop.node.meta["val"]
        for source, axis, _, offset in region.plan.selections.values():
            size = source.meta["val"].shape[axis]
            if dims.hint(stop) + offset > dims.hint(size):
                # eager raises an IndexError on the example: so do the unrolled steps
                region.refuse(f"its last step reads row {offset} past its index, past the end")
                return
            if offset <= 0:
                continue  # the scan raises where eager does, reading past the end
            fits = stop + offset <= size
            if isinstance(fits, torch.SymBool):
                self.decide(fits, f"the rows the loop at {region.location} reads")

    def _decide_it_runs(self, length: Any) -> None:
        """Decides that a loop of ``length`` steps runs one at least, by a comparison in
        the graph: its decision is judged for the sizes below the default range too (a
        version or a checked constraint for ``s == 0``). Decided on its value alone,
        ``s >= 1`` is True on torch's positive symbols, and a loop over ``range(s)`` was
        taken to run at ``s = 0``."""
        bool(length >= 1)

    def module_assigned(self, module: torch.nn.Module, name: str) -> None:
        """``module.name = ...`` in the traced code: inside a loop's step, Python state
        changes at every step (``self.count += 1``), which a scan cannot repeat."""
        region = self.state.active_loop
        if region is not None and not self.state.in_fake:
            region.refuse(f"it assigns `{type(module).__name__}.{name}` at {self.location()}")

    def loop_refuse(self, symbols, reason: str) -> None:
        """A decision or a guard on the index of a step: its region cannot be a scan.

        On the index of the first step, while it runs, the decision is the example's
        (the step is then kept apart, running before a scan of the others: the
        others' indices exclude the first's, see :func:`~.loops.loop_symbol`); once it
        is kept apart, its index is a constant, and so is the decision."""
        for symbol in symbols:
            region = self.state.loop_symbols.get(symbol)
            if region is not None and symbol == region.first_symbol:
                if region.apart:
                    continue
                if (
                    region is self.state.active_loop
                    and len(region.index_nodes) == 1
                    and not region.reverse
                ):
                    if region.first_apart is None:
                        region.first_apart = f"{reason} at {self.location()}"
                    continue
            if region is not None and not region.unrolled:
                region.refuse(f"{reason} at {self.location()}")
                if region.plan is not None:
                    # closed already: the index is used after the loop
                    self.unroll_loop(region, region.refusal)

    def loop_symbols(self, expr) -> set:
        """The loop-index symbols of ``expr`` (none outside loops)."""
        return loop_symbols_in(self.dims, expr) if self.state.loop_symbols else set()

    def unroll_loop(self, region: LoopRegion, reason: str, location: str | None = None) -> None:
        """The region stays the unrolled steps of the example: its length is adopted
        (an error for a dimension declared dynamic, as for any Python int)."""
        if region.unrolled:
            return
        plan, region.plan = region.plan, None
        region.unrolled = True
        for node in region.outputs:
            self.state.loop_outputs.pop(node, None)
        location = location or self.location()
        loop = "the loop" if location == region.location else f"the loop at {region.location}"
        self.python_number(
            region.length,
            f"{loop} (not a scan: {reason}) needs its number of steps, a Python int (range()),",
            location=location,
        )
        for step, node in enumerate(region.index_nodes):
            value = region.index_value(step)
            for user in list(node.users):
                user.args = map_arg(user.args, _replacing(node, value))
                user.kwargs = map_arg(user.kwargs, _replacing(node, value))
            if node.graph is not None and not node.users:
                node.graph.erase_node(node)
        for node in region.stacked:
            _, position, dim, how, first = cast(tuple[Any, int, int, str, tuple], node.args)
            values = [*first, *(nodes[position] for nodes in plan.steps)]
            if how == "last":
                node.replace_all_uses_with(values[-1])
                node.graph.erase_node(node)
                continue
            node.target = torch.stack if how == "stack" else torch.cat
            node.args = (values, dim)

    def loop_slice(self, kind: str, target, args, kwargs) -> Proxy | None:
        """In a step, the slice of length 1 at the index (``x.narrow(d, i, 1)``,
        ``x[:, i:i + 1]``) is recorded as ``x.select(d, i).unsqueeze(d)``: the same
        values, with a size torch knows is 1 (``Min(1, n - i)`` otherwise, which differs
        from one step to the next)."""
        region = self.state.active_loop
        if kwargs or not region.index_nodes or len(args) < 2:
            return None
        index = region.index_nodes[-1]
        if target in ("narrow", torch.narrow) and len(args) == 4:
            source, dim, start, length = args
            if getattr(start, "node", None) is index and length == 1 and type(dim) is int:
                return source.select(dim, start).unsqueeze(dim)
            return None
        if kind != "call_function" or target is not operator.getitem:
            return None
        source, item = args
        items = item if isinstance(item, tuple) else (item,)
        full = slice(None, None, None)
        chunk = self._chunk_at(source, items, index)
        if chunk is not None:
            return chunk
        for axis, one in enumerate(items):
            if isinstance(one, slice) and _one_at(one, index):
                before = items[:axis]
                if any(b is not full for b in before if not isinstance(b, slice)) or any(
                    isinstance(b, slice) and b != full for b in before
                ):
                    return None
                start = one.start
                plus = one.stop.node
                key = (*before, start, *items[axis + 1 :])
                selected = source[key]
                if not plus.users and plus.graph is not None:
                    plus.graph.erase_node(plus)
                return selected.unsqueeze(axis)
        return None

    def _chunk_at(self, source: Proxy, items: tuple, index: Node) -> Proxy | None:
        """In a step, a chunk of ``c`` at the index (``x[:, c*i + b : c*(i + 1) + b]``,
        ``b >= 0``) is recorded as the index's slice of ``x`` cut into chunks,
        ``x.narrow(d, b, c*stop).unflatten(d, (stop, c)).select(d, i)``: the same values,
        with a size torch knows is ``c`` (a length differing from one step to the next
        otherwise), selected as a scan selects. The capture decides that every step's
        chunk lies within ``x`` (``c*stop + b <= x.shape[d]``; where it does not, the
        last chunks are shorter, and the loop is no scan)."""
        full = slice(None, None, None)
        axis = next((k for k, one in enumerate(items) if one != full), None)
        val = source.node.meta.get("val") if isinstance(source, Proxy) else None
        if axis is None or not isinstance(val, torch.Tensor) or axis >= val.dim():
            return None
        one, after = items[axis], items[axis + 1 :]
        if not isinstance(one, slice) or one.step not in (None, 1) or _proxies(after):
            return None
        symbol = index.meta["val"].node.expr
        bounds = [_expression(one.start), _expression(one.stop)]
        if bounds[0] is None or bounds[1] is None:
            return None
        found = linear_in(bounds[0], symbol)
        if found is None or found[1] < 0 or bounds[1] - bounds[0] != found[0]:
            return None
        c, b = found
        region = self.state.active_loop
        stop, size = region.stop, cast(Any, source).shape[axis]
        dims = self.trace_dims()
        if c * dims.hint(stop.node.meta["val"]) + b > dims.hint(val.shape[axis]):
            return None  # the example's last chunks are shorter
        bool(stop * c + b <= size)
        selected: Any = cast(Any, source).narrow(axis, b, stop * c)
        selected = selected.unflatten(axis, (stop, c)).select(axis, self.proxy(index))
        return selected[(full,) * (axis + 1) + tuple(after)] if after else selected

    # uses of what a closed region computed

    def loop_use(self, kind: str, target, args, kwargs) -> Proxy | None:
        """Checks an operation reading values of a closed region (called before its node
        is made): ``torch.stack``/``torch.cat`` of a value of every step becomes the
        scan's stacked output (returned); the carried values after the last step are
        the scan's; any other use unrolls the region."""
        used = [p for p in _proxies((args, kwargs)) if p.node in self.state.loop_outputs]
        if not used:
            return None
        if kind == "call_function" and target in _STACKING:
            stacked = self._loop_stacked(_STACKING[target], args, kwargs)
            if stacked is not None:
                return stacked
        last = {p.node: v for p in used if (v := self._last_value(p.node)) is not None}
        if last:
            # the operation made again, reading the scan's values of the last step
            args, kwargs = pytree.tree_map_only(
                Proxy, lambda p: last.get(p.node, p), (tuple(args), dict(kwargs))
            )
            return self.create_proxy(kind, target, args, kwargs)
        for proxy in used:
            region = self.state.loop_outputs.get(proxy.node)
            if region is None:
                continue
            operation = target if isinstance(target, str) else getattr(target, "__name__", target)
            reason = outside_use_refusal(region, proxy.node, f"`{operation}`")
            if reason is not None:
                self.unroll_loop(region, reason)
        return None

    def _loop_stacked(self, how: str, args, kwargs) -> Proxy | None:
        values = args[0] if args else kwargs.get("tensors")
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if not isinstance(values, (list, tuple)) or not values or type(dim) is not int:
            return None
        if len(args) > 2 or set(kwargs) - {"tensors", "dim"}:
            return None
        found = self._loop_sequence(values)
        if found is None:
            return None
        region, position, first = found
        per_step = values[-1].node.meta["val"]
        ndim = per_step.dim() + (1 if how == "stack" else 0)
        if not -ndim <= dim < ndim or (how == "cat" and per_step.dim() == 0):
            return None
        dim %= ndim
        length = region.length.node.meta["val"] + len(first)
        if not first:
            # eager stacks and concatenates one tensor at least, and the list was not
            # empty where the code tested it (`torch.cat(outs) if outs else ...`: a
            # list's truth is no call the tracer sees)
            self._decide_it_runs(region.length)
        try:
            with self.fake_mode:
                if how == "stack":
                    val = per_step.unsqueeze(dim).expand(
                        *per_step.shape[:dim], length, *per_step.shape[dim:]
                    )
                else:
                    shape = list(per_step.shape)
                    shape[dim] = shape[dim] * length
                    val = per_step.new_empty(shape)
                val = torch.empty_like(val, memory_format=torch.contiguous_format)
        except Exception as e:
            # torch.stack of the unrolled steps says it better: left to it
            region.refuse(f"its stacked output fails on fake tensors ({exception_summary(e)})")
            return None
        node = self.create_node(
            "call_function",
            loop_stacked,
            (region.number, position, dim, how, tuple(v.node for v in first)),
            {},
        )
        node.meta["val"] = val
        node.meta["stack_trace"] = self.stack_trace()
        region.stacked.append(node)
        return self.proxy(node)

    def _last_value(self, node: Node) -> Proxy | None:
        """The last step's value ``node`` used after its loop, held by a name the steps
        set (``y = ...`` in every step), as the last of the scan's stacked values of its
        position (a ``loop_stacked`` node of kind "last"); None when the region is no
        scan, or the value a carried one (the scan's own output), one a list holds
        (``outs[-1]`` and ``outs[4]`` are the same node on the example), or one a stack
        cannot stand for: a view of another value, or with another layout. The capture
        decides that the loop runs (the value exists after one step at least)."""
        region = self.state.loop_outputs.get(node)
        if region is None or region.plan is None:
            return None
        step, position = region.outputs.get(node, (None, -1))
        plan, val = region.plan, node.meta.get("val")
        if step != region.count - 1 or position < 0 or position in plan.carries:
            return None
        if node in region.listed or not region.frames:
            return None  # `outs[-1]` or `outs[4]`: which step, the example cannot tell
        if ProxyToken(node) not in region.frames[-1].values():
            return None  # held by no name of the loop (`y = ...` in every step)
        for marker in region.stacked:
            if marker.args[1:4] == (position, 0, "last"):
                return self.proxy(marker)  # read before
        if not isinstance(val, torch.Tensor) or not _fresh_and_contiguous(region, node, val):
            return None
        # the scan runs (with a first step kept apart, the sizes where only that one
        # runs get a version of their own)
        self._decide_it_runs(region.length)
        last = self.create_node(
            "call_function", loop_stacked, (region.number, position, 0, "last", ()), {}
        )
        with self.fake_mode:
            last.meta["val"] = torch.empty_like(val, memory_format=torch.contiguous_format)
        last.meta["stack_trace"] = self.stack_trace()
        region.stacked.append(last)
        return self.proxy(last)

    def _read_last_values(self, region: LoopRegion) -> None:
        """The last step's values the rest of the graph reads where no operation of the
        trace saw them (the graph's output: ``return y``), read from the scan's."""
        inside = set(region.index_nodes).union(*map(set, region.steps))
        for node in region.steps[-1]:
            if all(u in inside for u in node.users):
                continue
            with region.graph.inserting_after(cast(Node, region.last)):
                value = self._last_value(node)
            if value is not None:
                node.replace_all_uses_with(value.node, delete_user_cb=lambda u: u not in inside)

    def _loop_sequence(self, values) -> tuple[LoopRegion, int, list] | None:
        """(region, position, first) when ``values`` are the values one position of a
        closed region computes, one per step, in order, after ``first``: nothing, or the
        value of a first step the region keeps apart (``outs.append(h)`` in every step),
        which has the same shape."""
        if not values or not isinstance(values[-1], Proxy):
            return None
        region = self.state.loop_outputs.get(values[-1].node)
        if region is None or len(values) < region.count:
            return None
        first, steps = values[: len(values) - region.count], values[len(values) - region.count :]
        if len(first) > (1 if region.apart else 0) or not all(isinstance(v, Proxy) for v in steps):
            return None
        if first and isinstance(first[0], torch.Tensor) and not isinstance(first[0], Proxy):
            # the first step computed it from constants alone (a state starting as one)
            first = [self.proxy(cast(Node, self.create_arg(first[0])))]
        if first and not isinstance(first[0], Proxy):
            return None
        if first and value_key(first[0].node.meta.get("val")) != value_key(
            steps[0].node.meta.get("val")
        ):
            return None
        position = region.outputs[steps[0].node][1]
        if position < 0:
            return None
        for step, value in enumerate(steps):
            if region.outputs.get(value.node) != (step, position):
                return None
        return region, position, first

    def loop_length(self, values) -> Proxy | None:
        """``len()`` of a list holding the values of a closed region: the symbolic number
        of steps when it holds one per step of one position, else the region unrolls
        (None: the builtin's answer)."""
        if not self.state.loop_outputs or not isinstance(values, (list, tuple)):
            return None
        found = self._loop_sequence(values)
        if found is not None:
            return found[0].length + len(found[2])
        for value in values:
            node = getattr(value, "node", None)
            region = self.state.loop_outputs.get(node) if node is not None else None
            if region is not None:
                self.unroll_loop(region, "len() of a list holding some of its values")
        return None

    # end of the trace

    def roll_loops(self, graph: torch.fx.Graph) -> None:
        """Makes each closed region a scan (called once the user's code is traced).

        The last region first: a later loop may start from the values an earlier one
        carries, which its scan then reads, and the earlier scan replaces them there.
        """
        for region in reversed(self.state.loops):
            if region.unrolled:
                continue
            if region.plan is None:
                # a loop left by `break`, `return` or an exception caught inside it
                self.state.active_loop = None
                reason = region.refusal or "it was left before its last step"
                self.unroll_loop(region, reason, location=region.location)
                continue
            self._read_last_values(region)
            reason = outside_use_refusal(region, None, "the rest of the graph")
            if reason is not None:
                self.unroll_loop(region, reason, location=region.location)
                continue
            emit_scan(self, region)


def _fresh_and_contiguous(region: LoopRegion, node: Node, val: torch.Tensor) -> bool:
    """Whether the last step's value ``node`` may stand for the last of the scan's
    stacked values: contiguous (as they are), and in memory of its own, which no value
    from before the loop or of an earlier step, no carried value and no other value of
    the last step read after the loop shares (a view of the state would miss a later
    write into it, or the state the write into the value)."""
    from torch._prims_common import is_contiguous_for_memory_format_or_false

    if not is_contiguous_for_memory_format_or_false(val, memory_format=torch.contiguous_format):
        return False
    storage = val.untyped_storage()._cdata
    last = set(region.steps[-1])
    plan = cast(ScanPlan, region.plan)
    # the state, and the other values of the last step read after the loop: each is
    # a tensor of its own there
    kept = {plan.steps[-1][p] for p in plan.carries}
    kept.update(plan.steps[-1][cast(int, m.args[1])] for m in region.stacked if m.args[3] == "last")
    for other in region.graph.nodes:
        if other is node or (other in last and other not in kept):
            continue
        value = other.meta.get("val")
        if isinstance(value, torch.Tensor) and value.untyped_storage()._cdata == storage:
            return False
    return True


def _replacing(node: Node, value: Any) -> Callable[[Node], Any]:
    """For ``map_arg``: ``value`` where an argument is ``node``, the argument elsewhere."""
    return lambda n: value if n is node else n


def _one_at(item: slice, index: Node) -> bool:
    """Whether ``item`` is ``i:i + 1`` for the index ``i``."""
    start, stop = getattr(item.start, "node", None), getattr(item.stop, "node", None)
    return (
        start is index
        and item.step is None
        and stop is not None
        and stop.op == "call_function"
        and stop.target is operator.add
        and stop.args == (index, 1)
    )


def _expression(value: Any) -> Any:
    """The sympy expression of an int or of a proxy of a symbolic int, else None."""
    if type(value) is int:
        return sympy.Integer(value)
    val = getattr(getattr(value, "node", None), "meta", {}).get("val")
    return val.node.expr if isinstance(val, torch.SymInt) else None


def _proxies(values) -> list[Proxy]:
    found = []
    for leaf in pytree.tree_leaves(values):
        if isinstance(leaf, Proxy):
            found.append(leaf)
        elif isinstance(leaf, slice):
            found.extend(v for v in (leaf.start, leaf.stop, leaf.step) if isinstance(v, Proxy))
    return found
