"""Adaptive pooling over a dynamic height and width: yobx against torch.onnx, in
onnxruntime against eager, at sizes the example does not have.

Each model is exported from a (2, 3, 6, 4) example with the batch, the height and the
width dynamic (``to_onnx`` with names, ``torch.onnx.export(dynamo=True)`` with
``torch.export.Dim``), then run at other sizes; a line per model and exporter gives the
largest absolute difference with eager at each size, or the first line of the error::

    python _scripts/compare_adaptive_pooling.py
"""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F

EXAMPLE = (2, 3, 6, 4)
SIZES = [(2, 3, 6, 4), (2, 3, 7, 5), (1, 3, 9, 11), (3, 3, 13, 17)]


class AvgPool(torch.nn.Module):
    def forward(self, x):
        return F.adaptive_avg_pool2d(x, (3, 2))


class AvgPoolModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool2d((7, 7))

    def forward(self, x):
        return self.pool(x)


class MaxPool(torch.nn.Module):
    def forward(self, x):
        return F.adaptive_max_pool2d(x, (3, 2))


def export_yobx(model: torch.nn.Module) -> bytes:
    from yobx.torch.onnx import to_onnx

    shapes = {"x": {0: "batch", 2: "height", 3: "width"}}
    return to_onnx(model, (torch.randn(*EXAMPLE),), dynamic_shapes=shapes).model_proto


def export_torch_onnx(model: torch.nn.Module) -> bytes:
    dim = torch.export.Dim
    shapes = {"x": {0: dim("batch"), 2: dim("height", min=2), 3: dim("width", min=2)}}
    return torch.onnx.export(
        model, (torch.randn(*EXAMPLE),), dynamic_shapes=shapes, dynamo=True, verbose=False
    ).model_proto


def differences(model: torch.nn.Module, proto) -> list[str]:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    cells = []
    for size in SIZES:
        x = torch.randn(*size)
        try:
            got = session.run(None, {name: x.numpy()})[0]
        except Exception as exc:
            cells.append(f"error: {str(exc).splitlines()[0][:60]}")
            continue
        with torch.no_grad():
            expected = model(x).numpy()
        cells.append(
            f"{np.abs(got - expected).max():.3g}"
            if got.shape == expected.shape
            else f"shape {got.shape}"
        )
    return cells


def main() -> None:
    warnings.filterwarnings("ignore")
    ort.set_default_logger_severity(4)
    print(f"{'model':14} {'exporter':11} " + "  ".join(f"{s[2:]!s:>10}" for s in SIZES))
    for model in (AvgPool(), AvgPoolModule(), MaxPool()):
        for exporter, export in (("yobx", export_yobx), ("torch.onnx", export_torch_onnx)):
            try:
                cells = differences(model, export(model))
            except Exception as exc:
                cells = [f"export failed: {str(exc).splitlines()[0][:80]}"]
            row = "  ".join(f"{c:>10}" for c in cells)
            print(f"{type(model).__name__:14} {exporter:11} {row}")


if __name__ == "__main__":
    main()
