"""Running each traced operation on fake values: the value of every node.

:class:`FakeExecutionMixin` computes ``meta["val"]`` of a node from the fake values of
its arguments (a shape rule, else torch's fake kernels, else a leaf module on fake
parameters), records the sizes only known at run time, and turns the guards torch
installs on the way into decisions and constraints the graph relies on.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import operator
from collections.abc import Callable
from typing import Any, cast

import sympy
import torch
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch.fx.experimental.symbolic_shapes import (
    GuardOnDataDependentSymNode,
    PendingUnbackedSymbolNotFound,
    compute_unbacked_bindings,
)
from torch.fx.node import Node, map_arg
from torch.fx.proxy import TraceError
from torch.utils._sympy.functions import FloorDiv, Mod

from ...node_text import operation_name
from .. import shape_rules
from ..errors import TracingError, exception_summary
from ..shape_rules._strides import decided_contiguity
from ..symbolic.symbolic import Guard
from ..symbolic.symbolic_variants import function_variant
from .decisions import user_location
from .layout_copies import is_reshape_call
from .positive_folds import empty_slice_conditions, folded_extremum_conditions
from .squeeze_selects import squeeze_as_select
from .tracer_contract import MixinBase

#: a guard longer than this is adopted without trying to prove it. Swin's windows of
#: padded, merged patches guard on products of nested minima and remainders of 95 to
#: 233 operations: none of the 549 guards its versions met above 50 operations was
#: proved, and trying took 15 of its 25 s of proofs (of a 90 s capture)
_MAX_PROVED_GUARD_OPERATIONS = 90

#: what a C++ kernel taking concrete sizes only says of symbolic ones
_CONCRETE_ONLY = "expected to contain only concrete integers"
_CONVOLUTIONS = frozenset(
    getattr(torch.nn.functional, name)
    for name in (
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
    )
)


# how a scalar node's value is built from its operands' expressions
_SYMPY_OPERATIONS: dict[Any, Any] = {
    operator.eq: sympy.Eq,
    operator.ne: sympy.Ne,
    operator.lt: sympy.Lt,
    operator.le: sympy.Le,
    operator.gt: sympy.Gt,
    operator.ge: sympy.Ge,
    operator.add: operator.add,
    operator.sub: operator.sub,
    operator.mul: operator.mul,
    operator.neg: operator.neg,
    operator.floordiv: FloorDiv,
    operator.mod: Mod,
    torch.sym_max: sympy.Max,
    torch.sym_min: sympy.Min,
    builtins.max: sympy.Max,
    builtins.min: sympy.Min,
}


_COMPARISONS = {
    operator.eq: "==",
    operator.ne: "!=",
    operator.lt: "<",
    operator.le: "<=",
    operator.gt: ">",
    operator.ge: ">=",
}


def _is_squeeze(node: Node) -> bool:
    if node.op == "call_method":
        return node.target in ("squeeze", "squeeze_")
    return node.op == "call_function" and node.target in (torch.squeeze, torch.Tensor.squeeze)


def _is_contiguous_call(node: Node) -> bool:
    if node.op == "call_method":
        return node.target == "contiguous"
    return node.op == "call_function" and node.target is torch.Tensor.contiguous


def _copy_when_layout_undecided(args: tuple, kwargs: dict) -> Any:
    """``x.contiguous()`` returns ``x`` when it is contiguous, a copy otherwise: the
    same values either way. When the ranges of the dimensions do not settle it (a
    transposed attention output is contiguous at ``seq == 1`` only), a contiguous copy
    (the fake value to continue with), rather than a decision on the sizes that would
    narrow the capture to the example's; torch.export does the same
    (``is_contiguous_or_false``). ``None`` when the call is no such case."""
    x = args[0] if args else None
    memory_format = kwargs.get("memory_format", args[1] if len(args) > 1 else None)
    memory_format = torch.contiguous_format if memory_format is None else memory_format
    if not isinstance(x, torch.Tensor) or not any(
        isinstance(d, torch.SymInt) for d in (*x.shape, *x.stride())
    ):
        return None
    if decided_contiguity(x, memory_format) is not None:
        return None
    return x.clone(memory_format=memory_format)


def _plain_contiguous(args: tuple, kwargs: dict) -> bool:
    """``x.contiguous()`` in the default memory format (the only one whose layout a
    write decides, see :mod:`.layout_copies`)."""
    memory_format = kwargs.get("memory_format", args[1] if len(args) > 1 else None)
    return memory_format in (None, torch.contiguous_format)


def _squeezed_dims(x: torch.Tensor, args: tuple, kwargs: dict) -> list[int]:
    """The dimensions ``squeeze`` is asked to remove if they are 1 (non-negative)."""
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if dims is None:
        dims = range(x.dim())
    elif isinstance(dims, int):
        dims = [dims]
    return [d % max(x.dim(), 1) for d in dims]


def _remaining_dims(args: tuple, kwargs: dict, not_one: list[int]) -> tuple[int, ...]:
    """The dimensions an in-place squeeze still asks once ``not_one`` are left out."""
    return tuple(d for d in _squeezed_dims(args[0], args, kwargs) if d not in not_one)


def _is_convolution(node: Node, module: torch.nn.Module | None) -> bool:
    if node.op == "call_function":
        return node.target in _CONVOLUTIONS
    return isinstance(module, torch.nn.modules.conv._ConvNd)


def _needs_python_dispatcher(function: Any, args: tuple, kwargs: dict) -> bool:
    """Whether torch runs ``function`` on fake tensors as torch.export does only through
    the Python dispatcher: its argument parser takes a symbolic float
    (``torch.arange(0, n * 0.5, 0.5)``) only there (an internal assertion fails
    otherwise), and the FFTs' C++ meta kernels fix every size of their input
    (FNet's ``torch.fft.fftn``: ``batch == 2`` and ``seq == 7``) where the Python ones
    keep them symbolic, as for a convolution padded ``"same"``."""
    if getattr(function, "__module__", None) == "torch._C._fft":
        return True
    # `padding="same"`: the C++ kernel of a convolution reads concrete sizes, and with
    # its guards kept quiet (see _run_fake) fixed the length to the example's
    if function in _CONVOLUTIONS and isinstance(
        kwargs.get("padding", args[4] if len(args) > 4 else None), str
    ):
        return True
    # every call_function node comes here: a look at the arguments and one level of
    # lists inside them, no pytree flattening
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.SymFloat):
            return True
        if type(value) in (list, tuple) and any(isinstance(v, torch.SymFloat) for v in value):
            return True
    return False


def _fake_value(node: Node) -> Any:
    if "val" not in node.meta:
        # a node made outside the tracer's recording (a pass, a user's graph edit)
        raise TracingError.at(user_location(), f"node {node.format_node()} has no fake value")
    return node.meta["val"]


#: the operations returning a number of pieces computed from sizes: ``chunk``, and
#: ``split`` by a size (by a list of sizes, the list says how many)
_CHUNKING, _SPLITTING = frozenset({"chunk", "unsafe_chunk"}), frozenset({"split", "unsafe_split"})


def _splits_into_pieces(node: Node) -> bool:
    if node.op not in ("call_method", "call_function"):
        return False
    target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    if target in _SPLITTING:
        size = node.kwargs.get("split_size", node.args[1] if len(node.args) > 1 else None)
        return not isinstance(size, (list, tuple))
    return target in _CHUNKING


#: how torch's ``expand`` fails on a size it cannot prove 1 nor the one asked for
#: (``x[:, 1:-1][:, :1]`` has ``min(1, n - 2)`` columns, which sympy leaves open)
_EXPANDING = "non-broadcasting semantics require"


def _chunk_count_decided(node: Node, args: tuple, kwargs: dict, val: Any, default_min: set) -> list:
    """The conditions ``s >= 2`` a ``chunk``'s number of pieces rests on, for each
    dimension ``s`` of its length declared without a minimum, when the length at
    ``s = 1`` gives another number (``x.chunk(2)``: 2 pieces from the default range
    alone, without a guard, 1 piece for one row); none otherwise."""
    if not _splits_into_pieces(node) or not isinstance(val, (tuple, list)) or not args:
        return []
    target = node.target if isinstance(node.target, str) else node.target.__name__
    if target not in _CHUNKING:
        return []
    chunks = kwargs.get("chunks", args[1] if len(args) > 1 else None)
    dim = kwargs.get("dim", args[2] if len(args) > 2 else 0)
    tensor = args[0]
    if type(chunks) is not int or type(dim) is not int or not isinstance(tensor, torch.Tensor):
        return []
    length = tensor.shape[dim]
    if not isinstance(length, torch.SymInt):
        return []
    expr = length.node.expr
    symbols = expr.free_symbols & default_min
    at_one = expr.xreplace({symbol: sympy.Integer(1) for symbol in symbols})
    if not symbols or not at_one.is_Integer or int(at_one) < 0:
        return []
    pieces = len(torch.empty(int(at_one), device="meta").chunk(chunks))
    if pieces == len(val):
        return []
    return [sympy.Ge(symbol, 2) for symbol in sorted(symbols, key=str)]


def _slice_bounds(node: Node) -> set[int]:
    """The bounds, as numbers, of the slices ``node`` takes of a tensor (``x[:2]``,
    ``x[-3:, 1:]``: {2}, {3, 1}), whose bounds torch clamps to the sizes."""
    if node.op != "call_function" or node.target is not operator.getitem or len(node.args) != 2:
        return set()
    index = node.args[1]
    items = index if isinstance(index, tuple) else (index,)
    return {
        abs(bound)
        for item in items
        if type(item) is slice
        for bound in (item.start, item.stop)
        if type(bound) is int and bound != 0
    }


def _symbolic_slice_parts(node: Node) -> set[sympy.Basic]:
    """The floor divisions, minima and other functions of sizes in the symbolic bounds
    of the slices ``node`` takes (``x[-(n // 2):]``: ``{n // 2}``)."""
    if node.op != "call_function" or node.target is not operator.getitem or len(node.args) != 2:
        return set()
    index = node.args[1]
    parts: set[sympy.Basic] = set()
    for item in index if isinstance(index, tuple) else (index,):
        if type(item) is not slice:
            continue
        for bound in (item.start, item.stop):
            value = bound.meta.get("val") if isinstance(bound, Node) else None
            if isinstance(value, torch.SymInt):
                parts |= value.node.expr.atoms(sympy.Function)
    return parts


def _with_bound(
    bounds: set[int], parts: set, report: Callable, condition: sympy.Basic, value: bool
) -> None:
    """``report(condition, value)`` when ``condition`` compares with one of the
    ``bounds`` (a clamp of the slice: ``n >= 2`` for ``x[:2]``) or reads one of the
    ``parts`` of a symbolic bound (``-(n // 2) < 0``, whether ``x[-(n // 2):]``
    counts from the end: not at ``n = 1``, where it is the whole tensor)."""
    if {abs(int(a)) for a in condition.atoms(sympy.Integer)} & bounds or any(
        condition.has(part) for part in parts
    ):
        report(condition, value)


class FakeExecutionMixin(MixinBase):
    """The fake value of each node, and the decisions taken while computing it.

    Mixed into :class:`~yobx.torch.tracing.CustomTracer`, which provides ``dims``,
    ``shape_env``, ``fake_mode``, ``shape_rules``, ``refinements``, ``guards``, ``root``
    and the decisions of :class:`~yobx.torch.tracing.core.decisions.DecisionsMixin` (all
    declared in :class:`~.tracer_contract.TracerContract`).
    """

    def bind_unbacked(self, node: Node, val: Any) -> None:
        """Records where the sizes only known at run time (``x[mask]``, ``nonzero``)
        appear in the node's value, as torch.export does (``meta["unbacked_bindings"]``):
        a later re-run of the graph (the ONNX lowering) creates new symbols for them
        and binds them to these ones."""
        pending = self.shape_env.pending_fresh_unbacked_symbols
        if not pending:
            return
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

        # with YOBX_CHECK_SHAPE_RULES, torch's kernel ran too and made its own symbols
        present = free_unbacked_symbols(val)
        self.shape_env.ignorable_fresh_unbacked_symbols.extend(
            s for s in pending if s not in present
        )
        try:
            bindings = compute_unbacked_bindings(self.shape_env, val)
        except PendingUnbackedSymbolNotFound:
            # a size written with the symbol (u0 + 1), not the symbol: nothing to bind
            return
        if bindings:
            node.meta["unbacked_bindings"] = bindings

    def _record_folded_value(self, node: Node, value: Any) -> None:
        operands = [_fake_value(a) if isinstance(a, Node) else a for a in node.args]
        location = self.location()
        if node.target in _COMPARISONS:
            dims = self.trace_dims()
            lhs, rhs = (dims.render(o) for o in operands)
            expression = f"{lhs} {_COMPARISONS[node.target]} {rhs}"
            self.guards.append(Guard(expression, value, "bounds", location))
        build = _SYMPY_OPERATIONS.get(node.target) if node.op == "call_function" else None
        self.trace_refinements().rely_on_default_bounds(build, operands, value, location)

    def _run_fake(self, node: Node) -> Any:
        """Runs the node's operation on the fake values of its arguments."""
        args, kwargs = map_arg((node.args, node.kwargs), _fake_value)
        if _is_squeeze(node):
            not_one, one = self._decide_squeezed(args, kwargs)
            args, kwargs = squeeze_as_select(node, args, kwargs, one)
            if not_one and node.op == "call_method" and node.target == "squeeze_":
                # torch's fake kernel of an in-place squeeze of a symbolic dimension
                # crashes the process (a segmentation fault, torch 2.13): the dimensions
                # decided not to be 1 stay as they are, torch squeezes the others
                kept = _remaining_dims(args, kwargs, not_one)
                if not kept:
                    return args[0]
                args, kwargs = (args[0], kept), {}
        dims, rules = self.trace_dims(), self.shape_rules
        assert rules is not None, "a trace with dimensions has shape rules"
        guards_before = len(dims.shape_env.guards)
        known = dims.snapshot()
        if _is_contiguous_call(node):
            with self.fake_mode, torch.no_grad():
                copy = _copy_when_layout_undecided(args, kwargs)
            if copy is not None and _plain_contiguous(args, kwargs):
                copy = self.settled_layout(node, args, kwargs, copy)
            if copy is not None:
                return dims.canonical(copy)
        if self.state.layout_calls:
            self.decide_layouts_written(node)
        self.state.in_fake += 1
        # torch's own Python code runs here with the builtin isinstance: create_proxy,
        # the only caller, installed it (no proxy reaches fake kernels anyway)
        grad_mode = torch.is_grad_enabled()
        self._watch_default_bound_decisions(node, dims)
        try:
            # Fake values carry no autograd history: recording it costs time, and a
            # rule's output must not be a leaf that requires grad (in-place ops on it
            # would then fail where eager succeeds).
            torch._C._set_grad_enabled(False)
            # a call_module's target: the module's qualified name
            module = (
                self.root.get_submodule(cast(str, node.target))
                if node.op == "call_module"
                else None
            )
            val = rules.run(node, args, kwargs, module)
            if val is NotImplemented or self._check_shape_rules:
                # The fake convolution picks a memory format (strides only) by asking
                # the example's batch size (`batch < 16`): decided without recording
                # anything, so that this choice never narrows what is known about the
                # dimensions. Nor does torch's computation when it only checks a rule:
                # the rule's value is the one kept, and what torch decides on its way
                # there (a reshape inside matmul being a view at `seq == 1`) is no
                # decision of the capture, as it is not without the check.
                quiet = (
                    self.shape_env.suppress_guards()
                    if _is_convolution(node, module) or val is not NotImplemented
                    else contextlib.nullcontext()
                )
                knowledge_before = rules.what_is_known()
                with self.fake_mode, quiet:
                    expected = self._dispatch_fake(node, args, kwargs)
                if val is NotImplemented:
                    val = expected
                    unchanged = rules.what_is_known() == knowledge_before
                    rules.remember(node, val, unchanged)
                else:
                    shape_rules.compare(
                        val,
                        expected,
                        pytree.tree_leaves((args, kwargs)),
                        operation_name(node),
                        dims.prove,
                    )
        except (TraceError, shape_rules.ShapeRuleMismatch):
            raise
        except GuardOnDataDependentSymNode as e:
            # an operation whose result depends on tensor values (x[mask].view(n, ...))
            raise self.trace_refinements().data_dependent_error(
                e.cond if hasattr(e, "cond") else sympy.true,
                self.location(),
                f"{operation_name(node)} needs a decision on",
            ) from e
        except Exception as e:
            val = self._dispatch_again(node, args, kwargs, e)
        finally:
            torch._C._set_grad_enabled(grad_mode)
            self.state.in_fake -= 1
            dims.on_default_bound_division = None
            dims.on_default_bound_decision = None
        self._rely_on_what_was_folded(node, args, kwargs, val, dims)
        if len(dims.shape_env.guards) > guards_before:
            self._new_guards(guards_before, node, known)
        if is_reshape_call(node) or (_is_contiguous_call(node) and _plain_contiguous(args, kwargs)):
            val = self.settled_layout(node, args, kwargs, val)
        return dims.canonical(val)

    def _rely_on_what_was_folded(
        self, node: Node, args: tuple, kwargs: dict, val: Any, dims: Any
    ) -> None:
        """Judges as decisions what the default range or sympy's positive symbols
        settled in ``node``'s value without a guard: the number of a ``chunk``'s
        pieces, a slice's length ``min(1, n)``, ``max(n, 1)`` (see
        :mod:`.positive_folds`)."""
        for condition in [
            *_chunk_count_decided(node, args, kwargs, val, dims.default_min),
            *empty_slice_conditions(
                node, args, val, dims.default_min, dims.hint_of, dims.shape_env.replacements
            ),
            *folded_extremum_conditions(node, args, val),
        ]:
            self._rely_on_default_bounds(condition, True)

    def _watch_default_bound_decisions(self, node: Node, dims: Any) -> None:
        """Has the decisions torch takes from the default range alone while running
        ``node`` reported as decisions of the capture, where they decide values (the
        number of pieces, a slice's length)."""
        if _splits_into_pieces(node):
            # how many pieces there are rests on a quotient torch decides is not 0
            # (see SymbolicDimensions.on_default_bound_division); elsewhere (a reshape
            # to `d // 2` rows) such a decision changes nothing at 0 and would only
            # cost a version
            dims.on_default_bound_division = self._rely_on_default_bounds
        bounds, parts = _slice_bounds(node), _symbolic_slice_parts(node)
        if bounds or parts:
            # a slice's bounds are clamped to the size: a decision resting on the
            # default range (`2 > n -> False`) is its length (see
            # SymbolicDimensions.on_default_bound_decision). Only comparisons with a
            # bound are: torch's other decisions there (`n > 1`, a size-1 dimension's
            # stride) choose layouts, as they do elsewhere, whose values are the same
            dims.on_default_bound_decision = functools.partial(
                _with_bound, bounds, parts, self._rely_on_default_bounds
            )

    def _dispatch_again(self, node: Node, args: tuple, kwargs: dict, error: Exception) -> Any:
        """The node's fake value after ``error``: computed again where the failure has a
        known way around, else a :class:`TracingError` naming the operation."""
        retry = self._broadcast_decided(error, args, kwargs)
        try:
            if retry is None and _CONCRETE_ONLY in str(error):
                # a C++ kernel of a composite operator (masked_scatter's expand) takes
                # concrete sizes only; its Python decomposition, which the Python
                # dispatcher runs (as make_fx and torch.export do), keeps them symbolic
                with self.fake_mode, enable_python_dispatcher():
                    return self._dispatch_fake(node, args, kwargs)
            if retry is None:
                raise error
            with self.fake_mode:
                return self._dispatch_fake(node, *retry)
        except Exception as again:
            raise TracingError.at(
                self.location(),
                f"{operation_name(node)} failed on fake tensors with {exception_summary(again)}",
            ) from again

    def _broadcast_decided(self, error: Exception, args: tuple, kwargs: dict) -> Any:
        """torch's broadcasting decides ``size == 1`` size-obliviously (never, unless
        the ranges prove it), then needs equal sizes: ``x / x[:, -1:]`` fails where the
        slice's size (``Max(0, n - Max(0, n - 1))``: 1, or 0 when ``n`` is) is not
        provably ``n`` nor 1. Each size of the operands that may be 1 and is not
        provably the size it meets becomes a decision (``== 1``, with the example's
        answer, a version capturing the other side). ``expand`` fails the same way on
        a size sympy left open (``min(1, n - 2)``, "non-broadcasting semantics
        require"): its sizes are met as a tensor's would be. Returns ``(args, kwargs)``
        with the operands decided to broadcast given a literal 1 there (fake tensors:
        only their sizes matter), or None when there is nothing to decide."""
        if not isinstance(error, RuntimeError):
            return None
        leaves = pytree.tree_leaves((args, kwargs))
        shapes: list[torch.Size] = [t.shape for t in leaves if isinstance(t, torch.Tensor)]
        if _EXPANDING in str(error) and args and isinstance(args[0], torch.Tensor):
            # `x.expand(*sizes)`: the sizes are met as a tensor's would be
            requested = (
                args[1] if len(args) == 2 and isinstance(args[1], (tuple, list)) else args[1:]
            )
            shapes = [args[0].shape, torch.Size(requested)]
        elif "must match the size" not in str(error):
            return None
        ones: dict[Any, set[int]] = {}
        for axis in range(1, max((len(shape) for shape in shapes), default=0) + 1):
            # an expand's -1 keeps the size it meets
            sizes = [shape[-axis] for shape in shapes if len(shape) >= axis]
            sizes = [size for size in sizes if not (type(size) is int and size == -1)]
            for size in sizes:
                if not isinstance(size, torch.SymInt) or size.node.maybe_as_int() is not None:
                    continue
                if all(self.dims.decide(size == other) is True for other in sizes):
                    continue
                if self.dims.decide(size == 1) is None and self.decide(
                    size == 1, "broadcasting: the dimension's size is 1"
                ):
                    ones.setdefault(size.node.expr, set()).add(axis)
        if not ones:
            return None

        def with_ones(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            sizes = {a: t.shape[-a] for a in range(1, t.dim() + 1)}
            axes = {
                a
                for a, size in sizes.items()
                if isinstance(size, torch.SymInt) and a in ones.get(size.node.expr, ())
            }
            if not axes:
                return t
            shape = [1 if t.dim() - i in axes else d for i, d in enumerate(t.shape)]
            with self.fake_mode:
                return torch.empty(shape, dtype=t.dtype, device=t.device)

        return pytree.tree_map(with_ones, (args, kwargs))

    def _decide_squeezed(self, args: tuple, kwargs: dict) -> tuple[list[int], list[int]]:
        """``squeeze`` removes the dimensions of size 1: which ones decides the rank of
        its output, so each dynamic one is a decision the graph relies on (torch's fake
        kernel answers "not 1" without recording anything: a graph running with such a
        dimension of size 1 would compute with the wrong rank). Returns the dynamic
        dimensions decided not to be 1, and those decided to be 1 (see
        :mod:`.squeeze_selects`)."""
        x = args[0] if args else kwargs.get("input", kwargs.get("self"))
        if not isinstance(x, torch.Tensor):
            return [], []
        not_one: list[int] = []
        one: list[int] = []
        for d in _squeezed_dims(x, args, kwargs):
            size = x.shape[d]
            if isinstance(size, torch.SymInt) and size.node.maybe_as_int() is None:
                decided = self.decide(size == 1, "squeeze: the dimension's size is 1")
                (one if decided else not_one).append(d)
        return not_one, one

    def _dispatch_fake(self, node: Node, args: tuple, kwargs: dict) -> Any:
        """Runs the node's operation through torch (the fake mode must be active)."""
        if node.op == "call_function":
            function = function_variant(node.target, args)
            if _needs_python_dispatcher(function, args, kwargs):
                with enable_python_dispatcher():
                    return function(*args, **kwargs)
            return function(*args, **kwargs)
        # a method's or a module's target: its name
        if node.op == "call_method":
            return getattr(args[0], cast(str, node.target))(*args[1:], **kwargs)
        return self._run_leaf_module(cast(str, node.target), args, kwargs)

    def _run_leaf_module(self, target: str, args, kwargs) -> Any:
        """Runs a leaf module on fake inputs with fake parameters and buffers.

        The module's own tensors are swapped for fake copies so that in-place updates
        in its forward (BatchNorm's running statistics) never touch the real ones.
        A module without buffers runs as it is (faster): the fake mode converts its
        parameters (the same static fake copies as :meth:`SymbolicDimensions.from_real`)
        and never writes into them, except one-element tensors, which it may compute
        for real (constant propagation): modules holding one keep the fake swap.
        """
        module = self.root.get_submodule(target)
        same = isinstance(module, torch.nn.modules.conv._ConvNd) and isinstance(module.padding, str)
        # as for F.conv1d(..., padding="same"): see _needs_python_dispatcher
        with enable_python_dispatcher() if same else contextlib.nullcontext():
            # Parameters on the meta device take the swap too: their fake copies are CPU
            # tensors (see SymbolicDimensions.from_real).
            if next(module.buffers(), None) is None and all(
                p.numel() > 1 and p.device.type != "meta" for p in module.parameters()
            ):
                return module(*args, **kwargs)
            state = {
                name: self.trace_dims().from_real(t)
                for name, t in (*module.named_parameters(), *module.named_buffers())
            }
            return torch.func.functional_call(module, state, tuple(args), kwargs, strict=False)

    def _new_guards(self, start: int, node: Node, known: tuple[dict, dict]) -> None:
        """Guards added by an operation are facts taken from the example: adopted as
        constraints when not provable from what was known before the operation."""
        adopted = set()
        for guard in self.shape_env.guards[start:]:
            if self.state.allowed_guards or (
                sympy.count_ops(guard.expr) <= _MAX_PROVED_GUARD_OPERATIONS
                and self.trace_dims().prove(guard.expr, known) is True
            ):
                continue
            location = self.location()
            expr = guard.expr
            indices = self.loop_symbols(expr)
            if indices:
                # a fact on a loop's index: the loop is unrolled, the index is a constant
                what = f"{operation_name(node)} needs `{self.trace_dims().render(expr)}`"
                self.loop_refuse(indices, what)
                expr = expr.xreplace({s: self.trace_dims().hint_of(s) for s in indices})
                if expr is sympy.true:
                    continue
            constraint = self.trace_refinements().adopt(
                expr, location, operation_name(node), known=True
            )
            # a kernel may check the same fact twice (reshape: a remainder, then a product)
            if constraint.expression not in adopted:
                adopted.add(constraint.expression)
                self.guards.append(Guard(constraint.expression, True, "adopted", location))
