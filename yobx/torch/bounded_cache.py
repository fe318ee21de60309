"""A dict kept for the whole process that empties itself when it is full."""

from __future__ import annotations

from typing import Any

__all__ = ["BoundedCache"]


class BoundedCache(dict):
    """A process-wide cache: a dict emptied when it holds ``limit`` entries and a new
    one is added.

    The tracer keeps a few answers for the process (proofs of claims on dimensions,
    results of operations on symbolic sizes, the outputs of functions it has run, the
    call sites that iterate), keyed by what repeats between the traces of a model and
    between its layers. In a long process tracing many models the keys stop repeating:
    the cache must not grow without bound. Emptying it at once (rather than evicting
    the oldest entries one by one) costs the next traces a recomputation of what they
    ask again, never a wrong answer.

    :param limit: the most entries the cache holds
    """

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: Any, value: Any) -> None:
        if key not in self and len(self) >= self.limit:
            self.clear()
        super().__setitem__(key, value)
