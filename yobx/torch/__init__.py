"""PyTorch side of yobx: capture (tracing), rewrite (passes), ONNX export, inspection."""

from .onnx import to_onnx
from .tracing import (
    CondCCOp,
    CustomAttribute,
    CustomParameterProxy,
    CustomProxy,
    CustomProxyBool,
    CustomProxyFloat,
    CustomProxyInt,
    CustomProxyShape,
    CustomTracer,
    GraphCollection,
    RobustTracer,
    ScanCCOp,
    recursive_trace,
    replace_problematic_function_before_tracing,
)

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
    "GraphCollection",
    "RobustTracer",
    "ScanCCOp",
    "recursive_trace",
    "replace_problematic_function_before_tracing",
    "to_onnx",
]
