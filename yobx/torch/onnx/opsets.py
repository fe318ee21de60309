"""The ONNX opsets :func:`~yobx.torch.onnx.to_onnx` writes, and the conversion to them."""

from __future__ import annotations

from typing import Any

import onnx
import onnx_ir as ir

from yobx.torch.onnx.errors import OnnxExportError

#: Default ONNX opset: the one torch_lib is written for.
DEFAULT_OPSET = 18


def supported_opsets() -> range:
    """The ONNX opsets :func:`to_onnx` writes: torch_lib translates to opset 18 and
    onnxscript's version converter converts from there, up to the newest opset it (and
    the installed onnx) knows; torch_lib's functions use opset 18 operators, so older
    opsets would need operators rewritten backwards, which nothing does reliably."""
    from onnxscript.version_converter import _version_converter

    newest = min(_version_converter.SUPPORTED_MAX_ONNX_OPSET, onnx.defs.onnx_opset_version())
    return range(DEFAULT_OPSET, newest + 1)


def check_opset(opset: Any) -> int:
    """Returns ``opset`` (:data:`DEFAULT_OPSET` for None) or raises a ``ValueError``
    naming the supported range."""
    if opset is None:
        return DEFAULT_OPSET
    supported = supported_opsets()
    if isinstance(opset, bool) or not isinstance(opset, int) or opset not in supported:
        raise ValueError(
            f"opset {opset!r} is not supported: to_onnx writes ONNX opsets "
            f"{supported.start} to {supported.stop - 1} (torch_lib translates to opset "
            f"{DEFAULT_OPSET}, onnxscript's version converter goes up to "
            f"{supported.stop - 1})"
        )
    return opset


def convert_opset(model: ir.Model, opset: int) -> None:
    """Converts ``model`` (opset 18) to ``opset`` or raises: never a model of another
    opset than the one asked for."""
    import onnxscript.version_converter

    try:
        onnxscript.version_converter.convert_version(model, opset, fallback=False)
    except Exception as exc:
        raise OnnxExportError(
            f"cannot convert the model to opset {opset}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    imported = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if imported != opset:
        raise OnnxExportError(f"the model imports opset {imported} instead of {opset}")
