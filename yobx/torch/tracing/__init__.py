"""Capture of PyTorch models as torch.fx graphs with sound symbolic shapes."""

from .collection import GraphCollection, ModuleEntry, ModuleFailure
from .constraints import Constraint, ConstraintViolationError
from .control_flow import CondCCOp, ScanCCOp
from .errors import (
    DataDependentError,
    SpecializationError,
    StrictDimensionError,
    TracingError,
)
from .inputs import register_cache_flattening
from .patches import replace_problematic_function_before_tracing
from .proxies import (
    CustomAttribute,
    CustomParameterProxy,
    CustomProxy,
    CustomProxyBool,
    CustomProxyFloat,
    CustomProxyInt,
    CustomProxyShape,
)
from .recorded_calls import RecordedCall, record_calls
from .recursive import recursive_trace
from .robust import RobustTracer
from .symbolic import Guard
from .tracer import CustomTracer, graph_fingerprint

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
