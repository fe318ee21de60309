"""PyTorch side of yobx: capture (tracing), rewrite (passes), ONNX export, inspection.

``yobx.torch`` offers the public names of :mod:`yobx.torch.tracing` and
:func:`~yobx.torch.onnx.to_onnx`. They are loaded on first use, so that
``import yobx.torch.passes`` loads neither the tracer nor the exporter.
"""

from __future__ import annotations

import importlib
from typing import Any


def _exported() -> dict[str, Any]:
    tracing = importlib.import_module(f"{__name__}.tracing")
    onnx = importlib.import_module(f"{__name__}.onnx")
    names = {name: getattr(tracing, name) for name in tracing.__all__}
    names["to_onnx"] = onnx.to_onnx
    return names


def __getattr__(name: str) -> Any:
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    names = _exported()
    if name == "__all__":
        return sorted(names)
    if name not in names:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = names[name]
    return names[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_exported()))
