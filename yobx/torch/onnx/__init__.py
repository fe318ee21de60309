"""Export of torch models to ONNX: :func:`to_onnx` and :func:`validate`; big models
exported without their weights (:func:`empty_weights`), given them afterwards
(:meth:`ExportResult.apply_weights`)."""

from yobx.torch.onnx.errors import OnnxExportError, UnsupportedOperatorError
from yobx.torch.onnx.export import DEFAULT_OPSET, ExportResult, Stage, save_model, to_onnx
from yobx.torch.onnx.validation import ValidationReport, validate
from yobx.torch.onnx.weight_sources import WeightSourceError
from yobx.torch.onnx.weights import (
    AppliedWeights,
    WeightsMismatchError,
    WeightsNotAppliedError,
    empty_weights,
    load_weights_into,
)

__all__ = [
    "DEFAULT_OPSET",
    "AppliedWeights",
    "ExportResult",
    "OnnxExportError",
    "Stage",
    "UnsupportedOperatorError",
    "ValidationReport",
    "WeightSourceError",
    "WeightsMismatchError",
    "WeightsNotAppliedError",
    "empty_weights",
    "load_weights_into",
    "save_model",
    "to_onnx",
    "validate",
]
