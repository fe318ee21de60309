"""Capture of PyTorch models as torch.fx graphs with sound symbolic shapes.

The package holds one concern per folder, listed from the top of the imports down (a
module imports its own room and those below it; ``unittests/test_package_imports.py``
checks it):

* ``robust/``: robust and recursive tracing, the collection of graphs, recorded calls;
* ``core/``: the tracer, its mixins and per-trace state, proxies and their dispatch,
  the functions replaced so that they take proxies (``proxy_patches.py``: factories,
  ``torch.cat``, ``torch.cond``, ``isinstance``, builtins of sizes), fake execution,
  control flow and loops, the finish and code of the graph;
* ``constraints/``: constraints adopted from the example, versions, runtime checks,
  input layouts, checks on tensor values, the search of sizes that validate a graph;
  beside them, ``inputs.py``: the binding of example inputs;
* ``symbolic/``: symbolic dimensions, their names and text, proofs and bounds on them,
  and the symbolic variants of torch kernels that fix a size;
* ``shape_rules/``: the output shapes of torch operators, decided without the example;
* ``isolation/``: the patch window and the patching helper (``patching.py``, which the
  ONNX lowering uses too), and what keeps a trace from changing the world (world state,
  the user's modules restored, torch.fx's isolation, module classes, deferred Ctrl-C,
  frames);
* at the bottom: the errors, the ``dynamic_shapes`` argument, the graph operators of
  ``torch.cond`` and ``scan``, the node arguments stored as they are.

The torch.fx hooks :class:`CustomTracer` overrides, and where:

* ``trace``, ``create_proxy``, ``create_node``, ``proxy``, ``iter``,
  ``create_args_for_root``: ``core/tracer.py`` (``CustomTracer``);
* ``to_bool``: ``core/decisions.py`` (``DecisionsMixin``);
* ``call_module``, ``is_leaf_module``, ``getattr``, ``create_arg``:
  ``core/traced_attributes.py`` (``AttributesMixin``);
* ``trace``, ``call_module``, ``is_leaf_module`` again in ``robust/robust.py``
  (:class:`RobustTracer`, which runs untraceable submodules as leaves).

What the mixins read from the tracer and call on each other is declared once, with
types, in ``core/tracer_contract.py`` (:class:`~.core.tracer_contract.TracerContract`),
which mypy checks (``.ci/run``).
"""

from .constraints.constraints import Constraint, ConstraintViolationError
from .core.proxies import (
    CustomAttribute,
    CustomParameterProxy,
    CustomProxy,
    CustomProxyBool,
    CustomProxyFloat,
    CustomProxyInt,
    CustomProxyShape,
)
from .core.proxy_patches import replace_problematic_function_before_tracing
from .core.tracer import CustomTracer, graph_fingerprint
from .errors import (
    DataDependentError,
    SpecializationError,
    StrictDimensionError,
    TracingError,
)
from .graph_operators import CondCCOp, ScanCCOp
from .inputs import register_cache_flattening
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
