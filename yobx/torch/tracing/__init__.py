"""Capture of PyTorch models as torch.fx graphs with sound symbolic shapes."""

from .control_flow import CondCCOp, ScanCCOp
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
from .symbolic import Guard
from .tracer import CustomTracer

__all__ = [
    "CondCCOp",
    "CustomAttribute",
    "CustomParameterProxy",
    "CustomProxy",
    "CustomProxyBool",
    "CustomProxyFloat",
    "CustomProxyInt",
    "CustomProxyShape",
    "CustomTracer",
    "Guard",
    "ScanCCOp",
    "register_cache_flattening",
    "replace_problematic_function_before_tracing",
]
