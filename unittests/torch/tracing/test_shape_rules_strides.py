"""The layout of elementwise results decided from the dimensions' ranges
(``shape_rules._strides``) against torch's ``compute_elementwise_output_strides``, on
random layouts: permuted, padded (a slice of a wider buffer), broadcast; static and
symbolic sizes; one to three operands."""

from __future__ import annotations

import random

import pytest
import torch
from torch._prims_common import compute_elementwise_output_strides
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
    statically_known_true,
)

from yobx.torch.tracing.shape_rules._strides import (
    RangeDecider,
    _decided,
    _Undecided,
    decided_contiguity,
    elementwise_output_strides,
)


def _operand(rng: random.Random, mode: FakeTensorMode, shape: list) -> torch.Tensor:
    """A tensor of ``shape`` (broadcast from size 1 on some dimensions) laid out in a
    random order of its dimensions, sometimes padded along the innermost one."""
    ndim = len(shape)
    sizes = [s if rng.random() < 0.7 else 1 for s in shape]
    order = list(range(ndim))
    rng.shuffle(order)
    physical = [sizes[i] for i in order]
    with mode:
        if rng.random() < 0.3:
            tensor = torch.empty([*physical[:-1], physical[-1] * 2])[..., : physical[-1]]
        else:
            tensor = torch.empty(physical)
        return tensor.permute([order.index(i) for i in range(ndim)]).expand(shape)


def _operands(seed: int, specialize_zero_one: bool = True) -> tuple[ShapeEnv, list[torch.Tensor]]:
    rng = random.Random(seed)
    # without the 0/1 specialization, dynamic sizes range from 0: more is left to torch
    shape_env = ShapeEnv(specialize_zero_one=specialize_zero_one)
    mode = FakeTensorMode(shape_env=shape_env)
    real = [rng.choice([1, 2, 3, 4, 5, 8]) for _ in range(rng.randint(1, 5))]
    dynamic = [
        DimDynamic.DYNAMIC if size >= 2 and rng.random() < 0.5 else DimDynamic.STATIC
        for size in real
    ]
    base = mode.from_tensor(
        torch.empty(real), symbolic_context=StatelessSymbolicContext(dynamic_sizes=dynamic)
    )
    shape = list(base.shape)
    return shape_env, [_operand(rng, mode, shape) for _ in range(rng.randint(1, 3))]


def _same(a, b) -> bool:
    def equal(u, v):
        result = u == v
        return result if isinstance(result, bool) else statically_known_true(result)

    return len(a) == len(b) and all(equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize(
    ("block", "specialize_zero_one", "oblivious"),
    [(0, True, False), (1, True, True), (2, False, False), (3, False, True)],
)
def test_decided_layouts_are_torch_layouts(block, specialize_zero_one, oblivious):
    """Also in torch's size-oblivious mode, the tracer's: torch then answers only what
    it proves, and must still agree."""
    decided = 0
    for seed in range(block * 100, (block + 1) * 100):
        shape_env, tensors = _operands(seed, specialize_zero_one)
        try:
            strides = _decided(RangeDecider(shape_env), tensors)
        except _Undecided:
            continue
        decided += 1
        with torch.fx.experimental._config.patch(backed_size_oblivious=oblivious):
            expected = compute_elementwise_output_strides(*tensors)
        assert _same(strides, expected), (
            [(tuple(t.shape), t.stride()) for t in tensors],
            strides,
            expected,
        )
    # most layouts are settled by the ranges (the others go to torch)
    assert decided > 25


def test_undecided_falls_back_to_torch_and_its_guard():
    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 2)
    rows, cols = mode.from_tensor(torch.empty(3, 4), symbolic_context=dynamic).shape
    with mode:
        # strides of two different symbols: only the example (3 < 4) orders them
        a = torch.empty_strided((rows, cols), (cols, rows))
        b = torch.empty(rows, cols)
    with pytest.raises(_Undecided):
        _decided(RangeDecider(shape_env), [a, b])
    guards = len(shape_env.guards)
    strides = elementwise_output_strides(shape_env, [a, b])
    assert len(shape_env.guards) > guards
    assert _same(strides, compute_elementwise_output_strides(a, b))


def test_squares_and_monomials():
    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    x = mode.from_tensor(torch.empty(5, 8), symbolic_context=dynamic)
    n = x.shape[0]
    decider = RangeDecider(shape_env)
    key = n.node.expr
    # n >= 2: n**2 > n, 8n >= 8, n % 8 undecided (depends on n)
    assert decider.greater_equal(key**2, key)
    assert not decider.equal(key**2, key)
    assert decider.divides(8 * key, key)
    assert not decider.divides(1, key)
    with pytest.raises(_Undecided):
        decider.divides(key, 8)
    with pytest.raises(_Undecided):
        decider.equal(key, 8)


def test_decided_layouts_replace_torchs_permutation_in_the_window_only():
    import threading

    import torch._prims_common as prims_common

    from yobx.torch.tracing.constraints.decided_layouts import decided_layouts

    name = "compute_elementwise_output_logical_to_physical_perm"
    original = getattr(prims_common, name)
    cases = [_operands(seed) for seed in range(40)]
    expected = [original(*tensors) for _, tensors in cases]
    first = cases[0][1][0]
    with first.fake_mode:
        transposed = first.transpose(0, -1)
        like = torch.empty_like(transposed).stride()
    seen_elsewhere = []
    with decided_layouts():
        assert getattr(prims_common, name) is not original
        for (_, tensors), (perm, _) in zip(cases, expected):
            assert getattr(prims_common, name)(*tensors) == (perm, False)
            # the ambiguity check is torch's own
            assert getattr(prims_common, name)(*tensors, ambiguity_check=True)[0] == perm
        # torch's functions calling it by name (empty_like of a transposed tensor)
        with first.fake_mode:
            assert torch.empty_like(transposed).stride() == like
        thread = threading.Thread(
            target=lambda: seen_elsewhere.append(getattr(prims_common, name)(*cases[0][1]))
        )
        thread.start()
        thread.join()
    assert getattr(prims_common, name) is original
    assert seen_elsewhere == [expected[0]]


def test_decided_contiguity_is_torchs():
    from torch._prims_common import is_contiguous_for_memory_format_or_false

    formats = (torch.contiguous_format, torch.channels_last, torch.channels_last_3d)
    decided = 0
    for seed in range(150):
        _, tensors = _operands(seed)
        for tensor in tensors:
            for memory_format in formats:
                answer = decided_contiguity(tensor, memory_format)
                if answer is None:
                    continue
                decided += 1
                expected = is_contiguous_for_memory_format_or_false(
                    tensor, memory_format=memory_format
                )
                assert answer == expected, (tensor.shape, tensor.stride(), memory_format)
    assert decided > 300
    # static sizes and other formats are torch's
    assert decided_contiguity(torch.ones(2, 3), torch.contiguous_format) is None
    assert decided_contiguity(tensors[0], torch.preserve_format) is None


def test_sizes_known_at_run_time_only_are_left_to_torch():
    shape_env = ShapeEnv()
    unbacked = shape_env.create_unbacked_symint().node.expr
    shape_env.constrain_symbol_range(unbacked, compiler_min=2, compiler_max=64)
    decider = RangeDecider(shape_env)
    # true for every value, but torch answers False for a run-time size it cannot prove
    with pytest.raises(_Undecided):
        decider.greater_equal(unbacked**2, unbacked)
    with pytest.raises(_Undecided):
        decider.equal(unbacked, 1)
    assert decider.equal(unbacked, unbacked)
