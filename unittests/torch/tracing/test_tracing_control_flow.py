"""Behaviour 6: torch.cond, scan, torch.vmap and torch.cat of mixed lists."""

import pytest
import torch

from yobx.torch.tracing import CondCCOp, ScanCCOp

from ._helpers import check_trace, trace_module

DYN = {"x": {0: "batch"}}


class Cond(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        def true_fn(x):
            return self.lin(x).sin()

        def false_fn(x):
            return x.cos() * 2

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))


def test_cond_traces_both_branches():
    x = torch.ones(3, 4)
    _, graph, gm = check_trace(
        Cond(),
        {"x": x},
        DYN,
        other_inputs=[{"x": -torch.ones(5, 4)}, {"x": torch.randn(6, 4)}],
    )
    conds = [n for n in graph.nodes if isinstance(n.target, CondCCOp)]
    assert len(conds) == 1
    true_gm = getattr(gm, conds[0].args[1].target)
    assert any(n.op == "call_module" for n in true_gm.graph.nodes)


class CondClosure(torch.nn.Module):
    def forward(self, x, y):
        z = y * 3
        return torch.cond(x.shape[0] > 4, lambda a: a + z.sum(), lambda a: a - 1, (x,))


def test_cond_on_shape_predicate_with_closure():
    check_trace(
        CondClosure(),
        {"x": torch.randn(3, 4), "y": torch.randn(2)},
        DYN,
        other_inputs=[{"x": torch.randn(7, 4), "y": torch.randn(2)}],
    )


class Scan(torch.nn.Module):
    def forward(self, x, w):
        def body(carry, row, weight):
            nxt = carry + row * weight
            return nxt, nxt.sum().reshape(1)

        final, ys = torch.ops.higher_order.scan(body, [torch.zeros_like(x[0])], [x], [w])
        return final, ys


def test_scan():
    _, graph, _ = check_trace(
        Scan(),
        {"x": torch.randn(5, 3), "w": torch.randn(3)},
        {"x": {0: "steps"}, "w": None},
        other_inputs=[{"x": torch.randn(9, 3), "w": torch.randn(3)}],
    )
    assert any(isinstance(n.target, ScanCCOp) for n in graph.nodes)


class Vmap(torch.nn.Module):
    def __init__(self, in_dims, out_dims):
        super().__init__()
        self.in_dims, self.out_dims = in_dims, out_dims
        self.scale = torch.nn.Parameter(torch.randn(4))

    def forward(self, x, y):
        def per_example(a, b):
            # reductions over a per-example axis do not commute with batching
            return a.sum(0) * b + a.max() + self.scale

        return torch.vmap(per_example, in_dims=self.in_dims, out_dims=self.out_dims)(x, y)


def _vmap_inputs(batch, seq):
    return {"x": torch.randn(seq, batch, 4), "y": torch.randn(4)}


def test_vmap_in_dims_1_and_none():
    model = Vmap((1, None), 0)
    _, graph, _ = check_trace(
        model,
        _vmap_inputs(3, 5),
        {"x": {0: "seq", 1: "batch"}, "y": None},
        other_inputs=[_vmap_inputs(6, 2), _vmap_inputs(2, 7)],
    )
    targets = {str(n.target) for n in graph.nodes}
    assert not any("vmap" in t or "batch_dim" in t for t in targets), targets


@pytest.mark.parametrize(
    ("in_dims", "out_dims", "message"),
    [
        ((1, None, 0), 0, r"vmap in_dims=\(1, None, 0\) must be an int, None, or have one entry"),
        ((1, None), (0, 1), r"vmap out_dims=\(0, 1\) does not match the outputs"),
    ],
)
def test_vmap_dims_that_do_not_fit_name_the_user_s_line(in_dims, out_dims, message):
    from yobx.torch.tracing import TracingError

    with pytest.raises(TracingError, match=message) as info:
        trace_module(Vmap(in_dims, out_dims), _vmap_inputs(3, 5), {"x": {0: "seq", 1: "batch"}})
    assert info.value.location.startswith(__file__.rsplit(".", 1)[0]), info.value.location


def test_vmap_out_dims_1():
    check_trace(
        Vmap((1, None), 1),
        _vmap_inputs(3, 5),
        {"x": {0: "seq", 1: "batch"}, "y": None},
        other_inputs=[_vmap_inputs(6, 2)],
    )


class NestedVmap(torch.nn.Module):
    def forward(self, x):
        def inner(row):
            return row - row.mean()

        def outer(mat):
            return torch.vmap(inner)(mat).sum(0)

        return torch.vmap(outer, in_dims=0)(x)


def test_nested_vmap():
    check_trace(
        NestedVmap(),
        {"x": torch.randn(3, 5, 4)},
        {"x": {0: "batch", 1: "seq"}},
        other_inputs=[{"x": torch.randn(2, 7, 4)}],
    )


class NestedVmapClosingOverTheModel(torch.nn.Module):
    """A mask built by a vmap in a vmap whose function reads a tensor the model
    computed (transformers' masks close over the padding mask so)."""

    def forward(self, x):
        positive = x.sum() > 0

        def inner(q, kv):
            return (kv <= q) & positive

        mask = torch.vmap(torch.vmap(inner, in_dims=(None, 0)), in_dims=(0, None))
        n = x.shape[0]
        return torch.where(mask(torch.arange(n), torch.arange(n)), x[:, None], 0.0)


def test_nested_vmap_reads_a_value_of_the_model():
    check_trace(
        NestedVmapClosingOverTheModel(),
        {"x": torch.ones(5)},
        {"x": {0: "seq"}},
        other_inputs=[{"x": torch.ones(7)}, {"x": -torch.ones(3)}],
    )


class MixedCat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("pad", torch.ones(1, 4))

    def forward(self, x):
        constant = torch.zeros(2, 4)
        return torch.cat([x, constant, self.pad, x * 2], dim=0), torch.stack([x, x + 1])


def test_cat_of_proxies_and_tensors():
    check_trace(MixedCat(), {"x": torch.randn(3, 4)}, DYN, other_inputs=[{"x": torch.randn(5, 4)}])
