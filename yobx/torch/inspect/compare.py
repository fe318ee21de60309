"""Compare two recorded stages or runs and find the first call whose outputs diverge."""

from __future__ import annotations

from typing import Any

import torch

from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL
from .results import RecordedStages, TraceCall, TraceStage
from .values import TensorSummary, ValueSummary, flatten_summaries, short_text

#: Default absolute and relative tolerances, loose enough for ONNX vs eager in float32.


class ValueComparison:
    """How two recorded values differ: ``ok``, largest differences and, if not ok, why.

    :param ok: whether the values agree within tolerance
    :param max_abs_diff: largest absolute difference
    :param max_rel_diff: largest relative difference
    :param reason: why they differ (empty when ok)
    :param index: position of the largest difference in the output tensor
    :param output: which output (in flattening order) the comparison is about
    """

    def __init__(
        self,
        ok: bool,
        max_abs_diff: float = 0.0,
        max_rel_diff: float = 0.0,
        reason: str = "",
        index: tuple[int, ...] | None = None,
        output: int = 0,
    ):
        self.ok = ok
        self.max_abs_diff = max_abs_diff
        self.max_rel_diff = max_rel_diff
        self.reason = reason
        #: Position of the largest difference in the output tensor.
        self.index = index
        #: Which output (in flattening order) the comparison is about.
        self.output = output

    def __repr__(self) -> str:
        status = "ok" if self.ok else f"differs: {self.reason}"
        return (
            f"{status} (max abs diff {self.max_abs_diff:.3g}, max rel diff {self.max_rel_diff:.3g})"
        )


def _as_tensor(summary: Any) -> torch.Tensor | None:
    if isinstance(summary, TensorSummary):
        return summary._tensor
    if isinstance(summary, ValueSummary) and isinstance(
        summary.value, (bool, int, float, list, tuple)
    ):
        try:
            return torch.tensor(summary.value)
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


def compare_tensor_values(
    a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float
) -> ValueComparison:
    """Element-wise comparison with ``|a - b| <= atol + rtol * |b|``, NaNs equal to NaNs."""
    if a.numel() != b.numel():
        return ValueComparison(
            False, float("inf"), float("inf"), f"{a.numel()} vs {b.numel()} elements"
        )
    if a.numel() == 0:
        return ValueComparison(True)
    if a.shape != b.shape:
        # A Python int in the graph is a 0-d or 1-element tensor in ONNX: compare flat.
        a, b = a.reshape(-1), b.reshape(-1)
    if not (a.is_floating_point() or a.is_complex() or b.is_floating_point() or b.is_complex()):
        diff = (a.to(torch.int64) - b.to(torch.int64)).abs().double()
        max_abs = float(diff.max())
        ok = max_abs == 0
        index = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
        return ValueComparison(ok, max_abs, max_abs, "" if ok else "values differ", index)
    a64, b64 = (
        a.to(torch.complex128 if a.is_complex() else torch.float64),
        b.to(torch.complex128 if b.is_complex() else torch.float64),
    )
    both_nan = a64.isnan() & b64.isnan()
    same_inf = a64.isinf() & b64.isinf() & (a64 == b64)
    diff = (a64 - b64).abs()
    diff = torch.where(both_nan | same_inf, torch.zeros_like(diff), diff)
    # A NaN on one side only is an infinite difference.
    diff = torch.where(diff.isnan(), torch.full_like(diff, float("inf")), diff)
    limit = atol + rtol * b64.abs().nan_to_num(posinf=0.0)
    rel = diff / b64.abs().clamp_min(1e-12)
    over = diff > limit
    ok = not bool(over.any())
    position = int((diff - limit).argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(position), diff.shape))
    max_rel = float(torch.where(b64.abs() > 0, rel, diff).max())
    reason = "" if ok else f"{int(over.sum())} of {diff.numel()} elements beyond tolerance"
    return ValueComparison(ok, float(diff.max()), max_rel, reason, index)


def compare_summaries(a: Any, b: Any, atol: float, rtol: float) -> ValueComparison:
    """Compare two recorded values (summaries, possibly nested) output by output.

    ``None`` leaves are left out on both sides: a model returning ``(out, None)``
    (``nn.MultiheadAttention`` without weights) has one ONNX output, as torch.onnx
    exports it, and the two agree."""
    leaves_a = [x for x in flatten_summaries(a) if not _is_none(x)]
    leaves_b = [x for x in flatten_summaries(b) if not _is_none(x)]
    if len(leaves_a) != len(leaves_b):
        return ValueComparison(False, reason=f"{len(leaves_a)} vs {len(leaves_b)} outputs")
    worst = ValueComparison(True)
    for output, (x, y) in enumerate(zip(leaves_a, leaves_b)):
        result = _compare_leaf(x, y, atol, rtol)
        result.output = output
        if not result.ok:
            return result
        if result.max_abs_diff > worst.max_abs_diff:
            worst = result
    return worst


def _is_none(summary: Any) -> bool:
    return summary is None or (isinstance(summary, ValueSummary) and summary.value is None)


def _compare_leaf(a: Any, b: Any, atol: float, rtol: float) -> ValueComparison:
    if isinstance(a, TensorSummary) and isinstance(b, TensorSummary):
        if a.shape != b.shape:
            return ValueComparison(
                False, float("inf"), float("inf"), f"shape {a.shape} vs {b.shape}"
            )
        if 0 in tuple(a.shape):
            # no element: nothing to differ, whatever dtype each side gave it
            return ValueComparison(True)
        if a.dtype != b.dtype:
            return ValueComparison(
                False, float("inf"), float("inf"), f"dtype {a.dtype} vs {b.dtype}"
            )
        if a.digest is not None and a.digest == b.digest:
            return ValueComparison(True)
        if not (a.has_tensor and b.has_tensor):
            return ValueComparison(
                False, float("nan"), float("nan"), "digests differ (tensors not kept)"
            )
    if isinstance(a, ValueSummary) and isinstance(b, ValueSummary):
        ok = a.text == b.text
        return ValueComparison(ok, reason="" if ok else f"{a.text} vs {b.text}")
    tensor_a, tensor_b = _as_tensor(a), _as_tensor(b)
    if tensor_a is None or tensor_b is None:
        ok = short_text(a) == short_text(b)
        return ValueComparison(ok, reason="" if ok else "values of different kinds")
    return compare_tensor_values(tensor_a, tensor_b, atol, rtol)


class CallComparison(ValueComparison):
    """Comparison of the outputs of two matched calls (``call_a`` and ``call_b`` None,
    ``name`` ``"output"``, for the final outputs of a run).

    :param name: the name of the call in the first stage
    :param call_a: the call of the first stage
    :param call_b: the matched call of the second stage
    :param value_a: the summary compared from the first stage
    :param value_b: the summary compared from the second stage
    :param result: the comparison of the two values
    :param stage_a: name of the first stage
    :param stage_b: name of the second stage
    :param run: index of the input set
    :param atol: absolute tolerance used
    :param rtol: relative tolerance used
    """

    def __init__(
        self,
        name: str,
        call_a: TraceCall | None,
        call_b: TraceCall | None,
        value_a: Any,
        value_b: Any,
        result: ValueComparison,
        stage_a: str,
        stage_b: str,
        run: int,
        atol: float,
        rtol: float,
    ):
        super().__init__(
            result.ok,
            result.max_abs_diff,
            result.max_rel_diff,
            result.reason,
            result.index,
            result.output,
        )
        self.name = name
        self.call_a = call_a
        self.call_b = call_b
        self.value_a = value_a
        self.value_b = value_b
        self.stage_a = stage_a
        self.stage_b = stage_b
        self.run = run
        self.atol = atol
        self.rtol = rtol

    def __repr__(self) -> str:
        if self.ok:
            return f"{self.name}: ok (max abs diff {self.max_abs_diff:.3g})"
        return side_by_side(self)


def _tensor_leaf(summary: Any, output: int) -> Any:
    leaves = flatten_summaries(summary)
    return leaves[output] if output < len(leaves) else None


def _preview(summary: Any, count: int = 6) -> str:
    tensor = _as_tensor(summary)
    if tensor is None or tensor.numel() == 0:
        return ""
    values = tensor.reshape(-1)[:count].tolist()
    text = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in values)
    return f"[{text}{', ...' if tensor.numel() > count else ''}]"


def _at(summary: Any, index: tuple[int, ...] | None) -> str:
    tensor = _as_tensor(summary)
    if tensor is None or index is None:
        return ""
    try:
        # Shapes that differed were compared flat: the index is then a flat position.
        if tensor.dim() != len(index):
            tensor = tensor.reshape(-1)
        value = tensor[index].item()
    except (IndexError, RuntimeError):
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def side_by_side(diff: CallComparison) -> str:
    """The two values of a divergence in two columns: target, dtype, shape, stats, values."""
    a = _tensor_leaf(diff.value_a, diff.output)
    b = _tensor_leaf(diff.value_b, diff.output)
    rows: list[tuple[str, str, str]] = [("", diff.stage_a, diff.stage_b)]
    rows.append(
        (
            "call",
            f"[{diff.call_a.index}] {diff.call_a.name}" if diff.call_a else "output",
            f"[{diff.call_b.index}] {diff.call_b.name}" if diff.call_b else "output",
        )
    )
    rows.append(
        (
            "target",
            diff.call_a.target if diff.call_a else "",
            diff.call_b.target if diff.call_b else "",
        )
    )
    if isinstance(a, TensorSummary) or isinstance(b, TensorSummary):
        for field in ("dtype", "shape", "min", "max", "mean", "nan_count", "inf_count", "digest"):
            rows.append((field, _field(a, field), _field(b, field)))
        rows.append(("values", _preview(a), _preview(b)))
        if diff.index is not None:
            rows.append((f"at {diff.index}", _at(a, diff.index), _at(b, diff.index)))
    else:
        rows.append(("value", short_text(a), short_text(b)))
    width_0 = max(len(r[0]) for r in rows)
    width_1 = max(len(r[1]) for r in rows)
    header = (
        f"first divergence at {diff.name!r} (run {diff.run}, output {diff.output}): {diff.reason}; "
        f"max abs diff {diff.max_abs_diff:.4g}, max rel diff {diff.max_rel_diff:.4g} "
        f"(atol={diff.atol:g}, rtol={diff.rtol:g})"
    )
    body = [f"  {r[0].ljust(width_0)}  {r[1].ljust(width_1)}  {r[2]}".rstrip() for r in rows]
    return "\n".join([header, *body])


def _field(summary: Any, field: str) -> str:
    if not isinstance(summary, TensorSummary):
        return "" if summary is None else short_text(summary)
    value = getattr(summary, field)
    if field == "dtype":
        return str(value).replace("torch.", "")
    if field == "shape":
        return "x".join(map(str, value)) or "scalar"
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


class Comparison:
    """All matched calls of two stages in the order of the first, and their differences.

    :param stage_a: the first stage
    :param stage_b: the second stage
    :param atol: absolute tolerance used
    :param rtol: relative tolerance used
    """

    def __init__(self, stage_a: TraceStage, stage_b: TraceStage, atol: float, rtol: float):
        self.stage_a = stage_a
        self.stage_b = stage_b
        self.atol = atol
        self.rtol = rtol
        self.calls: list[CallComparison] = []
        #: Calls of the first stage with no counterpart in the second.
        self.unmatched: list[TraceCall] = []

    @property
    def first_divergence(self) -> CallComparison | None:
        """The first call (or final output) whose values differ, None if all agree."""
        return next((c for c in self.calls if not c.ok), None)

    @property
    def ok(self) -> bool:
        """Whether every matched call and every final output agree."""
        return self.first_divergence is None

    def __len__(self) -> int:
        return len(self.calls)

    def __getitem__(self, index: int) -> CallComparison:
        return self.calls[index]

    def __repr__(self) -> str:
        matched = sum(1 for c in self.calls if c.call_a is not None)
        outputs = len(self.calls) - matched
        head = (
            f"compare {self.stage_a.name!r} vs {self.stage_b.name!r}: {matched} matched calls "
            f"and {outputs} final output(s), {len(self.unmatched)} calls without counterpart"
        )
        divergence = self.first_divergence
        if divergence is None:
            worst = max((c.max_abs_diff for c in self.calls), default=0.0)
            return f"{head}; no divergence (max abs diff {worst:.3g})"
        return f"{head}\n{divergence!r}"


def _index_by_alias(stage: TraceStage) -> dict[tuple[int, str], list[TraceCall]]:
    index: dict[tuple[int, str], list[TraceCall]] = {}
    for call in stage.calls:
        for alias in (*call.aliases, *call.weak_aliases):
            index.setdefault((call.run, alias), []).append(call)
    return index


def _fits(value_a: Any, value_b: Any) -> bool:
    """Whether two values have the same structure: same number, shapes and dtypes of leaves."""
    leaves_a, leaves_b = flatten_summaries(value_a), flatten_summaries(value_b)
    if len(leaves_a) != len(leaves_b):
        return False
    for a, b in zip(leaves_a, leaves_b):
        if isinstance(a, TensorSummary) != isinstance(b, TensorSummary):
            return False
        if isinstance(a, TensorSummary) and (a.shape != b.shape or a.dtype != b.dtype):
            return False
    return True


def _pick_stages(a: Any, b: Any, stage: str | None) -> tuple[TraceStage, TraceStage]:
    if isinstance(a, TraceStage) and isinstance(b, TraceStage):
        return a, b
    if isinstance(a, RecordedStages) and isinstance(b, RecordedStages):
        if stage is None:
            common = [s for s in a.stages if s in b.stages]
            if not common:
                raise ValueError(f"no common stage between {a.keys()} and {b.keys()}")
            stage = "graph" if "graph" in common else common[0]
        return a[stage], b[stage]
    raise TypeError(
        "compare expects two TraceStage or two TraceResult, "
        f"got {type(a).__name__} and {type(b).__name__}"
    )


def compare(
    a: TraceStage | RecordedStages,
    b: TraceStage | RecordedStages,
    *,
    stage: str | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
) -> Comparison:
    """Compare the calls of two stages (``result.graph`` vs ``result.onnx``) or two runs.

    Calls are matched by name or alias (module path of a ``call_module`` node, ONNX
    output names), the k-th call of a name in ``a`` with the k-th one in ``b``, within
    the same input set. The final outputs of each run are compared last.

    :param a: a stage, or a result (``stage`` picks one: ``graph``, else a common one)
    :param b: the other stage or result
    :param stage: stage name when comparing two results
    :param atol: absolute tolerance
    :param rtol: relative tolerance
    :return: a :class:`Comparison`; ``.first_divergence`` is what usually matters
    :raises TypeError, ValueError: not two stages nor two results; no common stage
    """
    stage_a, stage_b = _pick_stages(a, b, stage)
    comparison = Comparison(stage_a, stage_b, atol, rtol)
    index_b = _index_by_alias(stage_b)
    used: dict[tuple[int, str], int] = {}
    for call in stage_a.calls:
        match = None
        for alias in (*call.aliases, *call.weak_aliases):
            key = (call.run, alias)
            candidates = index_b.get(key)
            if candidates and used.get(key, 0) < len(candidates):
                match = (alias, candidates[used.get(key, 0)])
                used[key] = used.get(key, 0) + 1
                break
        if match is None:
            comparison.unmatched.append(call)
            continue
        alias, call_b = match
        value_a, value_b = call.retval, call_b.output_for(alias)
        weak = alias in call.weak_aliases or alias in call_b.weak_aliases
        if weak and not _fits(value_a, value_b):
            # A guess (last node of a module) that does not even have the module's
            # output structure: not a divergence, just no counterpart.
            comparison.unmatched.append(call)
            continue
        result = compare_summaries(value_a, value_b, atol, rtol)
        comparison.calls.append(
            CallComparison(
                call.name,
                call,
                call_b,
                value_a,
                value_b,
                result,
                stage_a.name,
                stage_b.name,
                call.run,
                atol,
                rtol,
            )
        )
    for run, (out_a, out_b) in enumerate(zip(stage_a.outputs, stage_b.outputs)):
        result = compare_summaries(out_a, out_b, atol, rtol)
        comparison.calls.append(
            CallComparison(
                "output",
                None,
                None,
                out_a,
                out_b,
                result,
                stage_a.name,
                stage_b.name,
                run,
                atol,
                rtol,
            )
        )
    return comparison


def first_divergence(
    a: TraceStage | RecordedStages,
    b: TraceStage | RecordedStages,
    *,
    stage: str | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
) -> CallComparison | None:
    """The first call whose outputs differ between ``a`` and ``b``, None if none does.

    Its ``repr`` prints both values side by side. See :func:`compare` for the arguments.
    """
    return compare(a, b, stage=stage, atol=atol, rtol=rtol).first_divergence
