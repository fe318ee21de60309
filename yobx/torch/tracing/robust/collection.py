"""GraphCollection: the graphs and per-module statuses produced by robust tracing.

:func:`yobx.torch.tracing.recursive_trace` fills one collection: the graph of
the root, a graph for the traceable part of every module that failed, and one status
per module (``traced``, ``inlined``, ``leaf``, ``failed``, ``unvisited``,
``container``) with the failure message and the user's ``file:line`` that raised.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import torch

#: statuses a module can have in a :class:`GraphCollection`
STATUSES = ("traced", "inlined", "leaf", "failed", "unvisited", "container")


@dataclasses.dataclass
class ModuleFailure:
    """Why tracing into a module failed.

    :param path: qualified name of the module in the model (``""`` for the root)
    :param type_name: class name of the module
    :param error_type: class name of the exception
    :param message: the exception's message
    :param location: the user's ``file:line`` that raised (``""`` when unknown)
    """

    path: str
    type_name: str
    error_type: str
    message: str
    location: str = ""

    def __str__(self) -> str:
        return f"{self.error_type}: {self.message}"

    @property
    def first_line(self) -> str:
        """First line of :meth:`__str__` without the location prefix, for tables."""
        message = self.message.strip()
        if self.location and message.startswith(self.location + ":"):
            message = message[len(self.location) + 1 :].strip()
        text = f"{self.error_type}: {message}"
        return text.splitlines()[0]


@dataclasses.dataclass
class ModuleEntry:
    """What robust tracing knows about one module of the model.

    :param path: qualified name in the model (``""`` for the root)
    :param module: the module
    :param status: one of :data:`STATUSES`: ``traced`` (has its own graph, the root
        or a module traced on its own), ``inlined`` (its code is part of an
        enclosing graph), ``leaf`` (a ``call_module`` node: torch.nn module or
        registered leaf), ``failed`` (tracing into it failed: it is a ``call_module``
        node of the enclosing graph, and may have a graph of its own), ``unvisited``
        (never called by the traced code), ``container`` (``ModuleList`` /
        ``ModuleDict``: no forward of its own, one of its children was called)
    :param failure: why it failed, when it did
    :param graph: its own graph, when it has one
    :param traced_model: the module to run ``graph`` with
        (``torch.fx.GraphModule(traced_model, graph)``)
    :param inputs: ``(args, kwargs)`` it received during the eager run (first call)
    :param guards: assumptions ``graph`` relies on (see :class:`~yobx.torch.tracing.Guard`)
    :param opaque: ``graph`` only calls the module as a whole (the root could not be
        traced into, or is a registered leaf)
    """

    path: str
    module: torch.nn.Module
    status: str
    failure: ModuleFailure | None = None
    graph: torch.fx.Graph | None = None
    traced_model: torch.nn.Module | None = None
    inputs: tuple[tuple, dict] | None = None
    guards: list = dataclasses.field(default_factory=list)
    opaque: bool = False

    @property
    def type_name(self) -> str:
        """Class name of the module."""
        return type(self.module).__name__


class GraphCollection:
    """Graphs of a model and of its failing submodules, with a status per module.

    Iterating yields the modules that have a graph (the root first);
    ``collection[module]`` (or ``collection["path.to.module"]``) returns its graph.
    ``str(collection)`` is a readable report: counts per status, then a table with
    the module path, type, status, graph size, the user's ``file:line`` that raised
    and the failure message.

    :param model: the model the collection describes
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._entries: dict[torch.nn.Module, ModuleEntry] = {}
        self._order = {m: i for i, (_, m) in enumerate(model.named_modules())}

    # filling (used by recursive_trace)

    def set_entry(self, entry: ModuleEntry) -> ModuleEntry:
        """Adds or replaces the entry of ``entry.module``."""
        self._entries[entry.module] = entry
        return entry

    def entry(self, module: torch.nn.Module | str) -> ModuleEntry:
        """The entry of a module (or of its qualified name).

        :raises KeyError: when the module is not part of the collection
        """
        if isinstance(module, str):
            for entry in self._entries.values():
                if entry.path == module:
                    return entry
            raise KeyError(f"no module with path {module!r} in the collection")
        if module not in self._entries:
            raise KeyError(
                f"module {type(module).__name__} is not part of the collection "
                f"(it is not a submodule of the model, or it sits inside a leaf)"
            )
        return self._entries[module]

    def get_entry(self, module: torch.nn.Module | str) -> ModuleEntry | None:
        """Same as :meth:`entry` but returns None for unknown modules."""
        try:
            return self.entry(module)
        except KeyError:
            return None

    # graphs

    def __iter__(self) -> Iterator[torch.nn.Module]:
        return iter([e.module for e in self.entries() if e.graph is not None])

    def __len__(self) -> int:
        return sum(1 for e in self._entries.values() if e.graph is not None)

    def __contains__(self, module: Any) -> bool:
        entry = self.get_entry(module) if isinstance(module, (torch.nn.Module, str)) else None
        return entry is not None and entry.graph is not None

    def __getitem__(self, module: torch.nn.Module | str) -> torch.fx.Graph:
        entry = self.entry(module)
        if entry.graph is None:
            raise KeyError(f"module {entry.path or '<root>'!r} has no graph ({entry.status})")
        return entry.graph

    def graph_module(self, module: torch.nn.Module | str) -> torch.fx.GraphModule:
        """``torch.fx.GraphModule`` running the graph of ``module``.

        :raises KeyError: the module is not in the collection or has no graph
        """
        entry = self.entry(module)
        graph = self[module]
        # set with the graph, by the trace of the module
        assert entry.traced_model is not None
        return torch.fx.GraphModule(entry.traced_model, graph)

    def inputs(self, module: torch.nn.Module | str) -> tuple[tuple, dict] | None:
        """``(args, kwargs)`` the module received in the eager run (first call), None
        when it was not called.

        :raises KeyError: the module is not part of the collection
        """
        return self.entry(module).inputs

    # statuses

    def status(self, module: torch.nn.Module | str) -> str | None:
        """Status of a module (see :class:`ModuleEntry`), None when unknown."""
        entry = self.get_entry(module)
        return None if entry is None else entry.status

    def is_failed(self, module: torch.nn.Module | str) -> bool:
        """Whether tracing into ``module`` failed."""
        return self.status(module) == "failed"

    def failure_msg(self, module: torch.nn.Module | str) -> str | None:
        """The failure message of ``module`` (``"TraceError: file:line: ..."``) or None."""
        entry = self.get_entry(module)
        return None if entry is None or entry.failure is None else str(entry.failure)

    def failure_location(self, module: torch.nn.Module | str) -> str | None:
        """The user's ``file:line`` that made ``module`` fail, or None."""
        entry = self.get_entry(module)
        return None if entry is None or entry.failure is None else entry.failure.location

    def is_unvisited(self, module: torch.nn.Module | str) -> bool:
        """Whether ``module`` was never called by the traced code."""
        return self.status(module) == "unvisited"

    def entries(self) -> list[ModuleEntry]:
        """All entries in the order of ``model.named_modules()``."""
        return sorted(self._entries.values(), key=lambda e: self._order.get(e.module, 1 << 30))

    def modules_with_status(self, status: str) -> list[torch.nn.Module]:
        """Modules having ``status``, in model order."""
        return [e.module for e in self.entries() if e.status == status]

    # report

    def rows(self) -> list[dict[str, str]]:
        """One dict per module: path, type, status, graph, location, failure."""
        rows = []
        for e in self.entries():
            rows.append(
                {
                    "path": e.path or "<root>",
                    "type": e.type_name,
                    "status": e.status,
                    "graph": _graph_text(e),
                    "location": "" if e.failure is None else e.failure.location,
                    "failure": "" if e.failure is None else e.failure.first_line,
                }
            )
        return rows

    def summary(self) -> str:
        """One line: the model's class, the number of modules per status and of graphs."""
        counts = {s: 0 for s in STATUSES}
        for e in self._entries.values():
            counts[e.status] += 1
        parts = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])
        return (
            f"{type(self.model).__name__}: {len(self._entries)} modules ({parts}), "
            f"{len(self)} graph{'s' if len(self) != 1 else ''}"
        )

    def report(self, max_failure_width: int = 100) -> str:
        """Summary line followed by the table of :meth:`rows`.

        Locations are written relative to the working directory when below it.

        :param max_failure_width: failure messages are cut to this many characters
        """
        rows = self.rows()
        for row in rows:
            row["location"] = _short_location(row["location"])
        columns = ["path", "type", "status", "graph", "location", "failure"]
        for row in rows:
            if len(row["failure"]) > max_failure_width:
                row["failure"] = row["failure"][: max_failure_width - 3] + "..."
        widths = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in columns}
        lines = [self.summary(), ""]
        lines.append("  ".join(c.ljust(widths[c]) for c in columns).rstrip())
        lines.append("  ".join("-" * widths[c] for c in columns))
        for row in rows:
            lines.append("  ".join(row[c].ljust(widths[c]) for c in columns).rstrip())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()

    def __repr__(self) -> str:
        return f"GraphCollection({self.summary()})"


def _short_location(location: str) -> str:
    """``file:line`` relative to the working directory when the file is below it."""
    if not location:
        return location
    relative = os.path.relpath(location, os.getcwd())
    return location if relative.startswith("..") else relative


def _graph_text(entry: ModuleEntry) -> str:
    if entry.graph is None:
        return ""
    if entry.opaque:
        return "opaque"
    return f"{len(entry.graph.nodes)} nodes"


__all__ = ["STATUSES", "GraphCollection", "ModuleEntry", "ModuleFailure"]
