"""remove_batch_dim_nodes on graphs torch.export produces for models calling torch.vmap."""

from __future__ import annotations

import pytest
import torch

from unittests.comparison import CLOSE, assert_same
from yobx.torch.passes import remove_batch_dim_nodes
from yobx.torch.passes.remove_batch_dim import _functorch_name


def _per_example_reduction(a, b):
    # a is one example of shape (3, 4): reductions over its own axes
    return a.sum(0) + a.max() * b


class InDims1OutDims1(torch.nn.Module):
    def forward(self, x, y):
        return torch.vmap(_per_example_reduction, in_dims=(1, None), out_dims=1)(x, y)


class InDims0(torch.nn.Module):
    def forward(self, x, y):
        return torch.vmap(lambda a, b: (a @ b.T).softmax(-1), in_dims=(0, 0))(x, y)


class MixedInDims(torch.nn.Module):
    def forward(self, x, y, z):
        def f(a, b, c):
            return (a.unsqueeze(-1) * b).mean(0) - c.view(-1)[:2].sum()

        return torch.vmap(f, in_dims=(0, 1, None))(x, y, z)


class Nested(torch.nn.Module):
    def forward(self, x):
        return torch.vmap(torch.vmap(lambda a: a.sum() * a - a.max(), in_dims=0), in_dims=1)(x)


class TwoOutputs(torch.nn.Module):
    def forward(self, x):
        def f(a):
            return a.norm(dim=-1), a.t().reshape(-1)

        out, flat = torch.vmap(f, in_dims=2, out_dims=(0, 1))(x)
        return out + 1, flat


A = torch.export.Dim("a", min=2, max=32)
B = torch.export.Dim("b", min=2, max=32)
CASES = {
    "in1_out1": (
        InDims1OutDims1(),
        (torch.randn(3, 5, 4), torch.randn(4)),
        ({0: A, 1: B}, None),
        [(torch.randn(6, 7, 4), torch.randn(4))],
    ),
    "in0": (
        InDims0(),
        (torch.randn(5, 3, 4), torch.randn(5, 2, 4)),
        ({0: A}, {0: A}),
        [(torch.randn(8, 3, 4), torch.randn(8, 2, 4))],
    ),
    "mixed": (
        MixedInDims(),
        (torch.randn(5, 3), torch.randn(3, 5, 4), torch.randn(2, 2)),
        ({0: A}, {1: A}, None),
        [(torch.randn(9, 3), torch.randn(3, 9, 4), torch.randn(2, 2))],
    ),
    "nested": (
        Nested(),
        (torch.randn(3, 5, 4),),
        ({0: A, 1: B},),
        [(torch.randn(4, 2, 4),)],
    ),
    "two_outputs": (
        TwoOutputs(),
        (torch.randn(3, 4, 5),),
        ({2: A},),
        [(torch.randn(3, 4, 9),)],
    ),
}


def _functorch_nodes(graph):
    return [n for n in graph.nodes if _functorch_name(n) is not None]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("strict", [True, False])
def test_vmap_regions_rewritten(case, strict):
    model, args, dynamic_shapes, others = CASES[case]
    if strict:
        ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=True)
        examples = [args, *others]
    else:
        # non-strict export cannot keep vmap dimensions dynamic (lifted fake constant)
        try:
            ep = torch.export.export(model, args, strict=False)
        except RuntimeError as e:
            pytest.skip(f"torch.export(strict=False) cannot capture this vmap: {e}")
        examples = [args]
    graph = ep.graph_module.graph
    assert _functorch_nodes(graph), graph
    removed = remove_batch_dim_nodes(graph)
    assert removed > 0
    assert not _functorch_nodes(graph), graph
    graph.lint()
    module = ep.module()
    for example in examples:
        # batched kernels may sum in another order than the per-example ones
        assert_same(model(*example), module(*example), **CLOSE)


def test_moving_dims_alone_would_be_wrong():
    """The region reduces over per-example axes: the batched graph must not be a movedim."""
    model, args, dynamic_shapes, _ = CASES["in1_out1"]
    ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=True)
    remove_batch_dim_nodes(ep.graph_module.graph)
    reductions = [
        n
        for n in ep.graph_module.graph.nodes
        if n.target in (torch.ops.aten.sum.dim_IntList, torch.ops.aten.max.dim)
    ]
    # sum(0) of an example is a sum over dim 1 of the batch, max() becomes a max per row
    assert any(n.args[1] != [0] for n in reductions if n.target == torch.ops.aten.sum.dim_IntList)
    assert any(n.target == torch.ops.aten.max.dim for n in reductions)


def test_graph_without_vmap_is_unchanged():
    ep = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(2, 3),))
    before = [n.name for n in ep.graph.nodes]
    assert remove_batch_dim_nodes(ep.graph_module.graph) == 0
    assert before == [n.name for n in ep.graph.nodes]


def test_torch_level_graph_from_dynamo():
    from torch.export._trace import _export_to_torch_ir

    model, args, dynamic_shapes, others = CASES["in1_out1"]
    gm = _export_to_torch_ir(model, args, dynamic_shapes=dynamic_shapes)
    assert _functorch_nodes(gm.graph)
    assert remove_batch_dim_nodes(gm.graph) > 0
    assert not _functorch_nodes(gm.graph)
    for example in (args, *others):
        flat = gm(*example)
        flat = flat[0] if isinstance(flat, (tuple, list)) else flat
        assert_same(model(*example), flat, **CLOSE)
