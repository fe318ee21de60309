"""PyTorch side of yobx: capture (tracing), rewrite (passes), ONNX export, inspection.

The names below are loaded on first use, so that ``import yobx.torch.passes`` does not
load the tracer or the exporter.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the subpackage defining it
_LAZY = {
    "to_onnx": "onnx",
    **{
        name: "tracing"
        for name in (
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
        )
    },
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
