"""Custom operators used by both capture (tracing) and export (onnx)."""

from .rnn import gru, leaf_module_call, lstm

__all__ = ["gru", "leaf_module_call", "lstm"]
