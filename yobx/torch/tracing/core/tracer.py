"""CustomTracer: a torch.fx tracer whose proxies know real tensor metadata.

The tracer is assembled from mixins, one concern each: :mod:`.fake_execution` (the
fake value of every node), :mod:`.traced_attributes` (leaves, attributes, constants),
:mod:`.graph_finish` (code generation, runtime checks, the traced model, the default
passes) and :mod:`.decisions` (Python conversions of symbolic values). What one trace
accumulates is a :class:`.trace_state.TraceState`, the tracer's ``state``, replaced for
every trace. This module holds the trace itself: inputs, proxies and the patch window.
"""

from __future__ import annotations

import builtins
import collections
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch.fx.node import Node
from torch.fx.proxy import Proxy, TraceError

from ...frozen_gc import older_objects_frozen
from ...quiet_logs import quieted
from .. import shape_rules
from ..constraints.constraints import Constraint
from ..constraints.decided_layouts import decided_layouts
from ..constraints.input_layouts import reads_layout
from ..constraints.refinement import Refinements
from ..constraints.runtime_checks import RuntimeCheck
from ..errors import LayoutAliasNeeded, SpecializationError, autocast_refused
from ..inputs import (
    NO_EXAMPLE,
    FlatInputs,
    bind_example_inputs,
    flatten_example_inputs,
    flatten_output,
    register_cache_flattening,
)
from ..isolation.deferred_interrupts import PENDING as PENDING_INTERRUPT
from ..isolation.deferred_interrupts import deferred_interrupts, raise_pending_interrupt
from ..isolation.fx_isolation import fx_tracing_per_thread
from ..isolation.module_classes import traced_module_classes
from ..isolation.module_snapshot import preserved_modules
from ..isolation.patch_window import (
    PatchWindow,
    current_window,
    finish_window,
    one_trace_at_a_time,
)
from ..isolation.torch_frames import cheap_uninteresting_files
from ..symbolic.symbolic import DEFAULT_MIN, Guard, SymbolicDimensions
from ..symbolic.symbolic_memo import memoized_symbolic_arithmetic
from .decisions import NOT_CONSTANT, DecisionsMixin, constant_value, user_location
from .fake_execution import FakeExecutionMixin
from .graph_finish import GraphFinishMixin, _CallableModule, graph_fingerprint
from .layout_copies import LayoutCopiesMixin
from .loop_tracing import PIECE_TARGETS, LoopsMixin
from .module_state import buffer_assignments
from .proxies import (
    CustomProxy,
    CustomProxyShape,
    proxy_class_for,
)
from .proxy_patches import (
    TENSOR_FACTORIES,
    patch_len_in,
    replace_problematic_function_before_tracing,
)
from .state_writes import StateWrites
from .trace_results import TraceResultsMixin
from .trace_state import TraceState
from .traced_attributes import CONSTANT_PREFIX, AttributesMixin

_BUILTIN_ISINSTANCE = builtins.isinstance
#: the values of ``CustomTracer(narrowing=...)``
NARROWING = ("versions", "constraints")
#: the most versions a capture chooses between unless told (``max_versions``): the
#: Llama decode step of ``_scripts/bench_decode_latency.py`` has exactly 8 (an empty
#: cache or not, one new token or several, a mask shorter, longer or as long as the
#: cache)
DEFAULT_MAX_VERSIONS = 8
_AUTOCAST_ENABLED = torch._C._is_any_autocast_enabled


#: target -> the base name torch.fx gives its nodes (``Graph._target_to_str``, a regular
#: expression per node otherwise)
_NODE_NAMES: dict[Any, str] = {}


class _ModuleStack(collections.OrderedDict):
    """torch.fx's stack of the modules being called, which it copies into the
    ``meta["nn_module_stack"]`` of every node: ``copy.copy`` of an ``OrderedDict``
    goes through ``__reduce_ex__`` (a few percent of a trace); the copy is the same
    plain ``OrderedDict``."""

    def __copy__(self) -> collections.OrderedDict:
        return collections.OrderedDict(self)


def _has_symbol(args: Any) -> bool:
    return any(
        isinstance(a, Node)
        and isinstance(a.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))
        for a in args
    )


def _check_traceable(root: Any) -> None:
    if not isinstance(root, torch.nn.Module) and not callable(root):
        raise TypeError(
            f"CustomTracer.trace expects a torch.nn.Module or a callable, got "
            f"{type(root).__name__}; wrap the computation in a module or a function"
        )


class CustomTracer(
    LoopsMixin,
    FakeExecutionMixin,
    LayoutCopiesMixin,
    AttributesMixin,
    GraphFinishMixin,
    DecisionsMixin,
    TraceResultsMixin,
    torch.fx.Tracer,
):
    """A symbolic tracer whose proxies carry fake tensors with symbolic dimensions.

    Each traced operation also runs on fake values, so every node gets ``meta["val"]``
    and shape-dependent Python code (``if x.shape[0] == 0``, ``len(x)``, loops over a
    shape, item assignment...) traces as it runs, while dynamic dimensions stay
    symbolic. Comparisons of dynamic dimensions are decided only when provable; the
    assumptions used are listed in :attr:`guards`.

    :param autowrap_modules: modules whose functions are recorded as ``call_function``
        when they receive a proxy (``math`` by default)
    :param autowrap_functions: functions recorded the same way when referenced as
        globals of the traced code (tensor factories by default)
    :param param_shapes_constant: kept for compatibility with ``torch.fx.Tracer``;
        parameter shapes are always static here
    :param module_leaves: maps a module type to ``f(module, qualified_name) -> bool``
        deciding whether an instance stays a leaf (a ``call_module`` node)
    :param specialize_undecidable: adopt facts from the example for every dimension,
        named ``torch.export.Dim`` included, and let any dimension become static (as if
        every dimension were declared ``Dim.AUTO``); by default string names and
        ``Dim.DYNAMIC`` adopt facts as constraints, ``Dim.AUTO`` may also become
        static, and a named ``Dim`` adopts nothing (see :mod:`.refinement`)
    :param runtime_checks: the traced graph checks, when it runs, that its inputs
        satisfy the declared ranges and every adopted constraint
        (:class:`~yobx.torch.tracing.ConstraintViolationError` otherwise)
    :param narrowing: what an undecided decision on dimensions declared with a string
        name, ``Dim.DYNAMIC`` or ``Dim.AUTO`` becomes: ``"versions"`` (the default)
        captures its other side too, when eager runs there, and the graph chooses
        between the captures at run time (:mod:`.versions`); ``"constraints"`` adopts
        the example's answer as a constraint. A named ``torch.export.Dim`` stays strict.
    :param max_versions: the most versions ``narrowing="versions"`` captures; decisions
        beyond become constraints (:attr:`version_notes` says which)
    :param version_seconds: a time limit on the versions beyond the first capture,
        None (the default) for none: ``max_versions`` alone bounds them, and the same
        model gives the same versions on every machine. With a limit, decisions met
        after it become constraints (:attr:`version_notes` says which), except the
        sides every caller passes (a single token, an empty cache), and the versions
        depend on the machine's speed. A version costs about one capture and one eager
        run; at sizes the example avoided (odd windows) a capture may cost several times
        the first

    Traces in several threads run one after the other. While a trace runs, the
    functions it replaces answer as usual in every other thread, and after it (also
    after an error or a ``KeyboardInterrupt``) no patch, fake mode or proxy mode is
    left installed.
    """

    #: raise a named Dim's needed constraint where it is needed (see :mod:`.refinement`)
    _strict_at_once = False

    #: whether the versions must return each output with one rank and dtype: the other
    #: side of a decision where one differs (``x.squeeze(0)`` at ``x.shape[0] == 1``)
    #: then stays a constraint. The ONNX export sets it (an ``If`` returns one type per
    #: output); the traced graph chooses between any versions
    versions_of_one_type = False

    #: the module the traced graph belongs to (``GraphModule(tracer.traced_model, g)``)
    traced_model: torch.nn.Module | None
    #: assumptions the traced graph relies on (last trace)
    guards: list[Guard]

    def __init__(
        self,
        autowrap_modules: tuple = (math,),
        autowrap_functions: tuple[Callable, ...] | None = None,
        param_shapes_constant: bool = False,
        module_leaves: dict[type, Callable[[torch.nn.Module, str], bool]] | None = None,
        specialize_undecidable: bool = False,
        runtime_checks: bool = True,
        narrowing: str = "versions",
        max_versions: int = DEFAULT_MAX_VERSIONS,
        version_seconds: float | None = None,
    ):
        if narrowing not in NARROWING:
            raise ValueError(f"narrowing must be one of {NARROWING}, not {narrowing!r}")
        if max_versions < 1:
            raise ValueError(f"max_versions must be at least 1, not {max_versions}")
        # what a version's tracer is built with (see _version_tracer)
        self._init_kwargs: dict[str, Any] = {
            "autowrap_modules": autowrap_modules,
            "autowrap_functions": autowrap_functions,
            "param_shapes_constant": param_shapes_constant,
            "module_leaves": module_leaves,
            "specialize_undecidable": specialize_undecidable,
            "runtime_checks": runtime_checks,
        }
        super().__init__(
            autowrap_modules=autowrap_modules,
            autowrap_functions=tuple(
                TENSOR_FACTORIES if autowrap_functions is None else autowrap_functions
            ),
            param_shapes_constant=param_shapes_constant,
        )
        self.module_leaves = dict(module_leaves or {})
        self.specialize_undecidable = specialize_undecidable
        self.runtime_checks = runtime_checks
        self.narrowing = narrowing
        self.max_versions = max_versions
        self.version_seconds = version_seconds
        #: the versions of the last trace, when it captured several (see :mod:`.versions`)
        self.versions: list = []
        #: why undecided decisions of the last trace stayed constraints
        self.version_notes: list[str] = []
        #: the decisions a version's trace stands on (assumed when it starts)
        self._path_conditions: list = []
        # dimensions taking a size below 2 (1 or 0) in the capture a trace from other
        # sizes stands in for (see _trace_from_other_size)
        self._small_sizes: dict[str, int] = {}
        #: the ``file:line`` of the ``contiguous()`` and reshape calls whose layout is
        #: decided from the start: a write into their result needs it (see
        #: core.layout_copies)
        self.aliased_layouts: set[str] = set()
        self._version_constraints: list[Constraint] | None = None
        self._version_checks: list[RuntimeCheck] | None = None
        self.proxy_buffer_attributes = True
        #: the symbolic dimensions of the last trace (None before any)
        self.dims: SymbolicDimensions | None = None
        self.refinements: Refinements | None = None
        self.shape_rules: shape_rules.ShapeRules | None = None
        self._check_shape_rules = False
        self._clear()

    def _clear(self) -> None:
        """The state of one trace, empty: also what a tracer used by hand (nodes and
        proxies built outside :meth:`trace`) works with."""
        #: the module the traced graph belongs to (``GraphModule(tracer.traced_model, g)``)
        self.traced_model: torch.nn.Module | None = None
        #: assumptions the traced graph relies on
        self.guards: list[Guard] = []
        #: everything else the trace accumulates (see :class:`.trace_state.TraceState`)
        self.state = TraceState()
        # torch.fx's bookkeeping of the modules being traced; a trace that raised
        # leaves entries behind, and a tracer may be used again.
        self.module_stack = _ModuleStack()
        self.num_calls = {}

    # tracing

    def trace(
        self,
        root: torch.nn.Module | Callable[..., Any],
        concrete_args: dict[str, Any] | None = None,
        remove_inplace: bool = True,
        update_model_with_callable: bool = True,
        dynamic_shapes: Any = None,
        verbose: int = 0,
    ) -> torch.fx.Graph:
        """Traces ``root``, with example inputs when given, and returns the graph.

        :param root: a ``torch.nn.Module`` or a callable
        :param concrete_args: example input per parameter name (optional), or a tuple
            of positional examples (as torch.export's ``args``); tensor inputs stay
            placeholders (they are examples, not constants) whose nodes carry fake
            values with symbolic dimensions; Python constants (None, ints,
            bools, strings, lists of them) are baked in and checked when the graph
            runs; lists, tuples and dicts keep their structure. A parameter without an
            example becomes a placeholder without metadata, as in
            ``torch.fx.symbolic_trace``: everything that needs no decision on its values
            or shapes traces, and the first decision that does raises a
            :class:`~torch.fx.proxy.TraceError` naming the line and the example to pass
        :param remove_inplace: run the default passes on the graph
            (:func:`yobx.torch.passes.run_default_passes`: the graph becomes functional)
        :param update_model_with_callable: when ``root`` is a plain callable, wrap it into
            a module stored in :attr:`traced_model` (else it stays None for callables)
        :param dynamic_shapes: torch.export's format: per parameter (dict by name or
            tuple), ``{axis: torch.export.Dim(...) or "name"}``, nested like the inputs
        :param verbose: verbosity
        :return: the graph; run it with ``torch.fx.GraphModule(tracer.traced_model, graph)``
        :raises TraceError: when the code cannot be traced soundly (the message names
            the user's file and line)
        :raises TypeError: ``root`` is neither a module nor a callable

        Example (a slice by half the dynamic batch, checked at another size)::

            >>> import torch
            >>> from yobx.torch.tracing import CustomTracer
            >>> class Half(torch.nn.Module):
            ...     def forward(self, x):
            ...         return x[: x.shape[0] // 2] * 2
            >>> tracer = CustomTracer()
            >>> graph = tracer.trace(
            ...     Half(),
            ...     concrete_args={"x": torch.randn(6, 3)},
            ...     dynamic_shapes={"x": {0: "batch"}},
            ... )
            >>> gm = torch.fx.GraphModule(tracer.traced_model, graph)
            >>> gm(torch.ones(4, 3)).shape
            torch.Size([2, 3])
        """
        _check_traceable(root)
        arguments = (dynamic_shapes, remove_inplace, update_model_with_callable, verbose)
        with one_trace_at_a_time():
            return self._trace_until_layouts_settle(root, concrete_args, arguments)

    def _trace_until_layouts_settle(self, root, concrete_args, arguments: tuple):
        while True:
            try:
                return self._trace_or_from_other_size(root, concrete_args, arguments)
            except LayoutAliasNeeded as error:
                # a contiguous() or a reshape traced as a copy is written into where it
                # is a view of its input: captured again, that call's layout decided
                # from the start (see core.layout_copies)
                if error.copy_location in self.aliased_layouts:
                    raise
                self.aliased_layouts.add(error.copy_location)

    def _trace_or_from_other_size(self, root, concrete_args, arguments: tuple):
        try:
            return self._trace_with_versions(root, concrete_args, *arguments)
        except SpecializationError as error:
            if self.narrowing != "versions" or error.fact is None:
                raise
            try:
                return self._trace_from_other_size(root, error, *arguments)
            except SpecializationError as again:
                if again is not error or not error.pinned_by_ranges:
                    raise
        # no other size does better: the example's capture and its versions stand
        dynamic_shapes, remove_inplace, update_model_with_callable, verbose = arguments
        return self._trace_with_versions(
            root,
            concrete_args,
            dynamic_shapes,
            remove_inplace,
            update_model_with_callable,
            verbose,
            pins=False,
        )

    def _trace_from_other_size(
        self, root, error: SpecializationError, *arguments
    ) -> torch.fx.Graph:
        """A decision makes a dimension declared dynamic the example's size (``if
        d == 3`` with ``d`` at 3): the model is captured from sizes where it is false,
        and the example's side becomes one of its versions (``d == 3``, where the
        dimension is a constant). ``error`` is raised again when no size inside the
        declared ranges takes the other side, eager raises there, or the joined graph
        would not cover the example."""
        from ..constraints.versions import covers, example_beyond, example_sizes

        sizes, facts, locations = example_sizes(self.dims), [error.fact], [error.location]
        # a dimension the example has at 1 (or 0) keeps its range from there at other sizes
        self._small_sizes = {n: size for n, size in sizes.items() if size < DEFAULT_MIN}
        try:
            while len(facts) <= self.max_versions:
                example = example_beyond(self, root, facts)
                if example is None:
                    raise error
                try:
                    graph = self._trace_with_versions(root, example, *arguments)
                except SpecializationError as other:
                    if other.fact is None or other.location in locations:
                        # the same line needs the new size too (a loop that is no scan
                        # needs its number of steps at every size): no version does better
                        raise error from None
                    facts.append(other.fact)  # `if d == 3: ... elif d == 5: ...`
                    locations.append(other.location)
                    continue
                except Exception:
                    # the other size fails in another way: the example's error is the
                    # one its user can act on
                    raise error from None
                if not covers(self, sizes):
                    raise error
                return graph
        finally:
            self._small_sizes = {}
        raise error

    def _trace_with_versions(
        self,
        root,
        concrete_args,
        dynamic_shapes,
        remove_inplace: bool,
        update_model_with_callable: bool,
        verbose: int,
        pins: bool = True,
    ) -> torch.fx.Graph:
        """One capture, then the versions of its undecided decisions (see .versions).

        :param pins: a dimension declared dynamic that the capture holds at the
            example's size through inequalities raises, as an equality would (see
            :mod:`..constraints.example_pins`)
        """
        from ..constraints.example_pins import example_pin

        self.versions, self.version_notes = [], []
        self._version_constraints = self._version_checks = None
        graph = self._trace_in_window(
            root, concrete_args, dynamic_shapes, remove_inplace, update_model_with_callable, verbose
        )
        if self._versions_wanted():
            pinned = example_pin(self) if pins else None
            if pinned is not None:
                raise pinned
            graph = self._trace_versions(
                root,
                graph,
                self.version_seconds,
                dynamic_shapes=dynamic_shapes,
                remove_inplace=remove_inplace,
                update_model_with_callable=update_model_with_callable,
            )
        return graph

    def _trace_in_window(
        self,
        root,
        concrete_args,
        dynamic_shapes,
        remove_inplace: bool,
        update_model_with_callable: bool,
        verbose: int,
    ) -> torch.fx.Graph:
        """One trace, inside the process-wide patch window."""
        # One trace at a time in the process; its patches hold for this thread only, and
        # everything is restored in this frame's `finally`, which no interrupt can skip
        # (an interrupt landing in the restoration makes it run again, see patch_window).
        window = PatchWindow()
        error = None
        try:
            window.open()
            with (
                cheap_uninteresting_files(),
                older_objects_frozen(),
                deferred_interrupts(),
                # torch logs the traceback of a fake kernel that fails (25 lines of a
                # shape mismatch) before yobx raises its own error, naming the line
                quieted("torch._subclasses.fake_tensor", logging.CRITICAL),
            ):
                return self._trace(
                    root,
                    concrete_args,
                    dynamic_shapes,
                    remove_inplace=remove_inplace,
                    update_model_with_callable=update_model_with_callable,
                    verbose=verbose,
                )
        except BaseException as e:
            error = e
            raise
        finally:
            finish_window(window, error)

    def _trace(
        self,
        root,
        concrete_args,
        dynamic_shapes,
        *,
        remove_inplace: bool,
        update_model_with_callable: bool,
        verbose: int,
    ) -> torch.fx.Graph:
        """:meth:`trace` inside its patch window."""
        self._reset()
        fake_mode = self.trace_dims().fake_mode
        window = current_window()
        assert window is not None, "_trace runs in the window _trace_in_window opened"
        window.push(lambda: _settle_fake_mode(fake_mode))
        module = root if isinstance(root, torch.nn.Module) else _CallableModule(root)
        forward = root.forward if isinstance(root, torch.nn.Module) else root
        self.state.inputs = flatten_example_inputs(
            bind_example_inputs(forward, concrete_args, allow_missing=True),
            dynamic_shapes,
            self.trace_dims(),
        )
        if self._path_conditions:
            self._assume_path()
        self._index_tensors(module)
        self.state.state_writes = StateWrites(self)
        with (
            self.state.state_writes,
            fx_tracing_per_thread(),
            traced_module_classes(module),
            preserved_modules(module),
            replace_problematic_function_before_tracing(),
            memoized_symbolic_arithmetic(),
            decided_layouts(),
            buffer_assignments(self._assign_buffer, self.module_assigned),
        ):
            try:
                graph = super().trace(module)
            except TraceError as e:
                strict = self.trace_refinements().strict_error()
                if strict is None:
                    raise
                raise strict from e
        strict = self.trace_refinements().strict_error()
        if strict is not None:
            raise strict
        self._finish(graph, module, root, update_model_with_callable)
        self._mark_storages(graph)
        if remove_inplace:
            self._apply_default_passes(graph)
        graph.lint()
        if verbose:
            print(graph)
            for guard in self.guards:
                print(f"guard: {guard}")
        return graph

    # versions (see .versions)

    def _versions_wanted(self) -> bool:
        """Whether the last trace left decisions whose other side may be captured."""
        if self.narrowing != "versions" or self.refinements is None:
            return False
        if not any(f.constraint.kind != "value" for f in self.refinements.adopted):
            return False
        inputs = self.state.inputs
        return inputs is not None and all(leaf is not NO_EXAMPLE for leaf in inputs.leaves)

    def _trace_versions(
        self, root, graph: torch.fx.Graph, seconds: float | None, **trace_arguments
    ) -> torch.fx.Graph:
        """Captures the other sides of the undecided decisions, for at most ``seconds``
        (None: within ``max_versions`` only), and joins the versions."""
        from ..constraints.version_join import VersionJoin
        from ..constraints.version_writes import SharedStorageWrite
        from ..constraints.versions import Versioning, leaves, version_checks, version_constraints

        versioning = Versioning(self, root, graph, seconds, **trace_arguments)
        tree = versioning.run()
        self.version_notes = versioning.notes
        versions = leaves(tree)
        if len(versions) == 1:
            return graph
        try:
            joined, self.traced_model = VersionJoin(self, versioning.first).join(tree)
        except SharedStorageWrite as e:
            self.version_notes.append(str(e))
            return graph
        self.versions = versions
        self._version_constraints = constraints = version_constraints(versions)
        self._version_checks = version_checks(versioning.first, versions)
        for node in joined.find_nodes(op="output"):
            node.meta["guards"] = list(self.guards)
            node.meta["constraints"] = list(constraints)
        joined.lint()
        return joined

    def _version_tracer(self, path: list) -> CustomTracer:
        """A tracer like this one for a version standing on the decisions ``path``."""
        child = type(self)(**self._init_kwargs)
        child.narrowing = "constraints"
        child._path_conditions = list(path)
        child._small_sizes = dict(self._small_sizes)
        child.aliased_layouts = set(self.aliased_layouts)
        return child

    def _assume_path(self) -> None:
        """A version's trace starts from the decisions it stands on (see .versions)."""
        from torch.fx.experimental.sym_node import SymNode

        from ..constraints.versions import in_dimensions

        dims = self.trace_dims()
        for condition in self._path_conditions:
            fact = in_dimensions(dims, condition.condition)
            # with its value on the example (the version's witness satisfies it): the
            # ShapeEnv then knows it as a fact, not as an assertion deferred to run time
            known = torch.SymBool(SymNode(fact, dims.shape_env, bool, hint=True))
            self.trace_refinements().assume_path(fact, self._assuming(known))
            self.guards.append(Guard(condition.expression, True, "version", condition.location))

    def _assuming(self, known: torch.SymBool) -> Callable[[Any], None]:
        """What assuming a version's condition runs: ``known`` becomes a fact."""
        return lambda _: self._assume(known)

    def _reset(self) -> None:
        self.dims = SymbolicDimensions()
        self.dims.declared_at = user_location()
        self.dims.small_sizes = dict(self._small_sizes)
        self.dims.consult_prover()
        self.shape_rules = shape_rules.ShapeRules(self.dims.fake_mode, self.dims.from_real)
        self._check_shape_rules = shape_rules.check_enabled()
        self.refinements = Refinements(
            self.dims,
            self._assume,
            adopt_all=self.specialize_undecidable,
            strict_at_once=self._strict_at_once,
        )
        self._clear()

    def _index_tensors(self, module: torch.nn.Module) -> None:
        self.state.tensor_names = {}
        named = [
            *module.named_parameters(remove_duplicate=False),
            *module.named_buffers(remove_duplicate=False),
        ]
        for name, tensor in named:
            self.state.tensor_names.setdefault(id(tensor), name)
        self.trace_dims().static_fakes.index(tensor for _, tensor in named)

    def create_args_for_root(self, root_fn, is_module, concrete_args=None):
        """Creates one placeholder per flattened input leaf (see :mod:`.inputs`)."""
        inputs: FlatInputs = self.state.inputs
        proxies, baked = [], []
        for name, leaf, sizes in zip(inputs.names, inputs.leaves, inputs.sizes):
            node = self.create_node("placeholder", name, (), {})
            if leaf is NO_EXAMPLE:
                # no example: a placeholder without metadata, as torch.fx makes
                baked.append(False)
                proxies.append(CustomProxy(node, self))
                continue
            node.meta["example_value"] = leaf
            if sizes is None:
                # Python scalars and other constants are baked in, as torch.export does.
                node.meta["val"] = leaf
                if isinstance(leaf, (int, float, bool)):
                    self.guards.append(Guard(f"{name} == {leaf!r}", True, "constant argument"))
            elif isinstance(sizes, torch.SymInt):
                # an int declared dynamic
                node.meta["val"] = sizes
            else:
                node.meta["val"] = self.dims.fake_tensor(leaf, sizes)
            baked.append(sizes is None)
            proxies.append(CustomProxy(node, self))

        structured = any(not child.is_leaf() for child in inputs.in_spec.children()) or len(
            inputs.keyword_names
        ) != len(inputs.arg_names)

        def flat_fn(*placeholder_proxies):
            patch_len_in(getattr(root_fn, "__func__", root_fn))
            leaves = [
                leaf if is_baked else p
                for p, leaf, is_baked in zip(placeholder_proxies, inputs.leaves, baked)
            ]
            out = inputs.call(root_fn, leaves, self_arg=self.root if is_module else None)
            register_cache_flattening(out)
            flat_out, out_spec = flatten_output(out)
            self.state.out_spec = out_spec
            self.state.structured = structured or not _is_simple_output(out_spec)
            return tuple(flat_out) if self.state.structured else out

        return flat_fn, proxies

    # graph passes (thin calls into yobx.torch.passes, kept on the tracer's public API)

    @classmethod
    def remove_inplace(cls, graph, exported_program=None, verbose=0, exc=True, recursive=False):
        """See :func:`yobx.torch.passes.remove_inplace`; returns a plain int, not the
        :class:`~yobx.torch.passes.PassResult`."""
        from ...passes import remove_inplace

        # [passes, issue 11] the seed's classmethods return plain ints
        return int(
            remove_inplace(graph, exported_program, verbose=verbose, exc=exc, recursive=recursive)
        )

    @classmethod
    def remove_unnecessary_slices(cls, graph, verbose=0):
        """See :func:`yobx.torch.passes.remove_unnecessary_slices`; returns a plain int, not the
        :class:`~yobx.torch.passes.PassResult`."""
        from ...passes import remove_unnecessary_slices

        return int(remove_unnecessary_slices(graph, verbose=verbose))

    @classmethod
    def remove_batch_dim_nodes(cls, graph, verbose=0):
        """See :func:`yobx.torch.passes.remove_batch_dim_nodes`; returns a plain int, not the
        :class:`~yobx.torch.passes.PassResult`."""
        from ...passes import remove_batch_dim_nodes

        return int(remove_batch_dim_nodes(graph, verbose=verbose))

    @classmethod
    def graph_erase_node(cls, graph, node):
        """See :func:`yobx.torch.passes.graph_erase_node`."""
        from ...passes import graph_erase_node

        return graph_erase_node(graph, node)

    # proxies

    def proxy(self, node: Node, cls: type | None = None, **kwargs: Any) -> CustomProxy:
        """Wraps a node in a proxy.

        :param node: the node (of this tracer's graph)
        :param cls: the proxy class; by default the one matching the node's value
            (:class:`CustomProxyInt` for a SymInt...)
        :param kwargs: given to the class (``concrete_val=...`` for
            :class:`CustomProxyInt`)
        """
        if cls is None:
            cls = proxy_class_for(node.meta.get("val"))
        return cls(node, self, **kwargs)

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None):
        """torch.fx's, with the name a target gives its nodes computed once per target,
        and without its walk of the arguments in search of raw SymInts."""
        if name is None and (kind == "call_function" or kind == "call_method"):
            try:
                name = _NODE_NAMES.get(target)
                if name is None:
                    name = _NODE_NAMES[target] = self.graph._target_to_str(target)
            except TypeError:  # an unhashable callable
                pass
        writes = self.state.state_writes is not None and self.state.state_writes.writes_attribute(
            kind, target, args, kwargs
        )
        if writes:
            args = (self.state.state_writes.written_argument(args[0]), *args[1:])
        if type(args) is tuple and args and self.graph.owning_module is None:
            # torch.fx walks the arguments with pytree for raw SymInts (a tenth of a
            # node's cost; create_arg warns instead): they are set after, as torch.fx
            # sets them (users included). An owning module's hooks see torch.fx's node.
            node = super().create_node(kind, target, (), kwargs, name, type_expr)
            node.args = args
        else:
            node = super().create_node(kind, target, args, kwargs, name, type_expr)
        if self.state.active_loop is not None:
            self.record_in_loop(node)
        if writes and node.args[0].op == "get_attr":
            self.state.state_writes.note_write(node)
        return node

    def create_proxy(
        self,
        kind,
        target,
        args,
        kwargs,
        name=None,
        type_expr=None,
        proxy_factory_fn=None,
    ):
        """Creates the node, computes its fake value, returns a proxy or a constant."""
        if PENDING_INTERRUPT[0]:
            # a Ctrl-C during the trace: raised here, between two operations
            raise_pending_interrupt()
        if _AUTOCAST_ENABLED():
            raise autocast_refused(self.location())
        # torch.fx's and torch's code run in here (and a leaf module's forward, on fake
        # values): no proxy reaches a model's isinstance, so all of them get the builtin
        # rather than the trace's Python function (thousands of calls per trace)
        patched_isinstance = builtins.isinstance
        builtins.isinstance = _BUILTIN_ISINSTANCE
        try:
            return self._create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        finally:
            builtins.isinstance = patched_isinstance

    def _create_proxy(self, kind, target, args, kwargs, name, type_expr, proxy_factory_fn):
        if args and isinstance(args[0], Proxy) and reads_layout(kind, target):
            # the graph's values depend on the layout of the inputs this is computed
            # from (a read folded into a constant leaves no node: see input_layouts)
            self.state.layout_reads.append((args[0].node, self.location()))
        if (
            target in PIECE_TARGETS
            and self.state.active_loop is None
            and not self.state.pieces_made
        ):
            # x.unbind(d) on a symbolic size: pieces to loop over or join (see loops)
            pieces = self.symbolic_pieces(kind, target, args, kwargs)
            if pieces is not None:
                return pieces
        if self.state.pieces_out and kind == "call_function":
            joined = self.join_pieces(target, args, kwargs)
            if joined is not None:
                return joined
        if self.state.active_loop is not None:
            # a slice of length 1 at a loop's index (see loop_tracing)
            sliced = self.loop_slice(kind, target, args, kwargs)
            if sliced is not None:
                return sliced
        if self.state.loop_outputs:
            # values of a loop that becomes a scan (see loop_tracing)
            stacked = self.loop_use(kind, target, args, kwargs)
            if stacked is not None:
                return stacked
        args_ = self.create_arg(args)
        kwargs_ = self.create_arg(kwargs)
        node = self.create_node(kind, target, args_, kwargs_, name, type_expr)
        if self.dims is None or not _known_inputs(node):
            # outside a trace, or from an input traced without example: torch.fx's
            # proxies, which know nothing of their values
            node.meta["stack_trace"] = self.stack_trace()
        elif kind == "get_attr":
            value = self._attribute(target)
            node.meta["val"] = (
                self.dims.from_real(value) if isinstance(value, torch.Tensor) else None
            )
        elif kind != "placeholder":
            if kind == "call_method" and isinstance(target, str) and target.endswith("_"):
                self.state.shape_cache.pop(args_[0], None)
            val = self._run_fake(node)
            node.meta["val"] = val
            self.bind_unbacked(node, val)
            constant = constant_value(val)
            if constant is not NOT_CONSTANT:
                if _has_symbol(node.args):
                    # torch already simplified the value from the known ranges: still a
                    # decision the graph relies on, so it is reported and checked.
                    self._record_folded_value(node, constant)
                self.graph.erase_node(node)
                return constant
            # only for nodes that stay (a folded constant is erased above)
            node.meta["stack_trace"] = self.stack_trace()
        if proxy_factory_fn is not None:
            return proxy_factory_fn(node)
        return self.proxy(node)

    def shape_of(self, proxy: CustomProxy) -> Any:
        """``x.shape``: ``torch.Size`` when static, else :class:`CustomProxyShape`."""
        node = proxy.node
        cached = self.state.shape_cache.get(node)
        if cached is not None:
            return cached
        items: list[Any] = []
        for i, d in enumerate(proxy.val.shape):
            constant = d if isinstance(d, int) else d.node.maybe_as_int()
            if constant is not None:
                items.append(int(constant))
            else:
                items.append(self.create_proxy("call_method", "size", (proxy, i), {}))
        shape: torch.Size | CustomProxyShape
        if all(isinstance(i, int) for i in items):
            shape = torch.Size(items)
        else:
            shape = CustomProxyShape(items, self)
        self.state.shape_cache[node] = shape
        return shape

    def iter(self, obj: Proxy):
        """Iteration over a proxy: tuples and tensors with a static first dimension.

        torch.fx's own proxies (``Attribute``) land here; iterating over the proxy of
        their node gives them the behaviour of :class:`CustomProxy`.
        """
        return iter(self.proxy(obj.node))


def _known_inputs(node: Node) -> bool:
    """Whether every node the node reads has a value (``meta["val"]``)."""
    return all("val" in n.meta for n in node.all_input_nodes)


def _settle_fake_mode(fake_mode) -> None:
    """Forgets what an interrupted ``with fake_mode`` left in the trace's fake mode, which
    is not active any more when the trace ends (the window restores the thread's
    dispatch modes themselves)."""
    fake_mode.in_kernel_invocation = False
    fake_mode.enter_stack.clear()


def _is_simple_output(spec) -> bool:
    if spec.is_leaf():
        return True
    return spec.type is tuple and all(c.is_leaf() for c in spec.children())


__all__ = ["CONSTANT_PREFIX", "CustomTracer", "graph_fingerprint"]
