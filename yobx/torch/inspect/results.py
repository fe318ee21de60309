"""Containers of a recorded run: :class:`TraceResult` > :class:`TraceStage` > :class:`TraceCall`.

Every level is accessed the same way in a notebook: by attribute (``result.graph``), by key
(``result["graph"]``, ``stage["linear_1"]``, ``call.params["input"]``), by index
(``stage[3]``); ``dir()`` lists the keys and a wrong key raises a :class:`KeyError` that
names the valid ones.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from .values import short_text


def _unknown_key_message(kind: str, key: Any, valid: list[str]) -> str:
    close = difflib.get_close_matches(str(key), valid, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    shown = valid if len(valid) <= 30 else [*valid[:30], f"... ({len(valid) - 30} more)"]
    return f"{kind} has no key {key!r}.{hint} Valid keys: {', '.join(map(str, shown))}"


class KeyedAccess:
    """Mixin giving attribute access, ``dir()`` and helpful :class:`KeyError` from ``keys()``."""

    _kind = "object"

    def keys(self) -> list[str]:  # pragma: no cover - always overridden
        """The valid keys."""
        raise NotImplementedError

    def _lookup(self, key: str) -> Any:  # pragma: no cover - always overridden
        raise NotImplementedError

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(_unknown_key_message(self._kind, key, self.keys()))
            return self._lookup(key)
        raise KeyError(_unknown_key_message(self._kind, key, self.keys()))

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup failed: private names must not loop into keys().
        # An object being unpickled or copied has an empty __dict__ yet.
        if name.startswith("_") or not self.__dict__:
            raise AttributeError(name)
        keys = self.keys()
        if name in keys:
            return self._lookup(name)
        raise AttributeError(_unknown_key_message(self._kind, name, keys))

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {k for k in self.keys() if k.isidentifier()})


class Params(KeyedAccess):
    """The captured parameters of one call, by parameter name, in call order.

    :param values: parameter name -> summary
    """

    _kind = "params"

    def __init__(self, values: dict[str, Any]):
        self._values = dict(values)

    def keys(self) -> list[str]:
        """Parameter names."""
        return list(self._values)

    def values(self) -> list[Any]:
        """Parameter summaries."""
        return list(self._values.values())

    def items(self) -> list[tuple[str, Any]]:
        """(name, summary) pairs."""
        return list(self._values.items())

    def _lookup(self, key: str) -> Any:
        return self._values[key]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __repr__(self) -> str:
        return "\n".join(f"{k}: {v!r}" for k, v in self._values.items()) or "(no parameters)"


class TraceCall(KeyedAccess):
    """One recorded call: a module, a graph node, an ONNX node or a decorated function.

    :param name: display name (module path, FX node name, ...); ``stage[name]`` finds it
    :param target: what was called (``Linear``, ``torch.nn.functional.linear``, ``Add``)
    :param params: summaries of the parameters by name
    :param retval: summary of the return value (a tuple for several outputs)
    :param duration_ns: duration of the call alone in nanoseconds, None when unknown
    :param kind: ``module``, ``call_function``, ``call_method``, ``call_module``,
        ``onnx``, ``function`` (:func:`trace_func`), ``method`` (:func:`trace_model_func`)
    :param run: index of the input set in the recording
    :param aliases: other names of the same computation (module path of a ``call_module``
        node, ONNX output names), used to match calls across stages
    :param start_ns: ``time.perf_counter_ns()`` when the call started
    :param output_names: names of the outputs when the call produces named values (ONNX
        nodes); :meth:`output_for` picks one of them
    """

    _kind = "call"

    def __init__(
        self,
        name: str,
        target: str,
        params: dict[str, Any],
        retval: Any,
        duration_ns: int | None,
        kind: str,
        run: int = 0,
        aliases: tuple[str, ...] = (),
        start_ns: int | None = None,
        output_names: tuple[str, ...] = (),
    ):
        self.name = name
        self.target = target
        self.params = Params(params)
        self.retval = retval
        self.duration_ns = duration_ns
        self.kind = kind
        self.run = run
        self.aliases = (name, *[a for a in aliases if a != name])
        self.start_ns = start_ns
        #: Names of the outputs when the call produces named values (ONNX nodes).
        self.output_names = output_names
        #: Names this call may be known by without certainty (the module a graph node
        #: is the last node of): a match through them that does not fit is ignored.
        self.weak_aliases: tuple[str, ...] = ()
        #: Position of the call in its stage, set by :meth:`TraceStage.append`.
        self.index = -1

    def keys(self) -> list[str]:
        """The parameter names, so that ``call["input"]`` is ``call.params["input"]``."""
        return self.params.keys()

    def _lookup(self, key: str) -> Any:
        return self.params[key]

    @property
    def duration_us(self) -> float | None:
        """Duration in microseconds."""
        return None if self.duration_ns is None else self.duration_ns / 1000

    def output_for(self, name: str) -> Any:
        """The output called ``name`` when the call has several named outputs, else retval."""
        if len(self.output_names) > 1 and name in self.output_names:
            return self.retval[self.output_names.index(name)]
        return self.retval

    def __repr__(self) -> str:
        lines = [f"[{self.index}] {self.name} = {self.target}  ({self.kind}, run {self.run})"]
        if self.duration_ns is not None:
            lines.append(f"  duration: {self.duration_ns / 1000:.1f} us")
        for key, value in self.params.items():
            lines.append(f"  param {key}: {value!r}")
        lines.append(f"  retval: {self.retval!r}")
        return "\n".join(lines)


class CallList(list):
    """The calls sharing one name (``stage["linear_1"]``), with a readable repr."""

    def __repr__(self) -> str:
        return "\n".join(repr(c) for c in self) or "(no calls)"


class TraceStage(KeyedAccess):
    """The calls recorded in one stage (``eager``, ``graph``, ``onnx``, user stages).

    ``stage[i]`` is the i-th call, ``stage["name"]`` all calls of that name (a list),
    ``stage.outputs[run]`` the summary of what the stage returned for each input set.

    :param name: the stage name
    :param max_calls: record at most that many calls (the others are counted in
        :attr:`dropped_calls`)
    """

    _kind = "stage"

    #: Calls shown by ``repr``; the rest is elided.
    MAX_REPR_ROWS = 60

    def __init__(self, name: str, max_calls: int | None = None):
        self.name = name
        self.calls: list[TraceCall] = []
        self.outputs: list[Any] = []
        #: Wall time of each run through the stage, in nanoseconds.
        self.run_durations_ns: list[int] = []
        self.max_calls = max_calls
        #: Calls that happened but were not recorded because of ``max_calls``.
        self.dropped_calls = 0
        #: Warnings about the stage (why its calls cannot be matched, for instance).
        self.notes: list[str] = []
        self._by_name: dict[str, CallList] = {}

    def append(self, call: TraceCall) -> bool:
        """Add a call unless ``max_calls`` is reached; return whether it was recorded."""
        if self.max_calls is not None and len(self.calls) >= self.max_calls:
            self.dropped_calls += 1
            return False
        call.index = len(self.calls)
        self.calls.append(call)
        self._by_name.setdefault(call.name, CallList()).append(call)
        return True

    def keys(self) -> list[str]:
        """Names of the recorded calls in first-call order."""
        return list(self._by_name)

    def _lookup(self, key: str) -> CallList:
        return self._by_name[key]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, slice)):
            return self.calls[key]
        return super().__getitem__(key)

    def __len__(self) -> int:
        return len(self.calls)

    def __iter__(self) -> Iterator[TraceCall]:
        return iter(self.calls)

    @property
    def total_duration_ns(self) -> int:
        """Sum of the durations of the recorded calls."""
        return sum(c.duration_ns or 0 for c in self.calls)

    def slowest(self, n: int = 10) -> list[TraceCall]:
        """The ``n`` calls that took the longest."""
        return sorted(self.calls, key=lambda c: -(c.duration_ns or 0))[:n]

    def summary_line(self) -> str:
        """One line: name, number of calls, total time."""
        dropped = f" (+{self.dropped_calls} not recorded)" if self.dropped_calls else ""
        runs = len(self.outputs)
        return (
            f"stage {self.name!r}: {len(self.calls)} calls{dropped} in {runs} run(s), "
            f"{self.total_duration_ns / 1e6:.3f} ms in calls"
        )

    def table(self, max_rows: int | None = None) -> str:
        """The calls as a text table: index, run, name, target, output, duration; the
        first ``max_rows`` calls (:attr:`MAX_REPR_ROWS` by default)."""
        max_rows = self.MAX_REPR_ROWS if max_rows is None else max_rows
        rows = [("#", "run", "name", "target", "output", "us")]
        for call in self.calls[:max_rows]:
            duration = "" if call.duration_ns is None else f"{call.duration_ns / 1000:.1f}"
            rows.append(
                (
                    str(call.index),
                    str(call.run),
                    call.name,
                    call.target,
                    short_text(call.retval, 50),
                    duration,
                )
            )
        widths = [min(max(len(r[i]) for r in rows), 50) for i in range(len(rows[0]))]
        lines = ["  ".join(cell[:50].ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        if len(self.calls) > max_rows:
            lines.append(f"... {len(self.calls) - max_rows} more calls")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"{self.summary_line()}\n{self.table()}"


class RecordedStages(KeyedAccess):
    """Stages by name, inputs and the profile: the data of a
    :class:`~yobx.torch.inspect.TraceResult` (which adds the comparisons)."""

    _kind = "result"

    def __init__(self):
        self.stages: dict[str, TraceStage] = {}
        #: Summaries of the input sets, one ``(args, kwargs)`` pair per run.
        self.inputs: list[Any] = []
        #: Path of the Chrome trace file written, if any.
        self.profile_path: str | None = None
        #: The GraphModule run by the ``graph`` stage (traced by record_run if not given).
        self.graph_module: Any = None

    def stage(self, name: str, max_calls: int | None = None) -> TraceStage:
        """The stage ``name``, created (at the end of the pipeline order) if missing."""
        if name not in self.stages:
            self.stages[name] = TraceStage(name, max_calls=max_calls)
        return self.stages[name]

    def keys(self) -> list[str]:
        """Stage names in pipeline order."""
        return list(self.stages)

    def _lookup(self, key: str) -> TraceStage:
        return self.stages[key]

    def __iter__(self) -> Iterator[TraceStage]:
        return iter(self.stages.values())

    def __len__(self) -> int:
        return len(self.stages)

    def summary(self, max_rows: int = 20) -> str:
        """Readable summary: each stage with its calls (first ``max_rows``) and slowest calls."""
        lines = []
        for stage in self.stages.values():
            lines.append(stage.summary_line())
            lines.append(_indent(stage.table(max_rows)))
            slow = [c for c in stage.slowest(3) if c.duration_ns]
            if slow:
                text = ", ".join(f"{c.name} {c.duration_ns / 1000:.1f} us" for c in slow)
                lines.append(f"  slowest: {text}")
        if self.profile_path:
            lines.append(f"profile written to {self.profile_path}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())
