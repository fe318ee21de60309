"""A restride that keeps every value in place (``as_strided_`` after a decomposition
restores a memory format) is removed from the lowered graph: ONNX has no strides and
torch_lib no translation for it (Swin's pooler)."""

import torch

from unittests.torch.onnx._helpers import export_and_validate
from yobx.torch.onnx.restrides import drop_restrides


class Pooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool1d(1)

    def forward(self, x):
        return self.pool(x.transpose(1, 2)).flatten(1)


def test_pooler_of_a_transposed_input_exports():
    x = torch.randn(2, 7, 4)
    export_and_validate(Pooled(), (x,), dynamic_shapes={"x": {0: "batch", 1: "seq"}})


def test_a_restride_moving_values_stays():
    def restride(x):
        return torch.as_strided(x, (2, 2), (1, 2))

    gm = torch.fx.experimental.proxy_tensor.make_fx(restride)(torch.randn(2, 2))
    assert drop_restrides(gm) == 0
    x = torch.arange(4.0).reshape(2, 2)
    torch.testing.assert_close(gm(x), restride(x))
