"""Export of torch models to ONNX: :func:`to_onnx` and :func:`validate`."""

from yobx.torch.onnx.errors import OnnxExportError, UnsupportedOperatorError
from yobx.torch.onnx.export import DEFAULT_OPSET, ExportResult, Stage, save_model, to_onnx
from yobx.torch.onnx.validation import ValidationReport, validate

__all__ = [
    "DEFAULT_OPSET",
    "ExportResult",
    "OnnxExportError",
    "Stage",
    "UnsupportedOperatorError",
    "ValidationReport",
    "save_model",
    "to_onnx",
    "validate",
]
