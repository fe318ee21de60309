"""Random programs for the differential fuzzer of the rewrite passes.

A program is the source of a ``torch.nn.Module`` whose ``forward(x, y)`` chains views of
every kind (slices, select, transpose, diagonal, view/reshape, expand, tuple-of-views
elements of split, chunk, unbind, tensor_split...), in-place operations, item
assignments with masks, slices and index tensors, on its inputs, on fresh tensors, on
tensors it creates from Python values and on buffers (one of which may be a view of the
other); ``y`` may alias ``x``. Each line is kept only if eager PyTorch runs the program
so far at every size (twice, buffers carrying over), so every program is valid by
construction.
"""

from __future__ import annotations

import copy
import random
import re
import warnings
from dataclasses import dataclass, field

import torch

COLUMNS = 6
#: number of rows of ``x`` in the example and in the two other runs
SIZES = (5, 7, 9)

_VIEWS = (
    "{v}[1:]",
    "{v}[:, 1:-1]",
    "{v}[::2]",
    "{v}[1]",
    "{v}[:, 2]",
    "{v}[..., 1:]",
    "{v}[None]",
    "{v}[-1]",
    "{v}.t()",
    "{v}.T",
    "{v}.transpose(0, 1)",
    "{v}.permute(1, 0)",
    "{v}.diagonal()",
    "{v}.diagonal(1)",
    "{v}.view(-1)",
    "{v}.reshape(-1)",
    "{v}.flatten()",
    "{v}.unsqueeze(0)",
    "{v}.squeeze()",
    "{v}.narrow(0, 1, 2)",
    "{v}.narrow(-1, 0, 3)",
    "{v}.select(0, 1)",
    "{v}[:1].expand(3, -1)",
    "{v}.expand_as({w})",
    "+{v}",
    "{v}.detach()",
    "{v}.view_as({v})",
    "{v}.contiguous()",
    "{v}.to(torch.float32)",
    "{v}.movedim(0, -1)",
    "{v}.unflatten(-1, (2, 3))",
    "{v}.mT",
    "{v}.swapaxes(0, 1)",
    "{v}[:, None, 1:]",
)
_TUPLE_VIEWS = (
    "{v}.split(2, -1)[{i}]",
    "{v}.split([1, 2, 3], -1)[{i}]",
    "{v}.chunk(3, -1)[{i}]",
    "{v}.unbind(-1)[{i}]",
    "torch.tensor_split({v}, 4, dim=-1)[{i}]",
    "torch.tensor_split({v}, [1, -2], dim=-1)[{i}]",
    "torch.hsplit({v}, 2)[{i}]",
    "{v}.split(2)[{i}]",
    "{v}.chunk(2, 0)[{i}]",
    "{v}.unbind(0)[{i}]",
    "{v}.split(2, -1)[1:][{i}]",
)
_FRESH = (
    "{v} * 2 + 1",
    "torch.sin({v})",
    "{v}.clone()",
    "{v}.sum(0)",
    "torch.cat([{v}, {v}])",
    "{v} - {w}",
    "torch.where({v} > 0, {v}, {w})",
)
#: tensors the program creates from Python values: real while tracing, constants of the
#: graph once a traced value is written into them (yobx's constant_writes)
_CREATED = (
    "torch.zeros(4, 6)",
    "torch.ones(6)",
    "torch.full((3, 6), 0.5)",
    "torch.arange(24.0).reshape(4, 6)",
    "torch.zeros(6, 4).t()",
)
_INPLACE = (
    "{v}.add_(1.5)",
    "{v}.mul_(-2.0)",
    "{v}.clamp_(-1.0, 1.0)",
    "{v}.fill_(0.25)",
    "{v}.zero_()",
    "{v}.sigmoid_()",
    "{v}.add_({w})",
    "{v}.copy_({w})",
    "{v}.mul_({w})",
    "torch.relu_({v})",
    "{v}.exp_()",
    "{v} += 1",
    "{v} *= {w}",
    "F.relu({v}, inplace=True)",
    "{v}.masked_fill_({v} > 0, 0.5)",
    "{v}.index_fill_(0, torch.tensor([0]), 2.0)",
    "{v}.addcmul_({w}, {w})",
    "{v}.lerp_({w}, 0.5)",
    "{v}.t_()",
    "{v}.add_({w}.double())",
    "{v}.masked_fill_({w} > 0, -1.0)",
    "{v}.copy_({w}.t())",
    "torch.Tensor.mul_({v}, 0.5)",
)
_SETITEM = (
    "{v}[0] = 1.0",
    "{v}[1:3] = -2.0",
    "{v}[:, 1] = 0.5",
    "{v}[..., :2] = 3.0",
    "{v}[{v} > 0.5] = -1.0",
    "{v}[{w} > 0] = 2.0",
    "{v}[torch.tensor([0, 2])] = 4.0",
    "{v}[:, torch.tensor([1, 3])] = -4.0",
    "{v}[0] = {w}",
    "{v}[1:] = {w}[:-1]",
    "{v}[:, 0] = {w}[:, -1]",
)
_KINDS = (
    (_VIEWS, 4),
    (_TUPLE_VIEWS, 3),
    (_FRESH, 1),
    (_CREATED, 1),
    (_INPLACE, 4),
    (_SETITEM, 3),
)


@dataclass
class Program:
    """A random program and how to call it.

    :param seed: the seed it was generated from
    :param lines: the body of ``forward`` before the return
    :param outputs: the returned expressions
    :param buffers: ``""`` (no buffer), ``"plain"`` (``self.b``) or ``"view"`` (``self.b``
        and ``self.bv``, a view of a row of ``self.b``)
    :param aliased: when not empty, ``y`` is this view of ``x`` (``x[1]``...)
    :param annotated: ``forward`` annotates its inputs as tensors
    """

    seed: int
    lines: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    buffers: str = ""
    aliased: str = ""
    annotated: bool = True

    @property
    def stateful(self) -> bool:
        return bool(self.buffers)

    def source(self) -> str:
        """The module's source."""
        init = ["        super().__init__()"]
        if self.buffers:
            init.append("        base = torch.linspace(-1, 1, 24).reshape(4, 6)")
            init.append('        self.register_buffer("b", base)')
            if self.buffers == "view":
                init.append('        self.register_buffer("bv", base[1])')
        annotation = ": torch.Tensor" if self.annotated else ""
        body = [f"        {line}" for line in self.lines]
        body.append(f"        return ({', '.join(self.outputs)},)")
        return "\n".join(
            [
                "class Fuzz(torch.nn.Module):",
                "    def __init__(self):",
                *init,
                "",
                f"    def forward(self, x{annotation}, y{annotation}):",
                *body,
            ]
        )

    def build(self) -> torch.nn.Module:
        """Creates the module (in the namespace of ``torch`` and ``F``)."""
        namespace = {"torch": torch, "F": torch.nn.functional}
        exec(compile(self.source(), f"<fuzz program {self.seed}>", "exec"), namespace)
        return namespace["Fuzz"]()

    def inputs(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs with ``rows`` rows (``y`` is a view of ``x`` when aliased)."""
        x = (torch.arange(rows * COLUMNS, dtype=torch.float32) / 7 - 1.1).reshape(rows, COLUMNS)
        x = torch.sin(x * 3)
        if self.aliased:
            return x, eval(self.aliased, {"x": x})
        return x, torch.linspace(-1, 1, COLUMNS)

    def run_eager(self, module: torch.nn.Module, rows: int) -> tuple:
        """Calls the module: (output, inputs after the call, buffers after the call)."""
        args = self.inputs(rows)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = module(*args)
        return out, args, {k: v.clone() for k, v in module.named_buffers()}

    def calls(self) -> int:
        """Stateful modules are called twice: the second call sees the first's effects."""
        return 2 if self.stateful else 1


def _assigned(program: Program) -> int:
    return sum(bool(re.match(r"v\d+ = ", line)) for line in program.lines)


def _names(program: Program, count: int) -> list[str]:
    names = ["x", "y"]
    if program.buffers:
        names.append("self.b")
    if program.buffers == "view":
        names.append("self.bv")
    return names + [f"v{i}" for i in range(count)]


_WRITING_DUNDERS = frozenset(
    {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__"}
)


class _ReadSourcesFirst(torch.overrides.TorchFunctionMode):
    """Clones what an in-place operation reads before it writes: the program's result
    must not depend on it, or it depends on memory overlaps torch does not always
    detect (``v[1:] = v[:-1]`` on a non-contiguous ``v``), which is undefined."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (name.endswith("_") and not name.startswith("_")) or name in _WRITING_DUNDERS:

            def clone(t):
                return t.clone() if isinstance(t, torch.Tensor) else t

            args = (args[0], *torch.utils._pytree.tree_map(clone, tuple(args[1:])))
            kwargs = torch.utils._pytree.tree_map(clone, kwargs)
        return func(*args, **kwargs)


def _runs(program: Program, module: torch.nn.Module, rows: int) -> list:
    run = copy.deepcopy(module)
    return [program.run_eager(run, rows) for _ in range(program.calls())]


def _same_runs(a: list, b: list) -> bool:
    flat_a, flat_b = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    return len(flat_a) == len(flat_b) and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(flat_a, flat_b)
    )


def _valid(program: Program) -> bool:
    """Eager runs the program at every size (twice for stateful ones), and its result does
    not depend on the order in which an in-place operation reads and writes."""
    try:
        module = program.build()
        for rows in SIZES:
            runs = _runs(program, module, rows)
            with _ReadSourcesFirst():
                reference = _runs(program, module, rows)
            if not _same_runs(runs, reference):
                return False
    except Exception:
        return False
    return True


def _candidate(rng: random.Random, program: Program, variables: list[str]) -> str:
    templates = rng.choices([k for k, _ in _KINDS], weights=[w for _, w in _KINDS])[0]
    template = rng.choice(templates)
    v, w = rng.choice(variables), rng.choice(variables)
    text = template.format(v=v, w=w, i=rng.choice((0, 1, 1, 2)))
    if templates in (_VIEWS, _TUPLE_VIEWS, _FRESH, _CREATED):
        return f"v{len(variables) - len(_names(program, 0))} = {text}"
    if ("+=" in text or "*=" in text) and text.startswith("self."):
        # augmented assignment rebinds a name: only on local variables and inputs
        return ""
    return text


def generate(seed: int, max_lines: int = 8) -> Program:
    """Generates a valid random program from a seed."""
    rng = random.Random(seed)
    program = Program(
        seed,
        buffers=rng.choice(("", "", "plain", "view")),
        aliased=rng.choice(("",) * 9 + ("x[1]", "x[-1]", "x[0]")),
        annotated=rng.random() < 0.8,
    )
    program.outputs = ["x * 1"]
    target = rng.randint(2, max_lines)
    attempts = 0
    while len(program.lines) < target and attempts < 60:
        attempts += 1
        variables = _names(program, _assigned(program))
        line = _candidate(rng, program, variables)
        if not line:
            continue
        program.lines.append(line)
        if not _valid(program):
            program.lines.pop()
    variables = _names(program, _assigned(program))
    chosen = rng.sample(variables, k=min(len(variables), rng.randint(1, 3)))
    program.outputs = [name if rng.random() < 0.5 else f"{name} * 1" for name in chosen]
    if not _valid(program):
        program.outputs = [f"{name} * 1" for name in chosen]
    if not _valid(program):
        # the lines were valid returning x: a chosen value is not (an overlapping
        # copy, v[1:] = v[:-1], whose result depends on the kernel's order)
        program.outputs = ["x * 1"]
    if not _valid(program):
        raise AssertionError(f"program {seed} is not valid:\n{program.source()}")
    return program
