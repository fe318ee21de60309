"""Idioms on shapes: slicing with symbolic bounds, reshapes, chunks and splits, narrow,
padding, resizing and pooling (see :mod:`program_builder`)."""

from __future__ import annotations

from .program_builder import Made, ProgramBuilder, idiom
from .program_builder import single as _one

# slicing


@idiom(1.5)
def slice_half(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    return _one(b, b.index(v, a, f": {v}.shape[{a}] // 2"))


@idiom()
def slice_inner(b: ProgramBuilder) -> Made:
    v = b.pick()
    return _one(b, b.index(v, b.axis(v), "1:-1"))


@idiom()
def slice_from(b: ProgramBuilder) -> Made:
    v = b.pick()
    return _one(b, b.index(v, b.axis(v), f"{b.rng.randint(1, 2)}:"))


@idiom()
def slice_step(b: ProgramBuilder) -> Made:
    v = b.pick()
    return _one(b, b.index(v, b.axis(v), b.rng.choice(("::2", "1::2", ":-1:2"))))


@idiom()
def slice_end_expression(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    item = b.rng.choice((f": {v}.shape[{a}] - 1", f"-({v}.shape[{a}] // 2) :"))
    return _one(b, b.index(v, a, item))


@idiom()
def slice_of_one(b: ProgramBuilder) -> Made:
    """A slice of length ``min(1, n)``, which sympy folds to 1: 0 for an empty axis."""
    v = b.pick()
    return _one(b, b.index(v, b.axis(v), b.rng.choice((":1", "-1:", "0:1"))))


@idiom(0.5)
def size_folded_from_one(b: ProgramBuilder) -> Made:
    """Python on a size that holds from 1 on only: ``if n:``, ``range(n - 1)``,
    ``max(n, 1)``."""
    v = b.pick()
    n = f"{v}.shape[{b.axis(v)}]"
    factor = b.rng.choice(
        (f"(1 if {n} else 2)", f"len(range({n} - 1))", f"({n} // max({n}, 1) + 1)")
    )
    return _one(b, f"{v} * {factor}")


@idiom()
def slice_by_other(b: ProgramBuilder) -> Made:
    v = b.pick()
    w = b.other(v)
    if w is None:
        return None
    return _one(b, b.index(v, b.axis(v), f": {w}.shape[{b.axis(w)}]"))


@idiom()
def select_last(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=2)
    if v is None:
        return None
    a = b.axis(v)
    return _one(b, b.index(v, a, b.rng.choice((f"{v}.shape[{a}] - 1", "-1", "0"))))


@idiom()
def buffer_slice(b: ProgramBuilder) -> Made:
    v = b.pick()
    return _one(b, f"{v} + self.table[: {v}.shape[-1]]")


# reshapes


@idiom(1.5)
def reshape_computed(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=2)
    if v is None:
        return None
    shape = b.rng.choice(
        (f"{v}.shape[0], -1", "-1", f"-1, {v}.shape[-1]", f"{v}.shape[0] * {v}.shape[1], -1")
    )
    return _one(b, f"{v}.reshape({shape})")


@idiom(1.5)
def view_halves(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    if b.rng.random() < 0.5:
        return _one(b, f"{v}.unflatten({a}, (-1, 2))")
    shape = f"*{v}.shape[:{a}], {v}.shape[{a}] // 2, 2, *{v}.shape[{a + 1}:]"
    return _one(b, f"{v}.contiguous().view({shape})")


@idiom()
def flatten(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=2)
    if v is None:
        return None
    a = b.rng.randrange(b.rank(v) - 1)
    return _one(b, b.rng.choice((f"{v}.flatten({a}, {a + 1})", f"{v}.flatten()")))


@idiom()
def permute(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=2)
    if v is None:
        return None
    perm = list(range(b.rank(v)))
    b.rng.shuffle(perm)
    a, c = b.rng.sample(range(b.rank(v)), 2)
    return _one(
        b, b.rng.choice((f"{v}.permute{tuple(perm)}", f"{v}.transpose({a}, {c}).contiguous()"))
    )


@idiom(0.5)
def unsqueeze(b: ProgramBuilder) -> Made:
    v = b.pick(max_rank=4)
    return _one(b, b.rng.choice((f"{v}.unsqueeze({b.axis(v)})", f"{v}[:, None]", f"{v}[None]")))


# chunks and splits


@idiom()
def chunk_swap(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    p, q, t = b.new("p"), b.new("q"), b.new()
    return [f"{p}, {q} = {v}.chunk(2, {a})", f"{t} = torch.cat([{q}, {p}], {a})"], [t]


@idiom(0.7)
def chunk_count(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    k = b.rng.randint(2, 4)
    return _one(b, b.rng.choice((f"{v}.chunk({k}, {a})[0]", f"{v} * len({v}.chunk({k}, {a}))")))


@idiom()
def split_sizes(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    p, q, t = b.new("p"), b.new("q"), b.new()
    h = f"{v}.shape[{a}] // 2"
    return [
        f"{p}, {q} = {v}.split([{h}, {v}.shape[{a}] - {h}], {a})",
        f"{t} = {p}.sum({a}, keepdim=True) + {q}",
    ], [t]


@idiom(0.7)
def split_int(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    return _one(b, b.rng.choice((f"{v}.split(2, {a})[0]", f"torch.cat({v}.split(2, {a}), {a})")))


@idiom(0.5)
def unbind(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=2)
    if v is None:
        return None
    return _one(b, f"torch.stack({v}.unbind({b.axis(v, dynamic=0.3)}), -1)")


@idiom()
def narrow_min(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    return _one(b, f"{v}.narrow({a}, 0, min({v}.shape[{a}], {b.rng.randint(2, 6)}))")


@idiom()
def narrow_half(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    h, t = b.new("h"), b.new()
    return [f"{h} = {v}.shape[{a}] // 2", f"{t} = {v}.narrow({a}, {h}, {h})"], [t]


# padding, resizing


@idiom()
def pad_to_multiple(b: ProgramBuilder) -> Made:
    v = b.pick()
    k = b.rng.choice((2, 4))
    p, t = b.new("pad"), b.new()
    return [f"{p} = ({k} - {v}.shape[-1] % {k}) % {k}", f"{t} = F.pad({v}, (0, {p}))"], [t]


@idiom()
def pad_computed(b: ProgramBuilder) -> Made:
    v = b.pick()
    if b.rank(v) >= 2 and b.rng.random() < 0.5:
        return _one(b, f"F.pad({v}, (0, 0, 1, {v}.shape[-2] % 2))")
    return _one(b, f"F.pad({v}, (1, {v}.shape[-1] // 2))")


@idiom()
def interpolate_scale(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=3, max_rank=4)
    if v is None:
        return None
    linear = "linear" if b.rank(v) == 3 else "bilinear"
    mode = b.rng.choice(("nearest", "nearest-exact", linear))
    # scales that are not powers of two pick positions by torch's float32 arithmetic
    scale = b.rng.choice(("2", "1.5", "0.7", "3", "1.7"))
    return _one(b, f'F.interpolate({v}, scale_factor={scale}, mode="{mode}")')


@idiom()
def interpolate_size(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=3, max_rank=4)
    if v is None:
        return None
    if b.rank(v) == 3:
        size = b.rng.choice(
            (f"2 * {v}.shape[-1]", f"{v}.shape[-1] * 3 // 2 + 1", f"int({v}.shape[-1] * 1.8375)")
        )
        mode = b.rng.choice(("nearest", "nearest-exact", "linear"))
        return _one(b, f'F.interpolate({v}, size={size}, mode="{mode}")')
    size = f"({v}.shape[-2] + 1, {v}.shape[-1] * 2)"
    if b.rng.random() < 0.5:
        return _one(b, f'F.interpolate({v}, size={size}, mode="bilinear", align_corners=False)')
    mode = b.rng.choice(("nearest", "nearest-exact"))
    return _one(b, f'F.interpolate({v}, size={size}, mode="{mode}")')


@idiom(0.5)
def size_from_a_float(b: ProgramBuilder) -> Made:
    # a symbolic float (a Python float in eager) truncated to a size: 0.7 * 90 is
    # 62.99999999999999 in double, 63 in float32
    v = b.pick()
    a = b.axis(v)
    factor = b.rng.choice(("0.7", "1.3", "44100 / 24000"))
    return _one(b, f"{v}.new_ones(int({v}.shape[{a}] * {factor}) + 1)")


@idiom(0.7)
def pooling(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=3, max_rank=4)
    if v is None:
        return None
    if b.rank(v) == 3:
        return _one(b, f"F.avg_pool1d({v}, 2)")
    return _one(b, f"F.max_pool2d({v}, 2, ceil_mode={b.rng.random() < 0.5})")


@idiom(0.7)
def conv1d(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=3, max_rank=3)
    if v is None:
        return None
    weight = f"torch.ones(2, {v}.shape[1], 3) / 3"
    return _one(b, f"F.conv1d({v}, {weight}, padding={b.rng.randint(0, 1)})")


@idiom(0.7)
def squeeze(b: ProgramBuilder) -> Made:
    """The rank of the result depends on which sizes are 1 (``x.shape[a] // 2`` may be)."""
    v = b.pick()
    return _one(b, b.rng.choice((f"{v}.squeeze()", f"{v}.squeeze({b.axis(v)})")))


@idiom(0.7)
def trim_to_even(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    return _one(b, b.index(v, a, f": {v}.shape[{a}] // 2 * 2"))


@idiom(0.5)
def unfold(b: ProgramBuilder) -> Made:
    v = b.pick(max_rank=4)
    return _one(b, f"{v}.unfold({b.axis(v)}, 2, {b.rng.randint(1, 2)})")


@idiom(0.7)
def adaptive_pooling(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=3, max_rank=4)
    if v is None:
        return None
    if b.rank(v) == 3:
        return _one(b, f"F.adaptive_avg_pool1d({v}, {b.rng.randint(1, 3)})")
    return _one(b, f"F.adaptive_avg_pool2d({v}, ({b.rng.randint(1, 3)}, 2))")
