"""Validation of the runtime checks: each check of an exported model must fire.

An exported model checks its constraints on its inputs' sizes
(:mod:`yobx.torch.onnx.runtime_checks`). A check that never ran on a broken input is
not known to work: for every check, validation looks for input sizes that break it
while keeping every check before it in the chain (so that it is the one reported), runs
onnxruntime on inputs of those sizes and expects an error naming the check.

The sizes are found by a search from the example's sizes, each candidate evaluated with
the checks compiled into Python (thousands of candidates cost milliseconds):

1. one dimension moved (every input axis it gives its size to follows, so the inputs
   stay consistent with one another): first to values the condition's constants
   suggest (``seq <= 16`` breaks at 17, ``(h//8) * (w//8) != 16`` at multiples of 8 and
   16), to small sizes and around the example's size, then every size up to a bound;
2. one input axis moved alone (inputs sharing a dimension that disagree, a relation
   between dimensions broken), the same way;
3. two dimensions moved together (``h * w != 1``, ``k == max(0, m - 4)`` kept while
   ``m - 4 != 1`` breaks): the suggested values of one, every size up to a bound of
   the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import sympy
import torch

from yobx.torch.onnx.runtime_checks import ModelCheck
from yobx.torch.onnx.sizes import free_symbols
from yobx.torch.tracing.constraints.size_search import (
    compile_condition,
    constants_of,
    moves,
    scanned_sizes,
)

#: candidates evaluated at most for one check
_BUDGET = 60_000
#: candidates evaluated at most for one check once sizes breaking it were found where
#: an earlier check fails first: most such checks are implied by the ones before them
#: (a version's ``seq != 1`` after the checks routing ``seq == 1`` to another version)
#: and are never the first; the whole budget spent on each of them took 30 of the 39 s
#: of a Llama decode step's validation
_BUDGET_ONCE_COVERED = 3_000

#: ``(input index, axis)``: one size of one input (axis None: an int input's value)
IndexKey = tuple[int, "int | None"]


class ViolationSearch:
    """Finds, for each check, input sizes where it is the first check to fail.

    :param checks: the model's checks, in the order they run
    :param placeholder_values: the fake values of the captured graph's inputs
    :param leaves: the name of each input leaf (placeholder target), in order
    :param shape_env: the capture's ShapeEnv
    :param example: the example's sizes, ``(input index, axis) -> size``
    """

    def __init__(
        self,
        checks: Sequence[ModelCheck],
        placeholder_values: Sequence[Any],
        leaves: Sequence[str],
        shape_env: Any,
        example: Mapping[IndexKey, int],
    ):
        self.checks = list(checks)
        self.index = {leaf: i for i, leaf in enumerate(leaves)}
        self.leaves = list(leaves)
        self.example = dict(example)
        self.symbols = free_symbols(placeholder_values, shape_env)
        hints = getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val
        self.base = {s: int(hints[s]) for s in self.symbols if s in hints}
        # every dynamic size as a compiled function of the independent dimensions
        self.sizes: list[tuple[IndexKey, Callable, list[sympy.Symbol]]] = []
        for index, fake in enumerate(placeholder_values):
            dims = fake.shape if isinstance(fake, torch.Tensor) else [fake]
            for axis, dim in enumerate(dims):
                if not isinstance(dim, torch.SymInt):
                    continue
                expr = shape_env.replace(dim.node.expr)
                symbols = sorted(expr.free_symbols, key=lambda s: s.name)
                key = (index, axis if isinstance(fake, torch.Tensor) else None)
                self.sizes.append((key, compile_condition(expr, symbols), symbols))

    def by_name(self, sizes: Mapping[IndexKey, int]) -> dict[tuple[str, int | None], int]:
        """The sizes keyed as the checks read them: ``(input leaf, axis)``."""
        return {(self.leaves[i], axis): v for (i, axis), v in sizes.items()}

    def first_failing(self, sizes: Mapping[IndexKey, int], last: int | None = None) -> int | None:
        """The position of the first check (up to ``last``) these sizes break."""
        named = self.by_name(sizes)
        if any(v < 0 for v in named.values()):
            return None
        for position, check in enumerate(self.checks[: None if last is None else last + 1]):
            if any(key not in named for key in check.read_keys):
                return None
            if not check.holds(named):
                return position
        return None

    def find(self, position: int) -> tuple[dict, dict, int] | None:
        """Sizes breaking check ``position``: ``(sizes, moved, first)``, with what was
        moved from the example (``{symbol: size}`` or ``{(input index, axis): size}``)
        and the position of the first check they break.

        Sizes where the check is the first to fail come first (``first == position``).
        Some checks are never the first: the checks before them imply them (a
        dimension's bound after a product of its floor divisions was found nonzero),
        and inputs breaking them are refused by an earlier check; such sizes are
        returned when the search finds no other. None when it finds no sizes breaking
        the check within its budget.
        """
        check = self.checks[position]
        covered, left = None, _BUDGET
        for sizes, moved in self._candidates(check):
            left -= 1
            if left < 0:
                break
            if sizes is None:
                continue
            first = self.first_failing(sizes, position)
            if first == position:
                return sizes, moved, first
            if covered is None and first is not None and not check.holds(self.by_name(sizes)):
                covered = (sizes, moved, first)
                left = min(left, _BUDGET_ONCE_COVERED)
        return covered

    def _candidates(self, check: ModelCheck) -> Iterator[tuple[dict | None, dict]]:
        constants = constants_of(check.condition)
        focus = self._dimensions(check)
        for symbol in focus:
            for value in scanned_sizes(self.base[symbol], constants):
                yield self._assigned({symbol: value}), {symbol: value}
        for leaf, axis in check.reads():
            index = self.index.get(leaf)
            if index is None or (index, axis) not in self.example:
                continue
            for value in scanned_sizes(self.example[index, axis], constants):
                sizes = dict(self.example)
                sizes[index, axis] = value
                yield sizes, {(index, axis): value}
        # then pairs of dimensions (the single moves were tried first)
        for changes in moves(self.base, focus, constants):
            if len(changes) == 2:
                yield self._assigned(changes), changes

    def _dimensions(self, check: ModelCheck) -> list[sympy.Symbol]:
        """The independent dimensions the sizes a check reads depend on."""
        read = {(self.index.get(leaf), axis) for leaf, axis in check.reads()}
        found: list[sympy.Symbol] = []
        for key, _, symbols in self.sizes:
            if key in read:
                found += [s for s in symbols if s in self.base and s not in found]
        return found

    def _assigned(self, changes: Mapping[sympy.Symbol, int]) -> dict | None:
        """The example's sizes with the dimensions ``changes`` moves (None when a size
        cannot be computed)."""
        assignment = dict(self.base)
        assignment.update(changes)
        sizes = dict(self.example)
        try:
            for key, function, symbols in self.sizes:
                sizes[key] = int(function(*(assignment[s] for s in symbols)))
        except (ZeroDivisionError, KeyError, ValueError):
            return None
        return sizes


def describe_moves(
    moved: Mapping[Any, int], dimension_names: Mapping[str, str], onnx_names: Sequence[str]
) -> str:
    """What :meth:`ViolationSearch.find` moved: ``seq=17``, ``mask.size(1)=9``."""
    parts = []
    for key, value in moved.items():
        if isinstance(key, sympy.Symbol):
            parts.append(f"{dimension_names.get(key.name, key.name)}={value}")
            continue
        index, axis = key
        name = onnx_names[index] if index < len(onnx_names) else f"input {index}"
        parts.append(f"{name}={value}" if axis is None else f"{name}.size({axis})={value}")
    return ", ".join(parts)


def check_fires(run: Callable[[], Any], check: ModelCheck) -> tuple[bool, str | None]:
    """Runs onnxruntime (``run``) on inputs breaking ``check``.

    :return: ``(True, None)`` when it failed naming the check, ``(False, why)``
        otherwise (it returned values, or failed for another reason)
    """
    try:
        run()
    except Exception as exc:
        message = str(exc)
        if check.name in message:
            return True, None
        first = message.strip().splitlines()[0][:300] if message.strip() else type(exc).__name__
        return False, f"onnxruntime failed without naming the check: {first}"
    return False, "onnxruntime returned values for inputs the model does not accept"


__all__ = ["ViolationSearch", "check_fires", "describe_moves"]
