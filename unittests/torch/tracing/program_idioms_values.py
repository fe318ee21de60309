"""Idioms on values computed from dimensions: branches, dimension arithmetic, combining
tensors, factories, reductions and masks, writes (see :mod:`program_builder`)."""

from __future__ import annotations

from .program_builder import Made, ProgramBuilder, idiom
from .program_builder import single as _one

# branches and dimension arithmetic


@idiom(1.5)
def branch_on_dim(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    k = b.rng.randint(1, max(b.sizes(v, a)))
    op = b.rng.choice((">", ">=", "<", "=="))
    t = b.new()
    return [
        f"if {v}.shape[{a}] {op} {k}:",
        f"    {t} = {v} * 2",
        "else:",
        f"    {t} = {v} - 1",
    ], [t]


@idiom()
def branch_on_parity(b: ProgramBuilder) -> Made:
    """The Swin/UNet pattern: pad an odd dimension to an even one."""
    v = b.pick()
    t = b.new()
    return [
        f"{t} = {v}",
        f"if {v}.shape[-1] % 2 != 0:",
        f"    {t} = F.pad({v}, (0, 1))",
    ], [t]


@idiom()
def branch_compare_dims(b: ProgramBuilder) -> Made:
    v = b.pick()
    w = b.other(v)
    if w is None:
        return None
    op = b.rng.choice(("==", "!=", ">", "<="))
    t = b.new()
    return [
        f"if {v}.shape[{b.axis(v)}] {op} {w}.shape[{b.axis(w)}]:",
        f"    {t} = {v} + 1",
        "else:",
        f"    {t} = {v} * 3",
    ], [t]


@idiom()
def dim_arithmetic(b: ProgramBuilder) -> Made:
    v = b.pick()
    a, c = b.axis(v), b.axis(v)
    k = b.rng.randint(2, 3)
    expression = b.rng.choice(
        (
            f"{v} * ({v}.shape[{a}] // {k}) + {v}.shape[{c}] % {k}",
            f"{v} * ({v}.shape[{a}] / {v}.shape[{c}])",
            f"{v} * max({v}.shape[{a}], {k + 2}) - min({v}.shape[{c}], {k})",
            f"{v} / {v}.size(-1)",
            f"{v} * len({v})",
            f"{v} / math.sqrt({v}.shape[-1])",
        )
    )
    return _one(b, expression)


@idiom(0.5)
def int_of_dim(b: ProgramBuilder) -> Made:
    v = b.pick()
    return _one(b, f"{v}.reshape(int({v}.shape[0]), -1)")


@idiom(0.7)
def number_from_dims(b: ProgramBuilder) -> Made:
    """Never narrow, item 2: ints and floats made from sizes fed back to torch."""
    v = b.pick()
    a = b.axis(v)
    d = f"{v}.shape[{a}]"
    expression = b.rng.choice(
        (
            f"{v}.narrow({a}, 0, int(({d} + 1) // 2))",
            f"{v}.sum() + {v}.new_zeros(int({d} // 2) + 1, 2).sum(0).sum()",
            f"F.pad({v}, (0, math.ceil({v}.shape[-1] / 4) * 4 - {v}.shape[-1]))",
            f"{v} * round({d} * 0.75) + {v} / float({d})",
            f"{v}.flatten()[: int({v}.numel() * 0.5) + 1]",
            f"{v}.split([int({d} // 2), {d} - int({d} // 2)], {a})[1]",
        )
    )
    return _one(b, expression)


@idiom(0.3)
def loop_over_blocks(b: ProgramBuilder) -> Made:
    """``for i in range((n + 1) // 2)``: a Python int from a size (each value a version)."""
    v = b.pick()
    a = b.axis(v)
    i, t = b.new("i"), b.new()
    return [
        f"{t} = {b.index(v, a, ':1')} * 0",
        f"for {i} in range(({v}.shape[{a}] + 1) // 2):",
        f"    {t} = {t} + {v}.narrow({a}, {i}, 1)",
    ], [t]


@idiom(0.4)
def loop_recurrence(b: ProgramBuilder) -> Made:
    """``for i in range(x.shape[a]):`` carrying a state (a state-space model's slow
    path): a scan when the steps are one computation."""
    v = b.pick()
    a = b.axis(v)
    h, outs, t, i = b.new("h"), b.new("outs"), b.new(), b.new("i")
    steps = b.rng.choice(("range", "reversed", "from_one"))
    loop = {
        "range": f"range({v}.shape[{a}])",
        "reversed": f"reversed(range({v}.shape[{a}]))",
        "from_one": f"range(1, {v}.shape[{a}])",
    }[steps]
    lines = [
        f"{h} = {b.index(v, a, '0')} * 0",
        f"{outs} = []",
        f"for {i} in {loop}:",
        f"    {h} = {h} * 0.5 + {b.index(v, a, i)}",
        f"    {outs}.append({h} * 2)",
    ]
    end = b.rng.choice(("stack", "carry", "len"))
    if end == "stack" and steps == "range":
        lines.append(f"{t} = torch.stack({outs}, {a})")
    elif end == "len":
        lines.append(f"{t} = {h} * len({outs})")
    else:
        lines.append(f"{t} = {h}")
    return lines, [t]


@idiom(0.3)
def loop_over_pieces(b: ProgramBuilder) -> Made:
    """``for xt in x.unbind(a)`` / ``x.split(1, a)``, or writes into a new tensor
    (``out[:, i] = ...``, the recurrent models of transformers)."""
    v = b.pick()
    a = b.axis(v)
    h, t, p = b.new("h"), b.new(), b.new("p")
    how = b.rng.choice(("unbind", "split", "write"))
    if how == "write":
        i = b.new("i")
        return [
            f"{t} = torch.zeros_like({v})",
            f"{h} = {b.index(v, a, '0')} * 0",
            f"for {i} in range({v}.shape[{a}]):",
            f"    {h} = ({h} + {b.index(v, a, i)}).sin()",
            f"    {b.index(t, a, i, rank=b.rank(v))} = {h}",
        ], [t]
    pieces = f"{v}.unbind({a})" if how == "unbind" else f"{v}.split(1, dim={a})"
    first = b.index(v, a, "0") if how == "unbind" else b.index(v, a, ":1")
    outs = b.new("outs")
    join = "stack" if how == "unbind" else "cat"
    return [
        f"{h} = {first} * 0",
        f"{outs} = []",
        f"for {p} in {pieces}:",
        f"    {h} = {h} * 0.9 - {p}",
        f"    {outs}.append({h})",
        f"{t} = torch.{join}({outs}, {a})",
    ], [t]


@idiom(0.5)
def write_into_created(b: ProgramBuilder) -> Made:
    """A tensor created from Python values, written with traced values (directly,
    through a view, or eagerly after the graph read it), then read: every call of the
    graph starts from the created values (yobx's constant_writes)."""
    v = b.pick()
    acc, t = b.new("acc"), b.new()
    k = b.rng.randint(2, 4)
    how = b.rng.choice(("add", "setitem", "view", "eager"))
    write = {
        "add": [f"{acc}.add_({v}.sum())"],
        "setitem": [f"{acc}[{k - 1}] = {v}.mean()"],
        "view": [f"{acc}[1:].mul_({v}.abs().sum() + 1)"],
        "eager": [f"{t} = {v} * {acc}[0]", f"{acc}.add_(1.0)"],
    }[how]
    return [
        f"{acc} = torch.arange({float(k)})",
        *write,
        f"{t} = {v} * ({acc}.sum() + 1)" if how != "eager" else f"{t} = {t} + {acc}.sum()",
    ], [t]


@idiom(0.5)
def tensor_of_dim(b: ProgramBuilder) -> Made:
    v = b.pick()
    return _one(b, f"{v} * torch.tensor({v}.shape[-1], dtype=torch.float32)")


@idiom(0.7)
def reshape_len(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=2)
    if v is None:
        return None
    n, t = b.new("n"), b.new()
    return [f"{n} = len({v})", f"{t} = {v}.reshape({n}, -1) / {n}"], [t]


# combining tensors


@idiom()
def cat_self(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    return _one(b, f"torch.cat([{v}, {b.index(v, a, ':1')}], {a})")


@idiom()
def cat_other(b: ProgramBuilder) -> Made:
    v = b.pick()
    w = b.other(v)
    if w is None:
        return None
    return _one(b, f"torch.cat([{v}, {w}], {b.axis(v)})")


@idiom(0.7)
def stack(b: ProgramBuilder) -> Made:
    v = b.pick(max_rank=4)
    return _one(b, f"torch.stack([{v}, {v} * 2], {b.rng.randint(0, b.rank(v))})")


@idiom(1.5)
def broadcast(b: ProgramBuilder) -> Made:
    v = b.pick()
    w = b.other(v)
    if w is None:
        return None
    return _one(b, b.rng.choice((f"{v} + {w}", f"{v} * {w}", f"{v} - {w}.mean()")))


@idiom()
def expand(b: ProgramBuilder) -> Made:
    v = b.pick(max_rank=4)
    a = b.axis(v)
    w = b.other(v) or v
    expression = b.rng.choice(
        (
            f"{v}.unsqueeze(0).expand({w}.shape[0], *{v}.shape)",
            f"{v}.sum({a}, keepdim=True).expand_as({v})",
            f"{b.index(v, a, ':1')}.expand(*{v}.shape)",
        )
    )
    return _one(b, expression)


@idiom()
def matmul(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=2)
    if v is None:
        return None
    w = b.other(v)
    other = f"{w}.transpose(-1, -2)" if w and b.rng.random() < 0.3 else f"{v}.transpose(-1, -2)"
    return _one(b, f"{v} @ {other}")


@idiom(0.7)
def repeat(b: ProgramBuilder) -> Made:
    v = b.pick()
    repeats = ", ".join(["1"] * (b.rank(v) - 1) + ["2"])
    expression = b.rng.choice((f"{v}.repeat({repeats})", f"{v}.repeat_interleave(2, {b.axis(v)})"))
    return _one(b, expression)


# factories from dimensions


@idiom()
def new_zeros(b: ProgramBuilder) -> Made:
    v = b.pick()
    return _one(b, f"torch.cat([{v}, {v}.new_zeros(*{v}.shape[:-1], 3)], -1)")


@idiom(0.7)
def constant_tensor_sizes(b: ProgramBuilder) -> Made:
    """Methods of constant tensors given traced sizes one by one (issue 29)."""
    v = b.pick()
    expression = b.rng.choice(
        (
            f"{v} + torch.ones(1).expand(*{v}.shape)",
            f"{v} + torch.ones(1).new_zeros(*{v}.shape)",
            f"{v} * torch.full((1,), 2.0).new_ones({v}.shape[0], *{v}.shape[1:])",
        )
    )
    return _one(b, expression)


@idiom(0.7)
def check_on_values(b: ProgramBuilder) -> Made:
    """``assert`` and ``torch._check`` on values: graph nodes that hold here."""
    v = b.pick()
    t = b.new()
    check = b.rng.choice(
        (
            f"assert ({v}.abs() >= 0).all(), 'values'",
            f"assert {v}.isfinite().all()",
            f"torch._check(({v}.abs() >= 0).all().item())",
            f"torch._check({v}.isfinite().sum().item() <= {v}.numel())",
        )
    )
    return [check, f"{t} = {v} + 1"], [t]


@idiom()
def arange(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    expression = b.rng.choice(
        (
            f"{v} + torch.arange({v}.shape[-1])",
            f"{v} * torch.arange({v}.shape[-1], dtype=torch.float32) / {v}.shape[-1]",
            f"{v}.index_select({a}, torch.arange(0, {v}.shape[{a}], 2))",
        )
    )
    return _one(b, expression)


@idiom(0.7)
def full_from_shape(b: ProgramBuilder) -> Made:
    v = b.pick()
    expression = b.rng.choice(
        (
            f"{v} + torch.full({v}.shape[:-1] + (1,), {v}.shape[-1])",
            f"{v} + torch.zeros({v}.shape[-1])",
            f"{v} @ torch.ones({v}.shape[-1], {v}.shape[-1]).tril()",
        )
    )
    return _one(b, expression)


# reductions, masks, values


@idiom(1.5)
def reduction(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    keep = b.rng.random() < 0.5
    expression = b.rng.choice(
        (
            f"{v}.sum({a}, keepdim={keep})",
            f"{v}.mean({a}, keepdim={keep})",
            f"{v}.amax({a}, keepdim={keep})",
            f"{v}.softmax({a})",
            f"{v}.cumsum({a})",
            f"{v}.logsumexp({a}, keepdim={keep})",
            f"F.layer_norm({v}, {v}.shape[-1:])",
            f"{v}.topk(min({v}.shape[-1], 3), -1).values",
            f"{v}.roll({v}.shape[{a}] // 2, {a})",
        )
    )
    return _one(b, expression)


@idiom()
def where(b: ProgramBuilder) -> Made:
    v = b.pick()
    expression = b.rng.choice(
        (
            f"torch.where({v} > 0, {v}, {v} * 0.1)",
            f"torch.where(torch.arange({v}.shape[-1]) < {v}.shape[-1] // 2, {v}, -{v})",
        )
    )
    return _one(b, expression)


@idiom()
def masked_fill(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=2)
    if v is None:
        return None
    if b.rng.random() < 0.5:
        s, t = b.new("s"), b.new()
        n = f"{s}.shape[-1]"
        mask = f"torch.ones({n}, {n}, dtype=torch.bool).triu(1)"
        return [f"{s} = {v} @ {v}.transpose(-1, -2)", f"{t} = {s}.masked_fill({mask}, -1e4)"], [t]
    w = b.other(v) or v
    mask = f"torch.arange({v}.shape[-1]) >= {w}.shape[{b.axis(w)}]"
    return _one(b, f"{v}.masked_fill({mask}, 0.0)")


# writes


@idiom()
def setitem_on_clone(b: ProgramBuilder) -> Made:
    v = b.pick()
    a, r = b.axis(v), b.rank(v)
    t = b.new()
    rhs = b.rng.choice((f"{b.index(t, a, '-1', r)} * 2", "0.5"))
    target = b.rng.choice((b.index(t, a, "0", r), b.index(t, a, f": {t}.shape[{a}] // 2", r)))
    return [f"{t} = {v}.clone()", f"{target} = {rhs}"], [t]


@idiom(0.5)
def write_input(b: ProgramBuilder) -> Made:
    """Programs may write into their inputs: the harness compares inputs after the call."""
    x = b.rng.choice(b.inputs)
    a = b.axis(x)
    line = b.rng.choice(
        (
            f"{x}.mul_(2)",
            f"{b.index(x, a, '0')} = 1.0",
            f"{x}[..., -1:] += {x}.shape[-1]",
            f"{b.index(x, a, f': {x}.shape[{a}] // 2')} *= 2",
        )
    )
    return [line], []


@idiom(0.7)
def write_through_view(b: ProgramBuilder) -> Made:
    """``reshape``/``contiguous``/``flatten`` return a view or a copy depending on the
    sizes: a write into the result reaches the source at some sizes only."""
    v = b.pick()
    w, t = b.new("w"), b.new()
    a = b.axis(v)
    source = b.rng.choice((v, b.index(v, a, f": {v}.shape[{a}] // 2"), b.index(v, a, "::2")))
    view = b.rng.choice(
        (
            "reshape(-1)",
            "flatten()",
            "contiguous()",
            f"transpose(0, {b.rank(v) - 1}).contiguous()",
            f"reshape({v}.shape[0], -1)" if source == v else "reshape(-1)",
        )
    )
    write = b.rng.choice((f"{w}.mul_(2)", f"{w}[0] = 0.5", f"{w}.add_({w}.shape[-1])"))
    return [f"{w} = {source}.{view}", write, f"{t} = {v} + 1"], [t]


# more values from dimensions


@idiom(0.7)
def scalar_from_dims(b: ProgramBuilder) -> Made:
    v = b.pick()
    expression = b.rng.choice(
        (
            f"{v} / {v}.numel()",
            f"{v}.reshape({v}.numel())",
            f"{v} * float({v}.shape[-1])",
            f"{v} + torch.full_like({v}, {v}.shape[-1])",
            f"{v} * sum({v}.shape) - math.prod({v}.shape)",
        )
    )
    return _one(b, expression)


@idiom(0.5)
def tensor_of_shape(b: ProgramBuilder) -> Made:
    v = b.pick()
    return _one(b, f"{v} * torch.tensor({v}.shape).sum().float()")


@idiom(0.7)
def take_along(b: ProgramBuilder) -> Made:
    v = b.pick()
    a = b.axis(v)
    expression = b.rng.choice(
        (
            f"torch.take_along_dim({v}, {v}.argsort({a}), {a})",
            f"{v}.gather({a}, {v}.argmax({a}, keepdim=True))",
        )
    )
    return _one(b, expression)


@idiom(0.7)
def attention(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=2, max_rank=4)
    if v is None:
        return None
    causal = b.rng.random() < 0.5
    return _one(b, f"F.scaled_dot_product_attention({v}, {v}, {v}, is_causal={causal})")


@idiom(0.7)
def position_grid(b: ProgramBuilder) -> Made:
    """Vision models build position grids from the image size."""
    v = b.pick(min_rank=2)
    if v is None:
        return None
    g, t = b.new("g"), b.new()
    steps = f"torch.linspace(0, 1, {v}.shape[-1])"
    return [
        f"{g} = torch.meshgrid(torch.arange({v}.shape[-2]), {steps}, indexing='ij')",
        f"{t} = {v} + {g}[0] * {g}[1]",
    ], [t]


@idiom(0.5)
def group_norm(b: ProgramBuilder) -> Made:
    v = b.pick(min_rank=2)
    if v is None:
        return None
    return _one(b, f"F.group_norm({v}, 1)")
