"""The stages of :func:`yobx.torch.onnx.to_onnx`: what each took (time, memory, counts)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from yobx.torch.chrome_trace import current_rss_bytes


@dataclasses.dataclass
class Stage:
    """One stage of the export pipeline.

    :param name: stage name (``capture``, ``passes``, ``lower``, ``translate``, ...)
    :param start_ns: ``time.perf_counter_ns()`` at the start
    :param end_ns: ``time.perf_counter_ns()`` at the end
    :param args: extra information (``rss_bytes`` at the end, counts)
    """

    name: str
    start_ns: int
    end_ns: int
    args: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        """Duration in seconds."""
        return (self.end_ns - self.start_ns) / 1e9


class ExportStageRecorder:
    """Records the :class:`Stage` of each ``with recorder(name) as args:`` block,
    prints them with ``verbose`` and reports each to ``progress`` when it ends."""

    def __init__(self, verbose: int, progress: Callable[[Stage], None] | None):
        self.stages: list[Stage] = []
        self.verbose = verbose
        self.progress = progress

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[dict[str, Any]]:
        args: dict[str, Any] = {}
        if self.verbose:
            print(f"[to_onnx] {name} ...", flush=True)
        start = time.perf_counter_ns()
        yield args
        end = time.perf_counter_ns()
        rss = current_rss_bytes()
        if rss is not None:
            args["rss_bytes"] = rss
        stage = Stage(name, start, end, args)
        self.stages.append(stage)
        if self.progress is not None:
            self.progress(stage)
        if self.verbose:
            print(f"[to_onnx] {name} done in {stage.duration_s:.3f}s", flush=True)


__all__ = ["Stage", "ExportStageRecorder"]
