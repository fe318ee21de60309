"""What the idioms of the random programs see of the program being built.

An idiom (registered in :data:`IDIOMS` with :func:`idiom`) is a function of a
:class:`ProgramBuilder` returning the lines of one statement and the names of the tensors
it defines, or None when no tensor of the program suits it. The generator runs the lines
in eager at every size set and drops those that fail, so an idiom may propose lines that
only work for some shapes.
"""

from __future__ import annotations

import random
from collections.abc import Callable


class ProgramBuilder:
    """What idioms see of the program being built: its tensors and their shapes.

    :param rng: the program's random generator
    :param envs: one namespace per size set (the example first) holding the values of
        the variables defined so far
    :param inputs: the names of the inputs
    """

    def __init__(self, rng: random.Random, envs: list[dict], inputs: list[str]):
        self.rng = rng
        self.envs = envs
        self.inputs = list(inputs)
        self.tensors = list(inputs)
        self._count = 0

    def new(self, prefix: str = "t") -> str:
        """A fresh variable name."""
        self._count += 1
        return f"{prefix}{self._count}"

    def rank(self, v: str) -> int:
        return self.envs[0][v].dim()

    def sizes(self, v: str, axis: int) -> list[int]:
        """The size of ``v`` along ``axis`` at every size set."""
        return [env[v].shape[axis] for env in self.envs]

    def is_dynamic(self, v: str, axis: int) -> bool:
        return len(set(self.sizes(v, axis))) > 1

    def pick(self, min_rank: int = 1, max_rank: int = 5, dynamic: bool = False) -> str | None:
        """A tensor of the program (recent ones more often), or None if none suits."""
        suitable = [v for v in self.tensors if min_rank <= self.rank(v) <= max_rank]
        if dynamic:
            suitable = [v for v in suitable if any(self.dynamic_axes(v))]
        if not suitable:
            return None
        weights = [1 + i for i in range(len(suitable))]
        return self.rng.choices(suitable, weights=weights)[0]

    def other(self, v: str) -> str | None:
        """Another tensor than ``v``, if any."""
        others = [w for w in self.tensors if w != v]
        return self.rng.choice(others) if others else None

    def dynamic_axes(self, v: str) -> list[int]:
        return [a for a in range(self.rank(v)) if self.is_dynamic(v, a)]

    def axis(self, v: str, dynamic: float = 0.85) -> int:
        """An axis of ``v``, dynamic with probability ``dynamic`` when it has one."""
        dyn = self.dynamic_axes(v)
        if dyn and self.rng.random() < dynamic:
            return self.rng.choice(dyn)
        return self.rng.randrange(self.rank(v))

    def index(self, v: str, axis: int, item: str, rank: int | None = None) -> str:
        """``v[:, :, item]`` with ``item`` at ``axis`` (``v[..., item]`` for the last one)."""
        if axis == (self.rank(v) if rank is None else rank) - 1 and axis > 0:
            return f"{v}[..., {item}]"
        return f"{v}[{':, ' * axis}{item}]"


Made = tuple[list[str], list[str]] | None
#: idiom name -> (function, weight)
IDIOMS: dict[str, tuple[Callable[[ProgramBuilder], Made], float]] = {}


def idiom(weight: float = 1.0):
    def register(fn):
        IDIOMS[fn.__name__] = (fn, weight)
        return fn

    return register


def single(b: ProgramBuilder, expression: str) -> Made:
    t = b.new()
    return [f"{t} = {expression}"], [t]
