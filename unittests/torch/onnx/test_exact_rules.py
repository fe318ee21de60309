"""The optimizer removes ``x + 0`` only for an exact 0: the epsilon of an RMS
normalization (1e-8) stays, and a zero row normalizes to zeros, not NaN."""

import numpy as np
import onnx_ir as ir
import onnxruntime
import torch
from onnx import TensorProto, helper
from onnxscript import rewriter

from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.exact_rules import exact_no_op_rules


def _model(constant: float, op: str = "Add"):
    value = helper.make_tensor("c", TensorProto.FLOAT, [], [constant])
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["c"], value=value),
            helper.make_node(op, ["x", "c"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return ir.serde.deserialize_model(helper.make_model(graph))


def test_only_exact_constants_are_no_ops():
    for constant, op, removed in [
        (0.0, "Add", True),
        (1e-8, "Add", False),
        (0.0, "Sub", True),
        (1.0, "Mul", True),
        (1.0 + 1e-7, "Mul", False),
        (1.0, "Div", True),
    ]:
        model = _model(constant, op)
        rewriter.rewrite(model, pattern_rewrite_rules=exact_no_op_rules())
        assert (op not in [n.op_type for n in model.graph]) == removed, (constant, op)


class TinyEpsilon(torch.nn.Module):
    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + 1e-8)


def test_a_tiny_epsilon_is_kept():
    result = to_onnx(TinyEpsilon(), (torch.randn(2, 3, 8),), dynamic_shapes=({0: "b"},))
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    x = torch.randn(2, 3, 8)
    x[0, 1] = 0  # an embedding's padding row
    (got,) = session.run(None, {"x": x.numpy()})
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, TinyEpsilon()(x).numpy(), atol=1e-5, rtol=1e-5)
