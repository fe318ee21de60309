"""Recorded lowering: the nodes the direct lowering does not write are recorded outside
make_fx, with the same aten calls as make_fx's lowering and the same ONNX outputs;
the forms it cannot stand for go through make_fx."""

from __future__ import annotations

import torch

from unittests.torch.onnx._helpers import aten_operators, both_lowerings, export_and_validate
from yobx.torch.onnx import to_onnx

aten = torch.ops.aten


def _targets(lowered) -> set:
    return {node.target for node in lowered.graph_module.graph.nodes}


class MaskAndRepeat(torch.nn.Module):
    """The nodes of a decoder's mask and ``repeat_kv`` that make_fx used to lower: a
    reshape that copies, indexing with several items, ``arange`` of a size, casts,
    ``&``, ``new_ones``, a ``flatten`` whose size the decomposition computes."""

    def forward(self, x, mask):
        b, h, s, d = x.shape
        repeated = x[:, :, None, :, :].expand(b, h, 2, s, d).reshape(b, h * 2, s, d)
        positions = torch.arange(mask.shape[1])
        allowed = positions[None, None, :, None] <= positions[None, None, None, :]
        allowed = allowed & mask.to(torch.bool)[:, None, None, :]
        ones = mask.new_ones((b, 1)).float()
        flat = repeated.transpose(1, 2).flatten(2)
        return repeated.sum(-1), allowed, ones, flat, x[:, 1:, ::2, None].float()


class Fallbacks(torch.nn.Module):
    """Forms make_fx still lowers: outputs that are not one tensor (``split``,
    ``max`` along a dimension), a size known at run time (``nonzero``)."""

    def forward(self, x):
        first, second = x.split([1, 2], dim=1)
        values, indices = x.max(dim=-1)
        found = torch.nonzero(x > 0)
        return first * 2, second + 1, values, indices, found


def _inputs():
    x = torch.randn(2, 3, 5, 4)
    mask = torch.ones(2, 5, dtype=torch.int64)
    mask[0, :2] = 0
    dynamic_shapes = ({0: "batch", 2: "seq"}, {0: "batch", 1: "seq"})
    return (x, mask), dynamic_shapes


def test_recorded_nodes_give_make_fx_graph_and_eager_outputs():
    args, dynamic_shapes = _inputs()
    lowered = both_lowerings(MaskAndRepeat(), args, {}, dynamic_shapes)
    # reshape, the two multi-item indexings, arange, the casts, new_ones, &, flatten
    assert lowered[True].n_recorded >= 8
    assert lowered[False].n_recorded == 0
    assert aten_operators(lowered[True]) == aten_operators(lowered[False])
    # the copy make_fx writes for the reshape of an expanded tensor
    assert {aten.clone.default, aten._unsafe_view.default} <= _targets(lowered[True])
    # a factory's output is not detached (make_fx holds its tensors weakly)
    assert aten.detach.default not in _targets(lowered[True])
    # the flatten's size is read from sizes, never from a stride equal to it
    assert aten.sym_stride.int not in _targets(lowered[True])
    for direct in (True, False):
        export_and_validate(
            MaskAndRepeat(), args, dynamic_shapes=dynamic_shapes, direct_lowering=direct
        )


def test_forms_it_cannot_record_go_through_make_fx():
    x = torch.randn(2, 3, 4)
    dynamic_shapes = ({0: "batch", 2: "width"},)
    lowered = both_lowerings(Fallbacks(), (x,), {}, dynamic_shapes)
    assert lowered[True].n_recorded == 0
    assert aten_operators(lowered[True]) == aten_operators(lowered[False])
    export_and_validate(Fallbacks(), (x,), dynamic_shapes=dynamic_shapes, min_cases=2)


class TwoVersions(torch.nn.Module):
    """A decision on a dynamic size: two versions, each lowered alone."""

    def forward(self, x):
        y = x[:, None, :, None].float()
        if x.shape[1] == 1:
            return y * 2
        return y.reshape(x.shape[0], 1, -1, 1) + 1


def test_lower_stage_counts_the_versions_nodes():
    x = torch.randn(2, 3)
    result = to_onnx(TwoVersions(), (x,), dynamic_shapes=({0: "batch", 1: "seq"},))
    assert len(result.versions) == 2
    lower = next(stage for stage in result.stages if stage.name == "lower")
    # each version's indexing is recorded, its multiplication or addition direct
    assert lower.args["recorded"] >= 2
    assert lower.args["direct"] >= 2
    export_and_validate(TwoVersions(), (x,), dynamic_shapes=({0: "batch", 1: "seq"},))
