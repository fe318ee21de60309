"""Custom operators used by both capture (tracing) and export (onnx), defined the first
time they are needed (see :mod:`yobx.torch.ops._lazy`)."""

from . import rnn
from .rnn import leaf_module_call

#: `ops.lstm` and `ops.gru`, defined when first read
__getattr__ = rnn.operators.module_getattr(__name__)


# `lstm` and `gru` are read through __getattr__ (defined when first read)
__all__ = ["leaf_module_call", "rnn"]
