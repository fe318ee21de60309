"""Custom operators used by both capture (tracing) and export (onnx), defined the first
time they are needed (see :mod:`yobx.torch.ops._lazy`)."""

from typing import Any

from . import rnn
from .rnn import leaf_module_call


def __getattr__(name: str) -> Any:
    # `ops.lstm` and `ops.gru`, defined when first read
    if name in ("lstm", "gru"):
        return getattr(rnn, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# `lstm` and `gru` are read through __getattr__ (defined when first read)
__all__ = ["leaf_module_call", "rnn"]
