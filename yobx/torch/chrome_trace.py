"""Chrome trace events: a handler interface, a JSON writer, merging and stage profiles.

Files written here follow the Trace Event Format (complete ``X`` events with ``dur``,
``i`` instants, ``C`` counters, ``M`` metadata naming processes and threads) with times in
microseconds, and open in https://ui.perfetto.dev or ``chrome://tracing``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any


def current_rss_bytes() -> int | None:
    """Resident set size of this process in bytes, None when the platform does not tell."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


def _join_categories(categories: str | Iterable[str] | None) -> str:
    if categories is None:
        return ""
    if isinstance(categories, str):
        return categories
    return ",".join(categories)


class TraceHandler:
    """Receives trace events; subclasses decide what to do with them.

    Times are integers in nanoseconds (``time.perf_counter_ns()`` or any other clock
    shared by the events of one trace). ``pid``/``tid`` default to the current process
    and thread.
    """

    def process_duration_event(
        self,
        name: str,
        categories: str | Iterable[str] | None,
        is_start: bool,
        timestamp_ns: int,
        pid: int | str | None = None,
        tid: int | str | None = None,
        args: dict[str, Any] | None = None,
    ) -> None:
        """The start (``is_start=True``) or the end of a duration on one thread."""
        raise NotImplementedError(f"{type(self).__name__} does not handle duration events")

    def process_instant_event(
        self,
        name: str,
        categories: str | Iterable[str] | None,
        timestamp_ns: int,
        scope: str = "t",
        pid: int | str | None = None,
        tid: int | str | None = None,
        args: dict[str, Any] | None = None,
    ) -> None:
        """A point in time; ``scope`` is ``t`` (thread), ``p`` (process) or ``g`` (global)."""
        raise NotImplementedError(f"{type(self).__name__} does not handle instant events")

    def process_counter_event(
        self,
        name: str,
        categories: str | Iterable[str] | None,
        timestamp_ns: int,
        values: dict[str, float],
        pid: int | str | None = None,
    ) -> None:
        """Values of a counter (one series per key) at a point in time."""
        raise NotImplementedError(f"{type(self).__name__} does not handle counter events")

    def process_complete_event(
        self,
        name: str,
        categories: str | Iterable[str] | None,
        start_ns: int,
        duration_ns: int,
        pid: int | str | None = None,
        tid: int | str | None = None,
        args: dict[str, Any] | None = None,
    ) -> None:
        """A duration known at once; by default a start and an end duration event."""
        self.process_duration_event(name, categories, True, start_ns, pid, tid, args)
        self.process_duration_event(name, categories, False, start_ns + duration_ns, pid, tid)

    def process_metadata_event(
        self,
        name: str,
        pid: int | str | None = None,
        tid: int | str | None = None,
        args: dict[str, Any] | None = None,
    ) -> None:
        """Metadata such as ``process_name`` or ``thread_name``; ignored by default."""

    def process_other_event(self, event: dict[str, Any]) -> None:
        """An event of a phase this interface does not model (flows, async...); ignored."""

    def process_chrome_json_trace_file(
        self,
        path: str | os.PathLike,
        time_offset_ns: int = 0,
        pid_map: dict[Any, Any] | None = None,
    ) -> int:
        """Feed every event of a Chrome trace file (JSON, optionally gzipped) to this handler.

        :param path: file written by this module, ``torch.profiler``, onnxruntime...
        :param time_offset_ns: added to every timestamp
        :param pid_map: renames process ids (to keep merged files apart)
        :return: number of events read
        """
        events = load_trace_events(path)
        pid_map = pid_map or {}
        for event in events:
            self._dispatch(event, time_offset_ns, pid_map)
        return len(events)

    def _dispatch(self, event: dict[str, Any], offset: int, pid_map: dict[Any, Any]) -> None:
        phase = event.get("ph")
        name = event.get("name", "")
        categories = event.get("cat")
        pid = pid_map.get(event.get("pid"), event.get("pid"))
        tid = event.get("tid")
        args = event.get("args")
        if phase == "M":
            self.process_metadata_event(name, pid, tid, args)
            return
        if "ts" not in event:
            self.process_other_event({**event, "pid": pid})
            return
        ts = round(float(event["ts"]) * 1000) + offset
        if phase == "X":
            duration = round(float(event.get("dur", 0)) * 1000)
            self.process_complete_event(name, categories, ts, duration, pid, tid, args)
        elif phase in ("B", "E"):
            self.process_duration_event(name, categories, phase == "B", ts, pid, tid, args)
        elif phase in ("i", "I"):
            self.process_instant_event(name, categories, ts, event.get("s", "t"), pid, tid, args)
        elif phase == "C":
            self.process_counter_event(name, categories, ts, dict(args or {}), pid)
        else:
            self.process_other_event({**event, "pid": pid, "ts": ts / 1000})


def load_trace_events(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Events of a Chrome trace file (JSON, optionally gzipped), either a JSON list or
    ``{"traceEvents": [...]}``.

    :raises ValueError: the file holds no list of events
    """
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = json.loads(raw.decode("utf-8"))
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    if not isinstance(data, list):
        raise ValueError(f"{path} is not a Chrome trace file (no list of events)")
    return data


class JSONTraceHandler(TraceHandler):
    """Collects events and writes them as a Chrome trace JSON file.

    Durations are written as complete ``X`` events: a start is kept on a per-thread stack
    until its end arrives. ``write`` sorts events by time, parents before their children.

    :param path: default output file; ``.gz`` suffix means gzip
    :param process_name: written as ``process_name`` metadata of the current process
    """

    def __init__(self, path: str | os.PathLike | None = None, process_name: str | None = None):
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._open: dict[tuple[Any, Any], list[tuple[str, str, int, dict | None]]] = {}
        self._named_processes: set[Any] = set()
        self._named_threads: set[tuple[Any, Any]] = set()
        self._last_ts_ns = 0
        if process_name:
            self.set_process_name(process_name)

    # Identifiers ---------------------------------------------------------------------

    @staticmethod
    def default_pid() -> int:
        """Current process id."""
        return os.getpid()

    @staticmethod
    def default_tid() -> int:
        """Current thread's native id."""
        return threading.get_native_id()

    def _ids(self, pid: Any, tid: Any) -> tuple[Any, Any]:
        return (
            self.default_pid() if pid is None else pid,
            self.default_tid() if tid is None else tid,
        )

    def _seen(self, ts_ns: int) -> None:
        self._last_ts_ns = max(self._last_ts_ns, ts_ns)

    # Metadata ------------------------------------------------------------------------

    def set_process_name(self, name: str, pid: int | str | None = None) -> None:
        """Name a process in the viewer."""
        self.process_metadata_event("process_name", pid, None, {"name": name})

    def set_thread_name(self, name: str, pid: int | str | None = None, tid: Any = None) -> None:
        """Name a thread (a track) in the viewer."""
        self.process_metadata_event("thread_name", pid, tid, {"name": name})

    def has_process_name(self, pid: Any) -> bool:
        """Whether a ``process_name`` metadata event exists for ``pid``."""
        return pid in self._named_processes

    def process_metadata_event(self, name, pid=None, tid=None, args=None) -> None:
        """Keep an ``M`` event (``process_name``, ``thread_name``, sort indices...)."""
        pid, tid = self._ids(pid, tid)
        if name == "process_name":
            self._named_processes.add(pid)
        elif name == "thread_name":
            self._named_threads.add((pid, tid))
        event = {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": dict(args or {})}
        self.events.append(event)

    # Events --------------------------------------------------------------------------

    def process_duration_event(
        self, name, categories, is_start, timestamp_ns, pid=None, tid=None, args=None
    ) -> None:
        """Open a duration, or close the innermost open duration of that name as an ``X``
        (with the durations opened after it and still open).

        :raises ValueError: an end without an open duration of that name
        """
        key = self._ids(pid, tid)
        self._seen(timestamp_ns)
        stack = self._open.setdefault(key, [])
        if is_start:
            stack.append((name, _join_categories(categories), timestamp_ns, args))
            return
        for position in range(len(stack) - 1, -1, -1):
            if stack[position][0] == name:
                break
        else:
            raise ValueError(f"end of duration {name!r} on {key} without a start")
        # Durations closed out of order end with the one closed: they nest by definition.
        for open_name, open_cats, start, open_args in reversed(stack[position + 1 :]):
            self._complete(open_name, open_cats, start, timestamp_ns - start, key, open_args)
        _, categories_start, start, start_args = stack[position]
        merged = {**(start_args or {}), **(args or {})}
        self._complete(name, categories_start, start, timestamp_ns - start, key, merged)
        del stack[position:]

    def process_complete_event(
        self, name, categories, start_ns, duration_ns, pid=None, tid=None, args=None
    ) -> None:
        """Keep an ``X`` event."""
        self._seen(start_ns + duration_ns)
        self._complete(
            name, _join_categories(categories), start_ns, duration_ns, self._ids(pid, tid), args
        )

    def _complete(self, name, categories, start_ns, duration_ns, key, args) -> None:
        event = {
            "ph": "X",
            "name": name,
            "cat": categories,
            "ts": start_ns / 1000,
            "dur": max(duration_ns, 0) / 1000,
            "pid": key[0],
            "tid": key[1],
        }
        if args:
            event["args"] = _jsonable(args)
        self.events.append(event)

    def process_instant_event(
        self, name, categories, timestamp_ns, scope="t", pid=None, tid=None, args=None
    ) -> None:
        """Keep an ``i`` event."""
        pid, tid = self._ids(pid, tid)
        self._seen(timestamp_ns)
        event = {
            "ph": "i",
            "name": name,
            "cat": _join_categories(categories),
            "ts": timestamp_ns / 1000,
            "s": scope,
            "pid": pid,
            "tid": tid,
        }
        if args:
            event["args"] = _jsonable(args)
        self.events.append(event)

    def process_counter_event(self, name, categories, timestamp_ns, values, pid=None) -> None:
        """Keep a ``C`` event; ``values`` maps series names to numbers."""
        pid, tid = self._ids(pid, None)
        self._seen(timestamp_ns)
        self.events.append(
            {
                "ph": "C",
                "name": name,
                "cat": _join_categories(categories),
                "ts": timestamp_ns / 1000,
                "pid": pid,
                "tid": tid,
                "args": {k: float(v) for k, v in values.items()},
            }
        )

    def process_other_event(self, event: dict[str, Any]) -> None:
        """Keep events of other phases unchanged (flows, async, object snapshots...)."""
        self.events.append(dict(event))

    # Helpers -------------------------------------------------------------------------

    @contextlib.contextmanager
    def duration(
        self, name: str, categories: str | Iterable[str] | None = None, **args: Any
    ) -> Iterator[None]:
        """Context manager recording its body as a duration on the current thread."""
        self.process_duration_event(name, categories, True, time.perf_counter_ns(), args=args)
        try:
            yield
        finally:
            self.process_duration_event(name, categories, False, time.perf_counter_ns())

    def record_rss(self, timestamp_ns: int | None = None, rss_bytes: int | None = None) -> None:
        """Add a ``memory`` counter event with the process RSS in MiB."""
        rss = current_rss_bytes() if rss_bytes is None else rss_bytes
        if rss is None:
            return
        ts = time.perf_counter_ns() if timestamp_ns is None else timestamp_ns
        self.process_counter_event("memory", "memory", ts, {"rss_MiB": rss / 2**20})

    def sorted_events(self) -> list[dict[str, Any]]:
        """Metadata first, then events by time, a parent before the events it contains."""
        metadata = [e for e in self.events if e.get("ph") == "M"]
        timed = [e for e in self.events if e.get("ph") != "M"]
        timed.sort(key=lambda e: (float(e.get("ts", 0)), -float(e.get("dur", 0))))
        return metadata + timed

    def to_dict(self) -> dict[str, Any]:
        """The trace as a JSON-ready dictionary; open durations end at the last timestamp."""
        for key, stack in list(self._open.items()):
            for name, categories, start, args in stack:
                merged = {**(args or {}), "unfinished": True}
                self._complete(name, categories, start, self._last_ts_ns - start, key, merged)
        self._open.clear()
        return {"traceEvents": self.sorted_events(), "displayTimeUnit": "ms"}

    def write(self, path: str | os.PathLike | None = None, compress: bool | None = None) -> str:
        """Write the trace; gzip when ``compress`` or the path ends with ``.gz``.

        :param path: output file, default the constructor's ``path``
        :param compress: gzip or not, default according to the suffix
        :return: the path written
        :raises ValueError: no path given here nor to the constructor
        """
        path = path if path is not None else self.path
        if path is None:
            raise ValueError("no output path: give one to write() or to the constructor")
        path = os.fspath(path)
        compress = path.endswith(".gz") if compress is None else compress
        data = json.dumps(self.to_dict()).encode("utf-8")
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        with open(path, "wb") as f:
            f.write(gzip.compress(data) if compress else data)
        return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def merge_traces(
    out: str | os.PathLike,
    *files: str | os.PathLike,
    separate_processes: bool = True,
    align_start: bool = False,
) -> str:
    """Merge several Chrome trace files into one timeline.

    :param out: output path (``.gz`` for gzip)
    :param files: input trace files (this module's, ``torch.profiler``'s, onnxruntime's...)
    :param separate_processes: give each file its own process ids when two files use the
        same one (both written by the same process, say), and name unnamed processes after
        the file, so that their tracks stay apart in the viewer
    :param align_start: shift each file so that its first event is at time 0, for files
        whose clocks differ (timestamps are kept as they are otherwise)
    :return: the output path
    """
    handler = JSONTraceHandler()
    used_pids: set[Any] = set()
    for path in files:
        events = load_trace_events(path)
        file_pids = {e.get("pid") for e in events if "pid" in e}
        pid_map: dict[Any, Any] = {}
        if separate_processes:
            for pid in sorted(file_pids, key=str):
                if pid in used_pids:
                    pid_map[pid] = _fresh_pid(used_pids | file_pids | set(pid_map.values()))
        offset = 0
        if align_start:
            starts = [float(e["ts"]) for e in events if "ts" in e and e.get("ph") != "M"]
            offset = -round(min(starts) * 1000) if starts else 0
        for event in events:
            handler._dispatch(event, offset, pid_map)
        new_pids = {pid_map.get(p, p) for p in file_pids}
        used_pids |= new_pids
        if separate_processes:
            for pid in new_pids:
                if pid is not None and not handler.has_process_name(pid):
                    handler.set_process_name(os.path.basename(os.fspath(path)), pid)
    return handler.write(out)


def _fresh_pid(used: set[Any]) -> int:
    numbers = [p for p in used if isinstance(p, int)]
    return max(numbers, default=0) + 1


def _stage_field(stage: Any, name: str, default: Any = None) -> Any:
    if isinstance(stage, dict):
        return stage.get(name, default)
    return getattr(stage, name, default)


def _sorted_stages(stages: Iterable[Any]) -> list[tuple[int, int, str, Any]]:
    """``(start_ns, end_ns, name, stage)`` of each stage, checked, parents first."""
    records = []
    for stage in stages:
        name = _stage_field(stage, "name")
        start = _stage_field(stage, "start_ns")
        end = _stage_field(stage, "end_ns")
        if name is None or start is None or end is None:
            raise ValueError(f"a stage needs name, start_ns and end_ns, got {stage!r}")
        if end < start:
            raise ValueError(f"stage {name!r} ends before it starts ({start} > {end})")
        records.append((int(start), int(end), str(name), stage))
    # Earliest first and, for equal starts, the longest first: parents precede children.
    records.sort(key=lambda r: (r[0], -r[1]))
    return records


def _track_for(tracks: list[list[int]], start: int, end: int) -> int:
    """The first track where ``[start, end]`` nests in the innermost open stage or starts
    after it ended; ``len(tracks)`` when none (a new track is needed). Each track is a
    stack of the end times of its open stages, closed here as ``start`` passes them."""
    for candidate, stack in enumerate(tracks):
        while stack and stack[-1] <= start:
            stack.pop()
        if not stack or end <= stack[-1]:
            return candidate
    return len(tracks)


def _record_stage_counters(
    handler: JSONTraceHandler, stage: Any, args: dict, start: int, end: int, pid: int
) -> bool:
    """Adds the memory samples and node counts of a stage; returns whether it had any
    memory sample."""
    any_rss = False
    samples = {}
    for field, ts in (
        ("rss_start_bytes", start),
        ("rss_bytes", end),
        ("rss_end_bytes", end),
    ):
        rss = _stage_field(stage, field, args.get(field))
        if isinstance(rss, (int, float)):
            # a stage may give its end twice (``rss_end_bytes`` and ``args["rss_bytes"]``)
            samples[ts] = int(rss)
    for ts, rss in samples.items():
        any_rss = True
        handler.record_rss(ts, rss)
    counts = {
        key: value
        for key, value in args.items()
        if (key == "node_count" or key.endswith("nodes"))
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    }
    if counts:
        handler.process_counter_event("nodes", "graph", end, counts, pid)
    return any_rss


def write_stage_profile(
    stages: Iterable[Any],
    path: str | os.PathLike,
    process_name: str = "yobx",
    handler: JSONTraceHandler | None = None,
) -> str:
    """Write pipeline stages (capture, passes, translation, ...) as a Chrome trace file.

    Each stage becomes an ``X`` event. A stage inside another one (by time) is drawn
    nested under it; stages that overlap without nesting go to another track. Memory
    counter events (RSS in MiB) come from ``rss_start_bytes``/``rss_end_bytes`` (fields
    or ``args`` entries, see :class:`~yobx.torch.stages.StageRecorder`) or
    ``args["rss_bytes"]`` (at the end of the stage); when no stage has any, one sample
    taken now is put at the end of the last stage. Numbers in ``args`` named
    ``node_count`` or ``*nodes`` (``nodes``, ``onnx_nodes``...) become series of a
    ``nodes`` counter at the end of the stage.

    :param stages: objects or dicts with ``name``, ``start_ns``, ``end_ns``
        (``time.perf_counter_ns()``) and optional ``args`` dict
    :param path: output file (``.gz`` for gzip)
    :param process_name: name of the process in the viewer
    :param handler: add the events to this handler instead of a new one
    :return: the path written
    """
    records = _sorted_stages(stages)
    handler = handler or JSONTraceHandler()
    pid = handler.default_pid()
    base_tid = handler.default_tid()
    handler.set_process_name(process_name, pid)
    # Each track holds a stack of open intervals; a stage goes on the first track where it
    # nests in the innermost open stage or starts after it ended.
    tracks: list[list[int]] = []
    any_rss = False
    for start, end, name, stage in records:
        track_index = _track_for(tracks, start, end)
        if track_index == len(tracks):
            tracks.append([])
            handler.set_thread_name(
                "stages" if track_index == 0 else f"stages (overlap {track_index})",
                pid,
                base_tid + track_index,
            )
        tracks[track_index].append(end)
        args = dict(_stage_field(stage, "args") or {})
        handler.process_complete_event(
            name, "stage", start, end - start, pid, base_tid + track_index, args
        )
        any_rss |= _record_stage_counters(handler, stage, args, start, end, pid)
    if records and not any_rss:
        handler.record_rss(max(r[1] for r in records))
    return handler.write(path)
