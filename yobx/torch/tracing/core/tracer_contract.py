"""What the mixins of the tracer need from it: the contract, checked by mypy.

:class:`~yobx.torch.tracing.CustomTracer` is a ``torch.fx.Tracer`` assembled from
mixins, one concern each (:class:`~.decisions.DecisionsMixin`,
:class:`~.fake_execution.FakeExecutionMixin`, :class:`~.traced_attributes.AttributesMixin`,
:class:`~.graph_finish.GraphFinishMixin`, :class:`~.loop_tracing.LoopsMixin`,
:class:`~.trace_results.TraceResultsMixin`). Each reads what the tracer holds (its
dimensions, refinements, per-trace state) and calls what the others provide (a decision,
the user's location). :class:`TracerContract` lists all of it, with types; for the type
checker only, each mixin derives from :data:`MixinBase`, a ``torch.fx.Tracer`` that
follows the contract, so that every attribute a mixin reads and every method it calls is
declared once, here, and checked against the mixin that defines it (``mypy``, run by
``.ci/run``). At run time the mixins derive from ``object`` and this module costs
nothing.

``dims`` and ``refinements`` are None outside a trace and in a trace without examples
(torch.fx's behaviour); the methods reading them run inside a trace with examples and
narrow them with :meth:`TracerContract.trace_dims` and
:meth:`TracerContract.trace_refinements`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import sympy
    import torch
    from torch.fx.proxy import Proxy

    from ..constraints.constraints import Constraint
    from ..constraints.refinement import Refinements
    from ..constraints.runtime_checks import RuntimeCheck
    from ..errors import TracingError
    from ..shape_rules import ShapeRules
    from ..symbolic.symbolic import Guard, SymbolicDimensions
    from .trace_state import TraceState


class TracerContract(Protocol):
    """The attributes and methods of the tracer its mixins rely on (beyond those of
    ``torch.fx.Tracer``: ``graph``, ``root``, ``tensor_attrs``, ``create_node``...)."""

    #: the per-trace state (:class:`~.trace_state.TraceState`), fresh for each trace
    state: TraceState
    #: the symbolic dimensions of the trace; None without examples
    dims: SymbolicDimensions | None
    #: the decisions adopted as constraints; None without examples
    refinements: Refinements | None
    #: the shape rules deciding output shapes without the example; None without examples
    shape_rules: ShapeRules | None
    #: assumptions the traced graph relies on
    guards: list[Guard]
    #: whether the traced graph checks its constraints when it runs
    runtime_checks: bool
    #: module type -> whether an instance stays a leaf
    module_leaves: dict[type, Any]
    #: ``file:line`` of the ``contiguous()`` and reshape calls whose layout is decided
    #: from the start (see :mod:`.layout_copies`)
    aliased_layouts: set[str]
    #: whether every shape rule is checked against torch's kernel (a test mode)
    _check_shape_rules: bool
    #: with versions: what they still assume beyond their conditions, and the checks
    #: of each (None without versions)
    _version_constraints: list[Constraint] | None
    _version_checks: list[RuntimeCheck] | None

    @property
    def fake_mode(self) -> Any:
        """The FakeTensorMode of the trace (None without examples)."""

    @property
    def shape_env(self) -> Any:
        """The ShapeEnv of the trace (None without examples)."""

    @property
    def constraints(self) -> list[Constraint]:
        """Facts on dynamic dimensions adopted from the example inputs."""

    # core/trace_results.py

    def trace_dims(self) -> SymbolicDimensions:
        """``dims`` inside a trace with examples (an error otherwise)."""

    def trace_refinements(self) -> Refinements:
        """``refinements`` inside a trace with examples (an error otherwise)."""

    # core/tracer.py (``proxy``, ``create_proxy`` and ``create_node`` too, with
    # torch.fx's signatures)

    def shape_of(self, proxy: Any) -> Any:
        """``x.shape``: ``torch.Size`` when static, else a shape proxy."""

    # core/decisions.py

    def location(self) -> str:
        """``file:line`` of the user's code being traced."""

    def stack_trace(self) -> str:
        """Traceback-like text of the user's line."""

    def decide(self, val: torch.SymBool, what: str = "") -> bool:
        """Decides a condition: proved, or adopted from the example as a constraint."""

    def to_int(self, obj: Proxy) -> int:
        """``int(proxy)``: a Python int is needed here."""

    def to_float(self, obj: Proxy) -> float:
        """``float(proxy)``: a Python float is needed here."""

    def repeated_list(self, items: list | tuple, count: Proxy) -> Any:
        """``items * count`` for a symbolic ``count`` (see ``loops.SymbolicRepeat``)."""

    def python_number(self, obj: Proxy, what: str, location: str | None = None) -> int | float:
        """A Python number for a symbolic value: the value becomes a constant."""

    def missing_example_error(self, obj: Proxy, what: str) -> TracingError:
        """The error for a decision on a value computed from inputs given no example."""

    def _rely_on_default_bounds(self, condition: sympy.Basic, value: bool) -> None:
        """A condition torch decided from the default ranges, judged as a decision."""

    # core/layout_copies.py

    def remember_layout_call(self, node: torch.fx.Node, source: Any, value: Any, kind: str) -> None:
        """Records ``value``, what ``node`` made of ``source``, for a later write."""

    def settled_layout(self, node: torch.fx.Node, args: tuple, kwargs: dict, value: Any) -> Any:
        """The value of a ``contiguous()`` or reshape ``node``, remembered or decided."""

    def layout_decided_now(self, node: torch.fx.Node, kind: str, source: Any, value: Any) -> Any:
        """The value of a layout call at a line whose layout is decided on the sizes."""

    def decide_layouts_written(self, node: torch.fx.Node) -> None:
        """A write into a remembered call's value or input decides the call's layout."""

    # core/loop_tracing.py

    def loops_allowed(self) -> bool:
        """Whether a loop over a symbolic size may open a region here."""

    def loop_symbols(self, expr: Any) -> set:
        """The loop-index symbols of ``expr`` (none outside loops)."""

    def loop_refuse(self, symbols: Any, reason: str) -> None:
        """A decision or a guard on the index of a step: its region cannot be a scan."""

    def roll_loops(self, graph: torch.fx.Graph) -> None:
        """Makes each closed region a scan."""

    # core/traced_attributes.py

    def _attribute(self, target: str) -> Any:
        """The value of a ``get_attr`` target (a constant of the trace or an attribute)."""


if TYPE_CHECKING:
    import torch.fx

    class TracerHost(torch.fx.Tracer, TracerContract):
        """The tracer as its mixins and proxies see it, for the type checker: torch.fx's
        tracer (``super()`` reaches it) following :class:`TracerContract`."""

    MixinBase = TracerHost

else:
    #: what a mixin of the tracer derives from: ``object`` at run time
    MixinBase = object
