"""Custom operators defined the first time they are asked for in a process.

Defining a custom operator makes torch look up its caller's source, and the first
lookup of a process walks every module loaded: 0.1 s of the first export of a decoder,
which needs none of yobx's operators. :class:`LazyOperators` defines a group of them
when first asked, once, under a lock (two threads exporting at once would define them
twice, which torch refuses).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class LazyOperators:
    """The operators ``names`` that ``define`` defines and returns by name, defined on
    the first call."""

    def __init__(self, names: tuple[str, ...], define: Callable[[], dict[str, Any]]) -> None:
        self.names = names
        self._define = define
        self._lock = threading.Lock()
        self._operators: dict[str, Any] | None = None

    def __call__(self) -> dict[str, Any]:
        """The operators, by name, defined now if they were not."""
        with self._lock:
            if self._operators is None:
                self._operators = self._define()
            return self._operators

    def defined(self) -> bool:
        """Whether the operators were defined in this process."""
        return self._operators is not None

    def attribute(self, module: str, name: str) -> Any:
        """What the ``__getattr__`` of ``module`` returns for ``name``: one of the
        operators (defined when first read)."""
        if name not in self.names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return self()[name]
