"""The stages of a pipeline: what each took (time, memory, counts), recorded once.

One recorder serves :func:`yobx.torch.onnx.to_onnx` (its ``capture``, ``lower``,
``translate``... stages, printed with ``verbose`` and reported to ``progress``) and any
user pipeline profiled for Chrome's trace viewer
(:func:`yobx.torch.chrome_trace.write_stage_profile`)::

    recorder = StageRecorder()
    with recorder.stage("export"):
        with recorder.stage("capture", nodes=42) as record:
            record.args["extra"] = "yes"
    recorder.write("profile.json")
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from yobx.torch.chrome_trace import current_rss_bytes, write_stage_profile


@dataclasses.dataclass
class Stage:
    """One stage of a pipeline.

    :param name: stage name (``capture``, ``passes``, ``lower``, ``translate``, ...)
    :param start_ns: ``time.perf_counter_ns()`` at the start
    :param end_ns: ``time.perf_counter_ns()`` at the end (None while it runs)
    :param args: extra information (counts; ``rss_bytes``, the process's resident
        memory at the end)
    :param rss_start_bytes: the process's resident memory at the start, if known
    :param rss_end_bytes: the same at the end
    """

    name: str
    start_ns: int
    end_ns: int | None = None
    args: dict[str, Any] = dataclasses.field(default_factory=dict)
    rss_start_bytes: int | None = None
    rss_end_bytes: int | None = None

    @property
    def duration_s(self) -> float:
        """Duration in seconds (0 while the stage runs)."""
        return 0.0 if self.end_ns is None else (self.end_ns - self.start_ns) / 1e9

    def __getitem__(self, field: str) -> Any:
        # records were dicts before they were Stages: ``record["args"]`` still reads
        return getattr(self, field)


class StageRecorder:
    """Records a :class:`Stage` for each ``with recorder.stage(name):`` block, in the
    order the stages start (a stage may hold others).

    :param verbose: print each stage's start and duration (prefixed with ``label``)
    :param progress: called with each :class:`Stage` when it ends
    :param label: the prefix of the printed lines
    """

    def __init__(
        self,
        verbose: int = 0,
        progress: Callable[[Stage], None] | None = None,
        label: str = "yobx",
    ):
        self.stages: list[Stage] = []
        self.verbose = verbose
        self.progress = progress
        self.label = label

    @contextlib.contextmanager
    def stage(self, name: str, **args: Any) -> Iterator[Stage]:
        """Times one stage; the yielded :class:`Stage`'s ``args`` can be extended."""
        if self.verbose:
            print(f"[{self.label}] {name} ...", flush=True)
        record = Stage(name, time.perf_counter_ns(), None, dict(args), current_rss_bytes())
        self.stages.append(record)
        try:
            yield record
        finally:
            record.end_ns = time.perf_counter_ns()
            record.rss_end_bytes = current_rss_bytes()
            if record.rss_end_bytes is not None:
                record.args["rss_bytes"] = record.rss_end_bytes
        if self.progress is not None:
            self.progress(record)
        if self.verbose:
            print(f"[{self.label}] {name} done in {record.duration_s:.3f}s", flush=True)

    @contextlib.contextmanager
    def __call__(self, name: str, **args: Any) -> Iterator[dict[str, Any]]:
        """:meth:`stage`, yielding the stage's ``args`` (the counts a step fills in)."""
        with self.stage(name, **args) as record:
            yield record.args

    def write(self, path: str | os.PathLike, process_name: str = "yobx") -> str:
        """Writes the stages with :func:`~yobx.torch.chrome_trace.write_stage_profile`."""
        return write_stage_profile(self.stages, path, process_name=process_name)


__all__ = ["Stage", "StageRecorder"]
