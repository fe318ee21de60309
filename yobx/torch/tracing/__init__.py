"""Capture of PyTorch models as torch.fx graphs with sound symbolic shapes.

The package holds one concern per folder:

* ``core/``: the tracer, its mixins and per-trace state, proxies and their dispatch,
  fake execution, control flow and loops, the finish and code of the graph;
* ``symbolic/``: symbolic dimensions, their names and text, proofs and bounds on them;
* ``constraints/``: constraints adopted from the example, versions, runtime checks,
  input layouts, checks on tensor values, the search of sizes that validate a graph;
* ``isolation/``: the patch window and what keeps a trace from changing the world
  (world state, torch.fx's isolation, module classes, deferred Ctrl-C, frames);
* ``robust/``: robust and recursive tracing, the collection of graphs, recorded calls;
* ``shape_rules/``: the output shapes of torch operators, decided without the example;
* here: the errors, the binding of example inputs and the ``dynamic_shapes`` argument.

The torch.fx hooks :class:`CustomTracer` overrides, and where:

* ``trace``, ``create_proxy``, ``create_node``, ``proxy``, ``iter``,
  ``create_args_for_root``: ``core/tracer.py`` (``CustomTracer``);
* ``to_bool``: ``core/decisions.py`` (``DecisionsMixin``);
* ``call_module``, ``is_leaf_module``, ``getattr``, ``create_arg``:
  ``core/traced_attributes.py`` (``AttributesMixin``);
* ``trace``, ``call_module``, ``is_leaf_module`` again in ``robust/robust.py``
  (:class:`RobustTracer`, which runs untraceable submodules as leaves).
"""

from .constraints.constraints import Constraint, ConstraintViolationError
from .core.control_flow import CondCCOp, ScanCCOp
from .core.proxies import (
    CustomAttribute,
    CustomParameterProxy,
    CustomProxy,
    CustomProxyBool,
    CustomProxyFloat,
    CustomProxyInt,
    CustomProxyShape,
)
from .core.tracer import CustomTracer, graph_fingerprint
from .errors import (
    DataDependentError,
    SpecializationError,
    StrictDimensionError,
    TracingError,
)
from .inputs import register_cache_flattening
from .isolation.patches import replace_problematic_function_before_tracing
from .robust.collection import GraphCollection, ModuleEntry, ModuleFailure
from .robust.recorded_calls import RecordedCall, record_calls
from .robust.recursive import recursive_trace
from .robust.robust import RobustTracer
from .symbolic.symbolic import Guard

__all__ = [
    "CondCCOp",
    "Constraint",
    "ConstraintViolationError",
    "CustomAttribute",
    "CustomParameterProxy",
    "CustomProxy",
    "CustomProxyBool",
    "CustomProxyFloat",
    "CustomProxyInt",
    "CustomProxyShape",
    "CustomTracer",
    "DataDependentError",
    "Guard",
    "GraphCollection",
    "ModuleEntry",
    "ModuleFailure",
    "RecordedCall",
    "RobustTracer",
    "ScanCCOp",
    "SpecializationError",
    "StrictDimensionError",
    "TracingError",
    "graph_fingerprint",
    "record_calls",
    "recursive_trace",
    "register_cache_flattening",
    "replace_problematic_function_before_tracing",
]
