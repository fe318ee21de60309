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

import torch


class LazyOperators:
    """Custom operators without mutated arguments, defined on the first call.

    :param specs: by name, ``(qualified name, function, fake function)``: the operator
        ``torch.library.custom_op(qualified name)(function)`` whose fake kernel is the
        fake function
    """

    def __init__(self, specs: dict[str, tuple[str, Callable, Callable]]) -> None:
        self.names = tuple(specs)
        self._specs = specs
        self._lock = threading.Lock()
        self._operators: dict[str, Any] | None = None

    def __call__(self) -> dict[str, Any]:
        """The operators, by name, defined now if they were not."""
        with self._lock:
            if self._operators is None:
                operators = {}
                for name, (qualified, function, fake) in self._specs.items():
                    operators[name] = torch.library.custom_op(qualified, mutates_args=())(function)
                    operators[name].register_fake(fake)
                self._operators = operators
            return self._operators

    def defined(self) -> bool:
        """Whether the operators were defined in this process."""
        return self._operators is not None

    def module_getattr(self, module: str) -> Callable[[str], Any]:
        """The ``__getattr__`` of ``module`` (PEP 562) giving these operators by name,
        defined when first read."""

        def attribute(name: str) -> Any:
            if name not in self.names:
                raise AttributeError(f"module {module!r} has no attribute {name!r}")
            return self()[name]

        return attribute
