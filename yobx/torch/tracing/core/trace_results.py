"""What a trace leaves on the tracer: its dimensions, constraints and checks.

:class:`TraceResultsMixin` gives :class:`~yobx.torch.tracing.CustomTracer` its public
state after a trace (``constraints``, ``checks``, ``range_constraints``,
``dimension_names``, ``fake_mode``, ``shape_env``), and the narrowing the other mixins use
inside a trace with examples (:meth:`~TraceResultsMixin.trace_dims`,
:meth:`~TraceResultsMixin.trace_refinements`).
"""

from __future__ import annotations

from ..constraints.constraints import Constraint
from ..constraints.refinement import Refinements
from ..constraints.runtime_checks import RuntimeCheck, graph_checks
from ..errors import TracingError
from ..symbolic.symbolic import SymbolicDimensions
from .tracer_contract import MixinBase


class TraceResultsMixin(MixinBase):
    """Mixed into :class:`~yobx.torch.tracing.CustomTracer`, which sets ``dims``,
    ``refinements`` and, with versions, ``_version_constraints`` and
    ``_version_checks`` (see :class:`~.tracer_contract.TracerContract`)."""

    @property
    def fake_mode(self):
        """The FakeTensorMode of the last trace."""
        return None if self.dims is None else self.dims.fake_mode

    @property
    def shape_env(self):
        """The ShapeEnv of the last trace."""
        return None if self.dims is None else self.dims.shape_env

    def trace_dims(self) -> SymbolicDimensions:
        """The dimensions of the trace in progress, which has examples: the tracer's
        symbolic machinery runs only then (without examples it works like torch.fx)."""
        if self.dims is None:
            raise TracingError.at(
                self.location(),
                "this step of the trace needs the example inputs' symbolic dimensions, "
                "and the trace has no example inputs: pass examples to trace(...) "
                "(concrete_args), or report the model to yobx",
            )
        return self.dims

    def trace_refinements(self) -> Refinements:
        """The refinements of the trace in progress, which has examples (see
        :meth:`trace_dims`)."""
        if self.refinements is None:
            self.trace_dims()  # the same error
            raise AssertionError("a trace with dimensions has refinements")
        return self.refinements

    @property
    def constraints(self) -> list[Constraint]:
        """Facts on dynamic dimensions adopted from the example inputs (last trace);
        with versions, what the versions still assume beyond their conditions."""
        if self._version_constraints is not None:
            return list(self._version_constraints)
        return [] if self.refinements is None else self.refinements.constraints

    @property
    def checks(self) -> list[RuntimeCheck]:
        """Every condition the last trace assumes of its inputs' sizes, in the order
        its runtime checks (and an exported model's) verify them: declared ranges,
        ``torch._check`` calls, adopted constraints; with versions, each version's
        constraints checked when its conditions select it."""
        if self._version_checks is not None:
            return list(self._version_checks)
        if self.dims is None or self.refinements is None:
            return []
        return graph_checks(self.dims, self.refinements)

    def set_version_assumptions(
        self, constraints: list[Constraint], checks: list[RuntimeCheck]
    ) -> None:
        """Replaces what the last trace, which chose between versions, assumes of its
        inputs (``constraints``, ``checks``): an export adds what the lowering of the
        versions' graphs decided (see :mod:`yobx.torch.onnx.version_guards`)."""
        if self._version_checks is None:
            raise ValueError("the last trace did not choose between versions")
        self._version_constraints: list[Constraint] | None = list(constraints)
        self._version_checks: list[RuntimeCheck] | None = list(checks)

    @property
    def range_constraints(self) -> dict[str, tuple[int | float, int | float]]:
        """The range of every named dimension, ``math.inf`` when unbounded (last trace)."""
        if self.dims is None:
            return {}
        return {
            name: self.dims.range_of(symint.node.expr) for name, symint in self.dims.by_name.items()
        }

    @property
    def dimension_names(self) -> dict[str, str]:
        """Maps ShapeEnv symbol names (``s26``) to the user's names (``batch``)."""
        return {} if self.dims is None else dict(self.dims.names)
