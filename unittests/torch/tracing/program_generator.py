"""Random PyTorch programs made of shape-dependent idioms, for differential tests of the tracer.

``generate_program(seed)`` builds a ``torch.nn.Module`` whose ``forward`` chains 2-8
statements drawn from :data:`program_builder.IDIOMS` over 1-3 inputs of rank 1-4 whose
dynamic dimensions have string names, some shared between inputs. Each candidate
statement runs in eager at the example sizes and at every other size while the program
is built and is dropped if it fails at one of them, so a program runs in eager at every
size the harness uses (a dimension that must stay even, for a reshape into halves, takes
only even sizes: the traced graph may need that fact as a constraint). The source is
written to a file so that tracebacks, ``inspect`` and the tracer's ``file:line`` messages
show the generated lines.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import math
import os
import random
import re
import shutil
import sys
import tempfile
import types
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import program_idioms_shapes, program_idioms_values  # noqa: F401 (they register idioms)
from .program_builder import IDIOMS, ProgramBuilder

#: names given to dynamic dimensions
DIM_NAMES = ("batch", "seq", "dim", "length", "width", "heads")
#: the buffer every generated module holds (the position-table pattern: ``table[:seq]``)
TABLE_SIZE = 32
#: statement count of a program
MIN_STATEMENTS, MAX_STATEMENTS = 2, 8
#: tries per program before giving up on reaching the statement count
MAX_TRIES = 60

_HEADER = """\
import math

import torch
import torch.nn.functional as F


class GeneratedModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.linspace(-1.0, 1.0, {table}))

    def forward(self, {args}):
"""


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One input of a program: its name and, per axis, a dimension name or a static size."""

    name: str
    axes: tuple[str | int, ...]


@dataclasses.dataclass(frozen=True)
class Statement:
    """Lines of ``forward`` made by one idiom, and the tensors they define."""

    lines: tuple[str, ...]
    outputs: tuple[str, ...]
    idiom: str


@dataclasses.dataclass(frozen=True)
class Program:
    """A generated module, its inputs and the sizes to run it at.

    :param seed: the seed it was generated from
    :param inputs: the inputs of ``forward``
    :param statements: the body of ``forward``
    :param returned: the expressions ``forward`` returns
    :param example_dims: the value of every dimension name in the example inputs
    :param other_dims: other values of the dimension names, one dict per size set
    """

    seed: int
    inputs: tuple[InputSpec, ...]
    statements: tuple[Statement, ...]
    returned: tuple[str, ...]
    example_dims: dict[str, int]
    other_dims: tuple[dict[str, int], ...]

    @functools.cached_property
    def source(self) -> str:
        """The Python source of the module (class ``GeneratedModule``)."""
        args = ", ".join(spec.name for spec in self.inputs)
        body = [f"        {line}" for s in self.statements for line in s.lines]
        returned = ", ".join(self.returned) + ("," if len(self.returned) == 1 else "")
        if len(self.returned) == 1 and self.returned[0].isidentifier():
            returned = self.returned[0]
        text = _HEADER.format(table=TABLE_SIZE, args=args)
        return text + "\n".join([*body, f"        return {returned}"]) + "\n"

    @functools.cached_property
    def line_idioms(self) -> dict[int, str]:
        """Maps each line number of :attr:`source` in ``forward`` to its idiom."""
        line = _HEADER.count("\n") + 1
        mapping = {}
        for statement in self.statements:
            for _ in statement.lines:
                mapping[line] = statement.idiom
                line += 1
        mapping[line] = "return"
        return mapping

    @functools.cached_property
    def filename(self) -> str:
        """The file holding :attr:`source` (written on first use)."""
        digest = hashlib.blake2b(self.source.encode(), digest_size=6).hexdigest()
        path = os.path.join(_program_dir(), f"program_{self.seed}_{digest}.py")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(self.source)
        return path

    @functools.cached_property
    def module_class(self) -> type[torch.nn.Module]:
        """The class defined by :attr:`source`, compiled from :attr:`filename`."""
        # a registered module with a __file__, so that inspect.getsource finds the class
        name = os.path.splitext(os.path.basename(self.filename))[0]
        module = sys.modules.get(name)
        if module is None:
            module = types.ModuleType(name)
            module.__file__ = self.filename
            exec(compile(self.source, self.filename, "exec"), module.__dict__)
            sys.modules[name] = module
        return module.GeneratedModule

    def module(self) -> torch.nn.Module:
        """A new instance of the generated module."""
        return self.module_class()

    @property
    def dynamic_shapes(self) -> dict[str, dict[int, str] | None]:
        """torch.export's format with string dimension names."""
        shapes = {}
        for spec in self.inputs:
            axes = {i: a for i, a in enumerate(spec.axes) if isinstance(a, str)}
            shapes[spec.name] = axes or None
        return shapes

    @property
    def size_sets(self) -> tuple[dict[str, int], ...]:
        """The example's dimension values first, then the others."""
        return (self.example_dims, *self.other_dims)

    def make_inputs(self, dims: dict[str, int]) -> dict[str, torch.Tensor]:
        """Inputs with the dimension values ``dims`` (deterministic for a program)."""
        generator = torch.Generator().manual_seed(self.seed)
        inputs = {}
        for spec in self.inputs:
            shape = [dims[a] if isinstance(a, str) else a for a in spec.axes]
            inputs[spec.name] = torch.randn(*shape, generator=generator)
        return inputs

    def example_inputs(self) -> dict[str, torch.Tensor]:
        """The example inputs."""
        return self.make_inputs(self.example_dims)

    def with_statements(self, statements, returned) -> Program:
        """The same program with another body (used to shrink reproducers)."""
        return dataclasses.replace(self, statements=tuple(statements), returned=tuple(returned))

    def describe(self) -> str:
        """The source with the dynamic shapes and the sizes it runs at."""
        sizes = "; ".join(str(d) for d in self.size_sets)
        return (
            f"# seed={self.seed} dynamic_shapes={self.dynamic_shapes}\n# sizes: {sizes}\n"
            f"{self.source}"
        )


def generate_program(seed: int, other_sizes: int = 2) -> Program:
    """Builds the program of ``seed``: the same seed always gives the same program.

    :param seed: the random seed
    :param other_sizes: how many size sets besides the example the program must run at
    """
    rng = random.Random(seed)
    inputs = _random_inputs(rng)
    names = sorted({a for spec in inputs for a in spec.axes if isinstance(a, str)})
    size_sets = _random_sizes(rng, names, other_sizes)
    program = Program(seed, inputs, (), (), size_sets[0], tuple(size_sets[1:]))
    envs = [_initial_env(program, dims) for dims in program.size_sets]
    builder = ProgramBuilder(rng, envs, [spec.name for spec in inputs])
    target = rng.randint(MIN_STATEMENTS, MAX_STATEMENTS)
    statements: list[Statement] = []
    for _ in range(MAX_TRIES):
        if len(statements) >= target:
            break
        idiom = rng.choices(list(IDIOMS), weights=[w for _, w in IDIOMS.values()])[0]
        made = IDIOMS[idiom][0](builder)
        if made is None:
            continue
        lines, outputs = made
        statement = Statement(tuple(lines), tuple(outputs), idiom)
        if _accept(builder, statement, program, statements):
            statements.append(statement)
    returned = _choose_returned(rng, builder, statements)
    return program.with_statements(statements, returned)


def _random_inputs(rng: random.Random) -> tuple[InputSpec, ...]:
    used: list[str] = []
    specs = []
    for name in ("x", "y", "z")[: rng.choice((1, 1, 2, 2, 2, 3))]:
        axes: list[str | int] = []
        for _ in range(rng.choice((1, 2, 2, 3, 3, 3, 4))):
            if rng.random() < 0.3:
                axes.append(rng.randint(2, 5))
            elif used and (rng.random() < 0.45 or len(used) == len(DIM_NAMES)):
                axes.append(rng.choice(used))
            else:
                fresh = [n for n in DIM_NAMES if n not in used]
                axes.append(rng.choice(fresh))
                used.append(axes[-1])
        specs.append(InputSpec(name, tuple(axes)))
    if not used:
        # at least one dynamic dimension: the first axis of the first input
        specs[0] = InputSpec(specs[0].name, ("batch", *specs[0].axes[1:]))
    return tuple(specs)


def _random_sizes(rng: random.Random, names: list[str], others: int) -> list[dict[str, int]]:
    """Distinct values per dimension; some dimensions take only even values."""
    sets: list[dict[str, int]] = [{} for _ in range(others + 1)]
    high = 17 if others <= 2 else 17 + 2 * others
    for name in names:
        if rng.random() < 0.35:
            example, pool = rng.choice((4, 6, 8)), range(2, high, 2)
        else:
            example, pool = rng.randint(3, 8), range(2, high)
        values = [example, *rng.sample([v for v in pool if v != example], others)]
        for dims, value in zip(sets, values):
            dims[name] = value
    return sets


def _initial_env(program: Program, dims: dict[str, int]) -> dict:
    table = torch.linspace(-1.0, 1.0, TABLE_SIZE)
    return {
        "torch": torch,
        "F": F,
        "math": math,
        "self": types.SimpleNamespace(table=table),
        **program.make_inputs(dims),
    }


def _accept(builder: ProgramBuilder, statement: Statement, program: Program, done) -> bool:
    """Runs the statement at every size set; keeps it only if it runs and stays small."""
    code = compile("\n".join(statement.lines), "<candidate>", "exec")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for env in builder.envs:
                exec(code, env)
                for name in statement.outputs:
                    if not _usable(env[name]):
                        raise ValueError(name)
            for name in statement.outputs:
                if builder.envs[0][name].numel() == 0:
                    raise ValueError(name)
    except Exception:
        # a failed candidate may have left partial results: rebuild from the kept lines
        builder.envs = [_initial_env(program, dims) for dims in program.size_sets]
        kept = compile("\n".join(line for s in done for line in s.lines), "<kept>", "exec")
        for env in builder.envs:
            exec(kept, env)
        return False
    # a tensor whose rank depends on the sizes (a squeeze of an axis of size 1 at one
    # size set) stays in the program, but no later idiom builds on it: the builder
    # reasons on one rank per tensor (seed 13256)
    builder.tensors.extend(
        name for name in statement.outputs if len({env[name].dim() for env in builder.envs}) == 1
    )
    return True


def _usable(value) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.dtype == torch.float32
        and 1 <= value.dim() <= 5
        and value.numel() <= 4096
    )


def _choose_returned(rng: random.Random, builder: ProgramBuilder, statements) -> list[str]:
    made = [name for s in statements for name in s.outputs]
    if not made:
        return [f"{builder.inputs[0]} * 2"]
    returned = [made[-1]]
    for name in rng.sample(made[:-1], min(len(made) - 1, rng.choice((0, 1, 2)))):
        returned.append(name)
    if rng.random() < 0.15:
        # a Python int computed from dimensions is an output too
        v = rng.choice(made)
        returned.append(f"{v}.shape[-1] * 2 + {v}.shape[0]")
    return returned


@functools.cache
def _program_dir() -> str:
    path = tempfile.mkdtemp(prefix="yobx_fuzz_")
    atexit.register(shutil.rmtree, path, True)
    return path


def shrink_program(program: Program, keeps: Callable[[Program], bool]) -> Program:
    """The smallest variant of ``program`` found for which ``keeps`` stays true.

    Drops statements, returned values and unused inputs one at a time while ``keeps``
    (for example "refused in the same category") holds for the smaller program.
    """
    changed = True
    while changed:
        changed = False
        for candidate in _smaller_variants(program):
            if keeps(candidate):
                program, changed = candidate, True
                break
    return program


def _smaller_variants(program: Program):
    statements, returned = list(program.statements), list(program.returned)
    for i in reversed(range(len(statements))):
        if len(statements) > 1:
            kept = statements[:i] + statements[i + 1 :]
            yield program.with_statements(kept, _returnable(program, kept, returned))
    for i in range(1, len(returned)):
        yield program.with_statements(statements, returned[:i] + returned[i + 1 :])
    used = set(re.findall(r"[A-Za-z_]\w*", program.source.split("def forward")[1].split(":", 1)[1]))
    if len(program.inputs) > 1:
        for spec in program.inputs:
            if spec.name not in used:
                inputs = tuple(s for s in program.inputs if s is not spec)
                names = {a for s in inputs for a in s.axes if isinstance(a, str)}
                yield dataclasses.replace(
                    program,
                    inputs=inputs,
                    example_dims={k: v for k, v in program.example_dims.items() if k in names},
                    other_dims=tuple(
                        {k: v for k, v in d.items() if k in names} for d in program.other_dims
                    ),
                )


def _returnable(program: Program, statements, returned) -> list[str]:
    """The returned expressions that only use variables the statements still define."""
    defined = {s.name for s in program.inputs} | {o for s in statements for o in s.outputs}
    kept = [r for r in returned if set(re.findall(r"\b[a-z]+\d+\b", r)) <= defined]
    return kept or list(statements[-1].outputs or [f"{program.inputs[0].name} * 2"])
