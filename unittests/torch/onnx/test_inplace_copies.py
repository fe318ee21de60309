"""The write-backs of in-place decompositions (``nn.RMSNorm`` adds its epsilon in
place) become functional in the lowered graph, and only where nothing else sees them."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from yobx.torch.onnx.inplace_copies import functional_copies

from ._helpers import export_and_validate


@pytest.mark.parametrize("affine", [False, True])
def test_rms_norm_exports(affine):
    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.RMSNorm(8, eps=1e-6, elementwise_affine=affine)

        def forward(self, x):
            return self.norm(x) * 2

    export_and_validate(Norm(), (torch.randn(2, 3, 8),), dynamic_shapes=({0: "b", 1: "s"},))


def _copies(graph_module):
    return [n for n in graph_module.graph.nodes if n.target is torch.ops.aten.copy_.default]


def test_only_copies_into_fresh_tensors_nobody_else_sees_are_replaced():
    def fresh(x):
        y = x * 2
        y.copy_(x + 1)
        return y * 3

    def into_input(x):
        x.copy_(x + 1)
        return x * 3

    def through_view(x):
        y = x * 2
        v = y[0]
        y.copy_(x + 1)
        return v * 3

    x = torch.randn(3, 4)
    for function, kept in ((fresh, 0), (into_input, 1), (through_view, 1)):
        graph_module = make_fx(function)(x.clone())
        functional_copies(graph_module)
        assert len(_copies(graph_module)) == kept, function.__name__
        torch.testing.assert_close(graph_module(x.clone()), function(x.clone()))
