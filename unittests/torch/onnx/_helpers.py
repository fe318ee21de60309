"""Helpers of the ONNX export tests."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import torch

from yobx.torch.onnx import to_onnx


def onnx_dims(model_proto: onnx.ModelProto) -> dict[str, list]:
    """Returns ``name -> [dim_param or dim_value]`` for inputs and outputs."""
    result = {}
    for value in [*model_proto.graph.input, *model_proto.graph.output]:
        dims = value.type.tensor_type.shape.dim
        result[value.name] = [d.dim_param or d.dim_value for d in dims]
    return result


def run_ir_model(model: ir.Model, feeds: dict) -> list[np.ndarray]:
    """The outputs onnxruntime computes for ``model`` (an onnx_ir model) on ``feeds``."""
    import onnxruntime

    proto = ir.serde.serialize_model(model)
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def export_and_validate(model, args=(), kwargs=None, dynamic_shapes=None, min_cases=3, **kw):
    """Exports with validation and checks onnxruntime matches eager on the example
    and on other sizes of every dynamic dimension."""
    result = to_onnx(model, args, kwargs, dynamic_shapes=dynamic_shapes, validate=True, **kw)
    report = result.validation
    assert report.ok, report.format()
    assert report.n_checked >= min_cases, report.format()
    assert report.max_abs_error <= 1e-4, report.format()
    return result


class NestedVersions(torch.nn.Module):
    """Versions nested in versions that read different weights: ``a`` for one row and
    ``b`` for several, then ``c`` for one column only, followed by a ``relu`` for
    several rows. The weight of ``c`` is read two ``If`` deep once the branches are
    merged (what each side computes with it differs)."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.a = torch.nn.Linear(width, width)
        self.b = torch.nn.Linear(width, width)
        self.c = torch.nn.Linear(width, width, bias=False)

    def forward(self, x):
        y = self.a(x) if x.shape[0] == 1 else self.b(x)
        if x.shape[1] == 1:
            y = self.c(y) if x.shape[0] == 1 else self.c(y).relu()
        return y


def aten_operators(lowered) -> collections.Counter:
    """The aten operators of a lowered graph, size bookkeeping and no-ops aside (an eval
    dropout is a clone for make_fx, a cast to the same dtype a type_as, nothing when
    written directly; a clone also appears where make_fx gave a value other strides
    than the capture): what the direct and recorded lowerings must write as make_fx
    does."""
    return collections.Counter(
        str(node.target)
        for node in lowered.graph_module.graph.nodes
        if isinstance(node.target, torch._ops.OpOverload)
        and node.target.overloadpacket.__name__
        not in ("sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "clone", "type_as")
    )


def both_lowerings(model, args, kwargs, dynamic_shapes) -> dict:
    """``{True: lowered with the direct and recorded paths, False: through make_fx}``
    of one capture each.

    One capture, not versions: the lowering of a torch.cond between versions whose
    branches call the model's modules is limited (to_onnx then exports one capture
    too)."""
    from yobx.torch.onnx import capture as capture_module
    from yobx.torch.onnx.lowering import lower_to_aten

    lowered = {}
    for direct in (True, False):
        captured = capture_module.capture(
            model, args, kwargs, dynamic_shapes, None, narrowing="constraints"
        )
        lowered[direct] = lower_to_aten(captured.graph_module, direct=direct)
    return lowered
