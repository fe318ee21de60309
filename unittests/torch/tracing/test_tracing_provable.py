"""Programs eager runs at every size trace with dynamic dimensions, nothing specialized.

Each case once refused with a requirement that holds for every allowed size (a chunk
count, an index inside its dimension, ``Min(4, d) <= d``...) or that torch's kernels
read from the example (``take_along_dim``, ``F.pad``, ``F.interpolate``). Each is traced
with string dimension names, checked against eager at the example and at other sizes
(odd ones and the smallest the operation allows), and exported to ONNX.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from yobx.torch.tracing.symbolic.symbolic import SymbolicDimensions

from ._helpers import check_trace


def _chunk(x):
    a, b = x.chunk(2, 1)
    return a * 2, b + 1


def _last_column(x):
    return x[:, x.shape[1] - 1]


def _assign_last_column(x):
    y = x.clone()
    y[:, y.shape[1] - 1] = 0
    y[y.shape[0] - 2, :, 1] = torch.arange(y.shape[1], dtype=y.dtype)
    return y


def _take_along_dim(v):
    return torch.take_along_dim(v, v.argsort(-1), -1)


def _take_along_dim_method(v):
    # indices broadcast along the batch: gather sees expanded indices
    order = v[:1].argsort(-1)
    return v.take_along_dim(order, dim=1)


def _narrow_min(x):
    return x.narrow(1, 0, min(x.shape[1], 4))


def _narrow_half(x):
    h = x.shape[0] // 2
    return x.narrow(0, h, h)


def _strided_flatten(x):
    return x[:, ::2].flatten(0, 1)


def _strided_flatten_function(x):
    return torch.flatten(x[:, ::2], 0, 1) + torch.reshape(x[:, 1::2], (-1,)).sum()


def _interpolate_scale(x):
    return F.interpolate(x, scale_factor=2)


def _interpolate_size(x):
    return F.interpolate(x, size=(2 * x.shape[2], 2 * x.shape[3]))


def _interpolate_bilinear(x):
    return F.interpolate(x, size=(x.shape[2] + 3, 2 * x.shape[3]), mode="bilinear")


def _pad_to_multiple(x):
    return F.pad(x, (0, (4 - x.shape[3] % 4) % 4))


def _pad_both(x):
    h, w = x.shape[2:]
    return F.pad(x, (w % 2, 1, 0, (8 - h % 8) % 8), value=-1.0)


def _interpolate_modes(x):
    exact = F.interpolate(x, scale_factor=1.5, mode="nearest-exact")
    cubic = F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=True)
    half = (x.shape[2] // 2, x.shape[3] // 2)
    smooth = F.interpolate(x, size=half, antialias=True, mode="bilinear")
    return exact, cubic, smooth


def _pad_crop_replicate(x):
    cropped = F.pad(x, (0, -(x.shape[-1] % 2)))
    return F.pad(cropped, (1, x.shape[-1] % 3), mode="replicate")


def _grouped_mm(a, b, offsets):
    out = torch._grouped_mm(a, b, offs=offsets)
    # rows past the last offset are left uninitialised by the kernel (validation draws
    # offsets that need not cover every row): only the grouped rows are compared
    grouped = torch.arange(a.shape[0]) < offsets[-1]
    return torch.where(grouped[:, None], out, 0.0)


def _randn(*shape):
    return torch.randn(*shape)


def _offsets(tokens):
    return torch.tensor([tokens // 3, tokens], dtype=torch.int32)


#: name -> (function, example inputs, dynamic shapes, other inputs)
CASES = {
    "chunk": (_chunk, (_randn(3, 7),), ({1: "d"},), [(_randn(3, 2),), (_randn(3, 10),)]),
    "last_column": (
        _last_column,
        (_randn(3, 6),),
        ({0: "b", 1: "d"},),
        [(_randn(2, 2),), (_randn(5, 9),)],
    ),
    "assign_last_column": (
        _assign_last_column,
        (_randn(4, 6, 3),),
        ({0: "b", 1: "d"},),
        [(_randn(2, 2, 3),), (_randn(7, 9, 3),)],
    ),
    "take_along_dim": (
        _take_along_dim,
        (_randn(4, 5),),
        ({0: "b", 1: "s"},),
        [(_randn(2, 2),), (_randn(7, 3),)],
    ),
    "take_along_dim_method": (
        _take_along_dim_method,
        (_randn(4, 5),),
        ({0: "b", 1: "s"},),
        [(_randn(2, 2),), (_randn(7, 3),)],
    ),
    "narrow_min": (
        _narrow_min,
        (_randn(3, 6),),
        ({1: "d"},),
        [(_randn(3, 2),), (_randn(3, 3),), (_randn(3, 4),), (_randn(3, 9),)],
    ),
    "narrow_half": (_narrow_half, (_randn(6, 3),), ({0: "n"},), [(_randn(2, 3),), (_randn(7, 3),)]),
    "strided_flatten": (
        _strided_flatten,
        (_randn(3, 7),),
        ({1: "d"},),
        [(_randn(3, 2),), (_randn(3, 6),), (_randn(3, 11),)],
    ),
    "strided_flatten_function": (
        _strided_flatten_function,
        (_randn(3, 7),),
        ({1: "d"},),
        [(_randn(3, 2),), (_randn(3, 6),), (_randn(3, 11),)],
    ),
    "interpolate_scale": (
        _interpolate_scale,
        (_randn(1, 2, 5, 6),),
        ({2: "h", 3: "w"},),
        [(_randn(1, 2, 2, 2),), (_randn(1, 2, 7, 3),)],
    ),
    "interpolate_size": (
        _interpolate_size,
        (_randn(1, 2, 5, 6),),
        ({2: "h", 3: "w"},),
        [(_randn(1, 2, 2, 2),), (_randn(1, 2, 7, 3),)],
    ),
    "interpolate_bilinear": (
        _interpolate_bilinear,
        (_randn(2, 3, 5, 6),),
        ({0: "b", 2: "h", 3: "w"},),
        [(_randn(3, 3, 2, 2),), (_randn(2, 3, 9, 3),)],
    ),
    "pad_to_multiple": (
        _pad_to_multiple,
        (_randn(1, 2, 5, 6),),
        ({2: "h", 3: "w"},),
        [(_randn(1, 2, 2, 2),), (_randn(1, 2, 3, 8),), (_randn(1, 2, 7, 13),)],
    ),
    "pad_both": (
        _pad_both,
        (_randn(1, 2, 5, 6),),
        ({2: "h", 3: "w"},),
        [(_randn(1, 2, 2, 3),), (_randn(1, 2, 8, 8),), (_randn(1, 2, 17, 13),)],
    ),
    "interpolate_modes": (
        _interpolate_modes,
        (_randn(1, 2, 8, 6),),
        ({2: "h", 3: "w"},),
        [(_randn(1, 2, 2, 2),), (_randn(1, 2, 9, 5),)],
    ),
    "pad_crop_replicate": (
        _pad_crop_replicate,
        (_randn(1, 2, 6),),
        ({2: "w"},),
        [(_randn(1, 2, 2),), (_randn(1, 2, 7),), (_randn(1, 2, 11),)],
    ),
    "grouped_mm_float32": (
        _grouped_mm,
        (_randn(6, 8), torch.randn(2, 4, 8).transpose(-2, -1), _offsets(6)),
        ({0: "tokens"}, None, None),
        [
            (_randn(2, 8), torch.randn(2, 4, 8).transpose(-2, -1), _offsets(2)),
            (_randn(9, 8), torch.randn(2, 4, 8).transpose(-2, -1), _offsets(9)),
        ],
    ),
}


def _whole_blocks(x):
    # the sequence cut to whole blocks of 4, the blocks summed, the layout changed
    n = x.shape[1] // 4 * 4
    blocks = x[:, :n].reshape(x.shape[0], -1, 4, x.shape[2]).sum(2)
    return blocks.transpose(1, 2).contiguous()


def test_a_cut_to_whole_blocks_needs_no_constraint():
    # `4*(seq//4) <= seq` is beyond torch's bounds (a floor division compared with what
    # it divides): the cut was `min(seq, 4*(seq//4))`, and the layout questions on it
    # became relations adopted as constraints, true at every size but unprovable
    model = _Positional(_whole_blocks, 1)
    tracer, _, _ = check_trace(
        model,
        _named((_randn(2, 9, 3),)),
        {"a0": {0: "batch", 1: "seq"}},
        other_inputs=[_named((_randn(b, s, 3),)) for b, s in ((3, 3), (1, 4), (2, 13), (3, 16))],
    )
    assert tracer.constraints == []


def _named(args):
    return {f"a{i}": value for i, value in enumerate(args)}


class _Positional(torch.nn.Module):
    """``forward(a0, a1, ...)`` with named parameters, as tracing binds them by name."""

    def __init__(self, function, count):
        super().__init__()
        self.function = function
        self.count = count

    def forward(self, a0, a1=None, a2=None):
        return self.function(*(a0, a1, a2)[: self.count])


@pytest.mark.parametrize("name", sorted(CASES))
def test_traces_dynamic_without_specializing(name):
    function, example, dynamic, others = CASES[name]
    model = _Positional(function, len(example))
    shapes = {f"a{i}": spec for i, spec in enumerate(dynamic) if spec is not None}
    tracer, graph, _ = check_trace(
        model, _named(example), shapes, other_inputs=[_named(o) for o in others]
    )
    specialized = [g for g in tracer.guards if g.reason == "specialized"]
    assert not specialized, specialized
    # the output sizes depending on a dynamic dimension stayed symbolic
    output = next(n for n in graph.nodes if n.op == "output")
    values = torch.utils._pytree.tree_leaves(
        [a.meta.get("val") for a in torch.utils._pytree.tree_leaves(output.args)]
    )
    assert any(
        isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape)
        for v in values
    ), values


#: cases the tracer captures but the ONNX side (translation, optimizer) does not export
#: (none since _grouped_mm with offsets became a loop over the experts)
ONNX_FAILURES: dict[str, str] = {}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(reason=ONNX_FAILURES[n], strict=True))
        if n in ONNX_FAILURES
        else n
        for n in sorted(CASES)
    ],
)
def test_exports_to_onnx_with_dynamic_dimensions(name):
    pytest.importorskip("onnxruntime")
    from yobx.torch.onnx import to_onnx

    function, example, dynamic, _ = CASES[name]
    model = _Positional(function, len(example))
    shapes = {f"a{i}": spec for i, spec in enumerate(dynamic) if spec is not None}
    result = to_onnx(model, example, dynamic_shapes=shapes, validate=True)
    report = result.validation
    assert report.ok, report.format()
    assert report.n_checked >= 2, report.format()
    declared = {n for spec in dynamic if spec for n in spec.values()}
    assert declared <= set(result.dynamic_dimensions), result.dynamic_dimensions
    # each declared axis of each input is named in the ONNX model, not a number
    for onnx_input, spec in zip(result.model_proto.graph.input, dynamic):
        dims = onnx_input.type.tensor_type.shape.dim
        for axis, dim_name in (spec or {}).items():
            assert dims[axis].dim_param == dim_name, (onnx_input.name, axis, dims[axis])


def test_mixture_of_experts_on_cpu_float32():
    """transformers' default experts implementation calls torch._grouped_mm."""
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    model = transformers.MixtralForCausalLM(config).eval()
    assert model.config._experts_implementation == "grouped_mm"

    def inputs(batch, seq):
        return {"input_ids": torch.randint(0, 64, (batch, seq)), "use_cache": False}

    tracer, graph, _ = check_trace(
        model,
        inputs(2, 5),
        {"input_ids": {0: "batch", 1: "seq"}},
        other_inputs=[inputs(2, 2), inputs(3, 7), inputs(1, 1), inputs(1, 4), inputs(3, 1)],
    )
    assert not [g for g in tracer.guards if g.reason == "specialized"]
    # batch 1 and seq 1 take other sides of the masks' and attention's decisions:
    # each version calls the grouped matmul
    graphs = [v.graph for v in tracer.versions] or [graph]
    assert all(any(n.target is torch._grouped_mm for n in g.nodes) for g in graphs)


def test_pad_needing_a_real_constraint_is_adopted_and_checked():
    """Reflection needs the pad below the size: false for w = 2 (2 % 3 == 2)."""
    from torch.export import Dim

    from yobx.torch.tracing import ConstraintViolationError, StrictDimensionError

    model = _Positional(lambda x: F.pad(x, (1, x.shape[-1] % 3), mode="reflect"), 1)
    tracer, _, gm = check_trace(model, {"a0": _randn(1, 2, 6)}, {"a0": {2: "w"}})
    assert tracer.constraints, "the fact reflection needs is reported"
    with pytest.raises(ConstraintViolationError):
        gm(_randn(1, 2, 2))
    with pytest.raises(StrictDimensionError):
        check_trace(model, {"a0": _randn(1, 2, 6)}, {"a0": {2: Dim("w")}})


# the prover: facts that hold for every size


def _prove(expression_of):
    dims = SymbolicDimensions()
    d = dims.dimension("d", 6).node.expr
    return dims.prove(expression_of(d))


@pytest.mark.parametrize(
    "claim, expected",
    [
        (lambda d: _eq(_ceil(d, _ceil(d, 2)), 2), True),  # chunk(2) gives 2 pieces
        (lambda d: _eq(_ceil(d, _ceil(d, 3)), 3), None),  # d=4 gives 2 pieces
        (lambda d: _ge(d - _min(4, d), 0), True),
        (lambda d: _le(_min(4, d), 3), None),  # d >= 4 gives 4
        (lambda d: _ge(_max(4, d) - d, 1), None),  # d >= 4 gives 0
        (lambda d: _le(_floordiv(d + 1, 2), d - 1), True),  # d=2: 1 <= 1
        (lambda d: _lt(_floordiv(d + 1, 2), d - 1), None),  # d=2: 1 < 1 is false
        (lambda d: _ne(_floordiv(d + 1, 2), 1), None),  # d=2 gives 1
        (lambda d: _eq(_floordiv(d, 2) + _floordiv(d + 1, 2), d), True),
        (lambda d: _lt(_floordiv(d, _floordiv(d, 2)), 2), False),
        (lambda d: _and(_gt(d, 1), _lt(d, d + 1)), True),
        (lambda d: _and(_gt(d, 1), _lt(_mod(d, 3), d)), None),  # d=2: 2 < 2 is false
        (lambda d: _or(_lt(d, 1), _gt(d, 1)), True),
        (lambda d: _or(_lt(d, 1), _lt(d, 0)), False),
    ],
)
def test_prover_integer_facts(claim, expected):
    assert _prove(claim) is expected


def test_prover_is_sound_on_chunk_counts():
    """Every proved claim holds at each size from 2 to 100."""
    import sympy

    dims = SymbolicDimensions()
    d = dims.dimension("d", 6).node.expr
    proved = 0
    for chunks in range(1, 6):
        count = _ceil(d, _ceil(d, chunks))
        for pieces in range(1, 6):
            for relation in (sympy.Eq, sympy.Ne, sympy.Le, sympy.Lt, sympy.Ge, sympy.Gt):
                claim = relation(count, pieces)
                answer = dims.prove(claim)
                if answer is None:
                    continue
                proved += 1
                for size in range(2, 101):
                    assert bool(claim.subs(d, size)) is answer, (claim, size)
    assert proved > 50


def _floordiv(a, b):
    from torch.utils._sympy.functions import FloorDiv

    return FloorDiv(a, b)


def _ceil(a, b):
    return _floordiv(a + b - 1, b)


def _min(a, b):
    from torch.utils._sympy.functions import Min

    return Min(a, b)


def _max(a, b):
    from torch.utils._sympy.functions import Max

    return Max(a, b)


def _eq(a, b):
    import sympy

    return sympy.Eq(a, b)


def _ne(a, b):
    import sympy

    return sympy.Ne(a, b)


def _le(a, b):
    import sympy

    return sympy.Le(a, b)


def _lt(a, b):
    import sympy

    return sympy.Lt(a, b)


def _ge(a, b):
    import sympy

    return sympy.Ge(a, b)


def _gt(a, b):
    import sympy

    return sympy.Gt(a, b)


def _mod(a, b):
    import sympy

    return sympy.Mod(a, b)


def _and(a, b):
    import sympy

    return sympy.And(a, b)


def _or(a, b):
    import sympy

    return sympy.Or(a, b)
