"""Validation of an exported model: onnxruntime against eager PyTorch."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch
import torch.utils._pytree as pytree

from yobx.torch.onnx.sizes import inputs_for_sizes, size_variants
from yobx.torch.passes import MUTATIONS_KEY
from yobx.torch.tracing.inputs import bind_arguments


@dataclasses.dataclass
class OutputDiscrepancy:
    """Discrepancy of one output.

    :param name: ONNX output name
    :param max_abs_error: max absolute difference
    :param max_rel_error: max of ``|onnx - torch| / (|torch| + 1e-5)``
    :param shape: shape of the expected output
    :param error: a shape or type mismatch, when there is one
    :param within_tolerance: every element satisfies ``|onnx - torch| <= atol + rtol *
        |torch|``
    """

    name: str
    max_abs_error: float
    max_rel_error: float
    shape: tuple[int, ...]
    error: str | None = None
    within_tolerance: bool = True


@dataclasses.dataclass
class ValidationCase:
    """One set of inputs and the discrepancies of the outputs it gave.

    :param description: ``example`` or the sizes that changed (``batch=5``)
    :param outputs: one discrepancy per output
    :param error: set when onnxruntime failed, or when the case could not run
    :param skipped: eager PyTorch refused these inputs (the model does not accept them)
    """

    description: str
    outputs: list[OutputDiscrepancy]
    error: str | None = None
    skipped: bool = False

    @property
    def max_abs_error(self) -> float:
        """Largest absolute error over the outputs."""
        return max((o.max_abs_error for o in self.outputs), default=0.0)


@dataclasses.dataclass
class ValidationReport:
    """Discrepancies between onnxruntime and eager PyTorch.

    :param cases: one per input set
    :param atol: absolute tolerance used by :attr:`ok`
    :param rtol: relative tolerance used by :attr:`ok`
    """

    cases: list[ValidationCase]
    atol: float = 1e-4
    rtol: float = 1e-4

    @property
    def max_abs_error(self) -> float:
        """Largest absolute error over all cases and outputs."""
        return max((c.max_abs_error for c in self.cases if not c.skipped), default=0.0)

    @property
    def max_rel_error(self) -> float:
        """Largest relative error over all cases and outputs."""
        return max(
            (o.max_rel_error for c in self.cases if not c.skipped for o in c.outputs),
            default=0.0,
        )

    @property
    def n_checked(self) -> int:
        """Number of input sets compared."""
        return sum(not c.skipped for c in self.cases)

    @property
    def ok(self) -> bool:
        """True when every case ran and every output is within tolerance."""
        if self.n_checked == 0:
            return False
        for case in self.cases:
            if case.skipped:
                continue
            if case.error is not None:
                return False
            for out in case.outputs:
                if out.error is not None or not out.within_tolerance:
                    return False
        return True

    def format(self) -> str:
        """Returns a readable table of the cases and outputs."""
        lines = []
        for case in self.cases:
            if case.skipped:
                lines.append(f"{case.description}: skipped ({case.error})")
                continue
            if case.error is not None:
                lines.append(f"{case.description}: FAILED {case.error}")
                continue
            for out in case.outputs:
                status = out.error or (
                    f"max abs {out.max_abs_error:.3g}, max rel {out.max_rel_error:.3g}"
                )
                lines.append(f"{case.description}: {out.name} {list(out.shape)} {status}")
        return "\n".join(lines)


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _compare(
    name: str, got: np.ndarray, expected: Any, atol: float, rtol: float
) -> OutputDiscrepancy:
    expected = _to_numpy(expected)
    got = np.asarray(got)
    if tuple(got.shape) != tuple(expected.shape):
        return OutputDiscrepancy(
            name,
            float("inf"),
            float("inf"),
            tuple(expected.shape),
            f"shape {list(got.shape)} != expected {list(expected.shape)}",
        )
    if expected.size == 0:
        return OutputDiscrepancy(name, 0.0, 0.0, tuple(expected.shape))
    a = got.astype(np.float64)
    b = expected.astype(np.float64)
    both_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    both_nan = np.isnan(a) & np.isnan(b)
    diff = np.where(both_inf | both_nan, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(diff), np.inf, diff)
    magnitude = np.abs(np.where(np.isinf(b), 0.0, b))
    rel = diff / (magnitude + 1e-5)
    within = bool(np.all(diff <= atol + rtol * magnitude))
    return OutputDiscrepancy(
        name, float(diff.max()), float(rel.max()), tuple(expected.shape), None, within
    )


def _session(onnx_model: Any):
    import onnxruntime

    if hasattr(onnx_model, "model_proto"):
        onnx_model = onnx_model.model_proto
    if isinstance(onnx_model, (str, os.PathLike)):
        source = os.fspath(onnx_model)
    else:
        if not isinstance(onnx_model, onnx.ModelProto):
            import onnx_ir as ir

            onnx_model = ir.to_proto(onnx_model)
        source = onnx_model.SerializeToString()
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _split_inputs(inputs: Any) -> tuple[tuple, dict]:
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if (
        isinstance(inputs, tuple)
        and len(inputs) == 2
        and isinstance(inputs[0], (tuple, list))
        and isinstance(inputs[1], Mapping)
    ):
        return tuple(inputs[0]), dict(inputs[1])
    return tuple(inputs), {}


def _run_case(
    model: torch.nn.Module,
    session: Any,
    args: tuple,
    kwargs: dict,
    description: str,
    atol: float,
    rtol: float,
    mutations: Sequence[Mapping[str, Any]] = (),
) -> ValidationCase:
    bound = bind_arguments(model.forward, args, kwargs)
    flat = [v for v in pytree.tree_leaves(list(bound.values())) if isinstance(v, torch.Tensor)]
    onnx_inputs = session.get_inputs()
    if len(onnx_inputs) > len(flat):
        return ValidationCase(
            description,
            [],
            error=f"the model has {len(onnx_inputs)} inputs, {len(flat)} tensors were given",
        )
    # Inputs the optimizer found unused may be gone; ONNX inputs keep the order of the
    # flat tensors, so they are matched by name when the names are known.
    feeds = {}
    names = [i.name for i in onnx_inputs]
    if len(onnx_inputs) == len(flat):
        feeds = {name: _to_numpy(t) for name, t in zip(names, flat)}
    else:
        return ValidationCase(
            description, [], error="some flat inputs were removed from the ONNX model"
        )
    # The model may update its inputs (a cache) or its buffers in place: it runs on
    # copies of the inputs, and its buffers are restored afterwards.
    eager_args, eager_kwargs = pytree.tree_map_only(
        torch.Tensor, lambda t: t.clone(), (args, kwargs)
    )
    saved_buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        with torch.no_grad():
            expected = model(*eager_args, **eager_kwargs)
            expected_flat = [v for v in pytree.tree_leaves(expected) if v is not None]
            expected_flat += _mutated_values(model, eager_args, eager_kwargs, mutations, names)
    except Exception as exc:
        return ValidationCase(
            description, [], error=f"eager: {type(exc).__name__}: {exc}", skipped=True
        )
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name in saved_buffers:
                    buffer.copy_(saved_buffers[name])
    try:
        got = session.run(None, feeds)
    except Exception as exc:
        message = str(exc).strip().splitlines()[0][:300]
        return ValidationCase(description, [], error=f"onnxruntime: {message}")
    output_names = [o.name for o in session.get_outputs()]
    if len(got) != len(expected_flat):
        return ValidationCase(
            description,
            [],
            error=f"{len(got)} ONNX outputs but eager returned {len(expected_flat)}",
        )
    outputs = [_compare(n, g, e, atol, rtol) for n, g, e in zip(output_names, got, expected_flat)]
    return ValidationCase(description, outputs)


def _mutated_values(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    mutations: Sequence[Mapping[str, Any]],
    input_names: list[str],
) -> list[torch.Tensor]:
    """The values eager left in the inputs and buffers the ONNX model returns as extra
    outputs (``remove_inplace``'s mutation convention), cloned."""
    if not mutations:
        return []
    bound = bind_arguments(model.forward, args, kwargs)
    flat = [v for v in pytree.tree_leaves(list(bound.values())) if isinstance(v, torch.Tensor)]
    by_name = dict(zip(input_names, flat))
    values = []
    for mutation in mutations:
        if mutation["kind"] == "BUFFER_MUTATION":
            values.append(model.get_buffer(mutation["target"]).detach().clone())
        else:
            values.append(by_name[mutation["target"]].detach().clone())
    return values


def validate(
    model: torch.nn.Module,
    onnx_model: Any,
    inputs_list: Sequence[Any],
    *,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    descriptions: Sequence[str] | None = None,
    mutations: Sequence[Mapping[str, Any]] = (),
) -> ValidationReport:
    """Runs onnxruntime and eager PyTorch on each input set and compares the outputs.

    :param model: the eager model
    :param onnx_model: ``onnx.ModelProto``, ``onnx_ir.Model``, a file name or the result
        of :func:`to_onnx`
    :param inputs_list: input sets; each is a tuple of positional arguments, a dict of
        keyword arguments, or a pair ``(args, kwargs)``
    :param atol: absolute tolerance for :attr:`ValidationReport.ok`
    :param rtol: relative tolerance for :attr:`ValidationReport.ok`
    :param descriptions: a label per input set
    :param mutations: the inputs and buffers the model writes, whose final values the
        ONNX model returns after the model's outputs (``output.meta["yobx_mutations"]``
        of the exported graph: ``kind``, ``target``); eager's values are compared to them
    :return: the report, one case per input set
    """
    session = _session(onnx_model)
    cases = []
    for i, inputs in enumerate(inputs_list):
        args, kwargs = _split_inputs(inputs)
        description = descriptions[i] if descriptions else f"inputs {i}"
        cases.append(_run_case(model, session, args, kwargs, description, atol, rtol, mutations))
    return ValidationReport(cases, atol=atol, rtol=rtol)


def validate_export(
    model: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any],
    result: Any,
    captured: Any,
    verbose: int = 0,
) -> ValidationReport:
    """Validates the result of :func:`to_onnx` on the example inputs and on inputs with
    other sizes for every dynamic dimension."""
    placeholder_values = [
        n.meta.get("val") for n in captured.graph_module.graph.nodes if n.op == "placeholder"
    ]
    inputs_list: list[Any] = [(tuple(args), dict(kwargs))]
    descriptions = ["example"]
    if captured.shape_env is not None:
        tracer = captured.tracer
        conditions = (
            [fact.condition for fact in tracer.refinements.adopted]
            if tracer is not None and tracer.refinements is not None
            else []
        )
        named = (
            {name: s.node.expr for name, s in tracer.dims.by_name.items()}
            if tracer is not None and tracer.dims is not None
            else None
        )
        for label, assignment in size_variants(
            placeholder_values, captured.shape_env, result.dimension_names, conditions, named
        ):
            inputs_list.append(
                inputs_for_sizes(
                    model, args, kwargs, placeholder_values, captured.shape_env, assignment
                )
            )
            descriptions.append(label)
    output = next(n for n in captured.graph_module.graph.nodes if n.op == "output")
    mutations = output.meta.get(MUTATIONS_KEY, ())
    # the file when the weights are outside it (past 2 GB), else the proto
    source = result.session_source() if hasattr(result, "session_source") else result.model_proto
    report = validate(model, source, inputs_list, descriptions=descriptions, mutations=mutations)
    if verbose:
        print(report.format())
    return report
