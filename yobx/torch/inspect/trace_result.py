"""The result of :func:`~yobx.torch.inspect.record_run`: recorded stages and their
comparisons."""

from __future__ import annotations

from typing import Any

from .compare import CallComparison, Comparison, compare
from .results import RecordedStages


class TraceResult(RecordedStages):
    """Everything recorded by :func:`record_run`: stages by name, inputs, and the profile."""

    def compare(self, stage_a: str, stage_b: str, **kwargs: Any) -> Comparison:
        """Compare two stages of this result, see :func:`yobx.torch.inspect.compare`."""
        return compare(self[stage_a], self[stage_b], **kwargs)

    def first_divergence(self, stage_a: str, stage_b: str, **kwargs: Any) -> CallComparison | None:
        """First call whose outputs differ between two stages, or None."""
        return self.compare(stage_a, stage_b, **kwargs).first_divergence
