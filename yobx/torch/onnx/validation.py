"""Validation of an exported model: onnxruntime against eager PyTorch."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import sympy
import torch
import torch.utils._pytree as pytree

from yobx.torch.onnx.sizes import example_assignment, inputs_for_sizes, size_variants
from yobx.torch.passes import MUTATIONS_KEY
from yobx.torch.pytree_paths import flatten_with_paths
from yobx.torch.tolerances import DEFAULT_ATOL, DEFAULT_RTOL
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
    :param check: for inputs breaking one of the model's runtime checks, the check's
        expression: onnxruntime must fail naming it (:attr:`error` says why it did not)
    """

    description: str
    outputs: list[OutputDiscrepancy]
    error: str | None = None
    skipped: bool = False
    check: str | None = None

    @property
    def max_abs_error(self) -> float:
        """Largest absolute error over the outputs."""
        return max((o.max_abs_error for o in self.outputs), default=0.0)


@dataclasses.dataclass
class ValidationReport:
    """Discrepancies between onnxruntime and eager PyTorch.

    ``print(report)`` shows a table: one line per case and output with its shape and
    errors, then the verdict and its reasons.

    :param cases: one per input set
    :param atol: absolute tolerance used by :attr:`ok`
    :param rtol: relative tolerance used by :attr:`ok`
    :param problems: reasons the validation cannot vouch for the model besides the
        cases themselves (a declared dynamic dimension that could not be varied)
    :param notes: what the validation could not observe without it being a failure
        (a runtime check no size inside the declared ranges breaks: it may hold for
        every size, such as a reshape's condition torch could not simplify)
    """

    cases: list[ValidationCase]
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

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
        return sum(not c.skipped and c.check is None for c in self.cases)

    @property
    def n_checks_fired(self) -> int:
        """Number of runtime checks onnxruntime was seen to enforce."""
        return sum(c.check is not None and c.error is None for c in self.cases)

    @property
    def ok(self) -> bool:
        """True when at least one input set was compared, every compared case ran, every
        output is within tolerance and nothing is in :attr:`problems` (input sets eager
        refused are skipped)."""
        if self.n_checked == 0 or self.problems:
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

    def reasons(self) -> list[str]:
        """Why :attr:`ok` is False (empty when it is True)."""
        reasons = list(self.problems)
        if self.n_checked == 0:
            reasons.append("no input set could be compared (eager refused them all)")
        for case in self.cases:
            if case.skipped:
                continue
            if case.error is not None:
                reasons.append(f"{case.description}: {case.error}")
                continue
            for out in case.outputs:
                if out.error is not None:
                    reasons.append(f"{case.description}: {out.name}: {out.error}")
                elif not out.within_tolerance:
                    reasons.append(
                        f"{case.description}: {out.name} differs from eager (max abs "
                        f"{out.max_abs_error:.3g} > atol {self.atol:g} + rtol {self.rtol:g})"
                    )
        return reasons

    def _rows(self) -> list[tuple[str, ...]]:
        rows = []
        for case in self.cases:
            if case.skipped:
                rows.append((case.description, "", "", "", "", f"skipped: {case.error}"))
            elif case.check is not None:
                status = f"WRONG: {case.error}" if case.error else "refused, naming the check"
                rows.append((case.description, "", "", "", "", status))
            elif case.error is not None:
                rows.append((case.description, "", "", "", "", f"FAILED: {case.error}"))
            for out in case.outputs:
                status = out.error or ("ok" if out.within_tolerance else "WRONG")
                rows.append(
                    (
                        case.description,
                        out.name,
                        "x".join(str(d) for d in out.shape) or "scalar",
                        f"{out.max_abs_error:.3g}",
                        f"{out.max_rel_error:.3g}",
                        status,
                    )
                )
        return rows

    def format(self) -> str:
        """Returns a readable table of the cases and outputs, then the verdict."""
        header = ("case", "output", "shape", "max abs", "max rel", "status")
        rows = self._rows()
        # the status column is the last one: never padded, so long messages stay whole
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
        lines = []
        for row in [header, *rows]:
            cells = [cell.ljust(width) for cell, width in zip(row, widths)]
            lines.append("  ".join([*cells, row[-1]]).rstrip())
        verdict = "ok" if self.ok else "NOT OK"
        fired = self.n_checks_fired
        checks = f", {fired} runtime checks enforced" if fired else ""
        lines.append(
            f"validation {verdict}: {self.n_checked} input sets compared{checks}, max abs "
            f"error {self.max_abs_error:.3g}, max rel error {self.max_rel_error:.3g} "
            f"(atol {self.atol:g}, rtol {self.rtol:g})"
        )
        lines.extend(f"  - {reason}" for reason in self.reasons())
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


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
    # an infinite or NaN expected value has no magnitude to scale the tolerance by (a
    # NaN one made every comparison false: NaN in both was a difference)
    magnitude = np.abs(np.where(np.isfinite(b), b, 0.0))
    rel = diff / (magnitude + 1e-5)
    within = bool(np.all(diff <= atol + rtol * magnitude))
    return OutputDiscrepancy(
        name, float(diff.max()), float(rel.max()), tuple(expected.shape), None, within
    )


def _session(onnx_model: Any):
    import onnxruntime

    if isinstance(onnx_model, onnxruntime.InferenceSession):
        return onnx_model
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
    # failures are reported in the validation report: onnxruntime's log would repeat them
    options.log_severity_level = 4
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


def onnx_feeds(
    model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any], onnx_names: Sequence[str]
) -> tuple[dict[str, np.ndarray], str | None]:
    """The inputs of the ONNX model for a call ``model(*args, **kwargs)``.

    The ONNX inputs are named after the flattened arguments (the capture's
    placeholders; the tensors of a cache after :mod:`yobx.torch.onnx.cache_names`);
    ints declared dynamic are inputs too, Python constants are not.

    :return: ``(feeds, None)`` or ``({}, reason)`` when an input has no value
    """
    from yobx.torch.onnx.cache_names import onnx_input_names
    from yobx.torch.tracing.inputs import (
        leaf_names,
        placeholder_names,
        register_cache_flattening,
    )

    bound = bind_arguments(model.forward, args, kwargs)
    values = list(bound.values())
    register_cache_flattening(values)
    leaves_with_path = flatten_with_paths(tuple(values))
    paths = [path for path, _ in leaves_with_path]
    # an input is named as the user wrote it (`input`, not torch.fx's `input_1`), the
    # tensors of a cache after their layer (keyed by the placeholders' names)
    flat_names = leaf_names(list(bound), paths)
    renamed = onnx_input_names(model, args, kwargs)
    by_name = {
        renamed.get(placeholder, name): leaf
        for placeholder, name, (_, leaf) in zip(
            placeholder_names(list(bound), paths), flat_names, leaves_with_path
        )
    }
    feeds = {}
    for name in onnx_names:
        if name not in by_name:
            return {}, f"no value for ONNX input {name!r} among the arguments {flat_names}"
        value = by_name[name]
        if isinstance(value, bool) or not isinstance(value, (torch.Tensor, int)):
            return {}, f"ONNX input {name!r} is a {type(value).__name__} in the call"
        feeds[name] = _to_numpy(value) if isinstance(value, torch.Tensor) else np.array(value)
    return feeds, None


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
    names = [i.name for i in session.get_inputs()]
    feeds, error = onnx_feeds(model, args, kwargs, names)
    if error is not None:
        return ValidationCase(description, [], error=error)
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
            expected_flat += _mutated_values(model, eager_args, eager_kwargs, mutations)
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
        from yobx.torch.onnx.runtime_checks import failed_check

        check = failed_check(str(exc))
        message = check if check is not None else str(exc).strip().splitlines()[0][:300]
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
) -> list[torch.Tensor]:
    """The values eager left in the inputs and buffers the ONNX model returns as extra
    outputs (``remove_inplace``'s mutation convention), cloned."""
    if not mutations:
        return []
    from yobx.torch.tracing.inputs import leaf_names

    bound = bind_arguments(model.forward, args, kwargs)
    leaves_with_path = flatten_with_paths(tuple(bound.values()))
    # a mutation's target is its placeholder's target: the argument's own name
    names = leaf_names(list(bound), [path for path, _ in leaves_with_path])
    by_name = {name: leaf for name, (_, leaf) in zip(names, leaves_with_path)}
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
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
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
    declared: Sequence[Any] = (),
    given: Sequence[Any] = (),
) -> ValidationReport:
    """Validates the result of :func:`to_onnx` on the example inputs and on inputs with
    other sizes: every dynamic dimension changed alone, then all together, inside the
    capture's constraints, and on the input sets ``given`` by the caller.

    :param declared: the dimensions the user declared dynamic
        (:class:`yobx.torch.onnx.declared.DeclaredDimension`); the report is not ok
        when one of them, still symbolic, kept its example size in every case compared
        (the given input sets count: their sizes are read from the ONNX inputs' named
        dimensions)
    :param given: more input sets (each a dict of keyword arguments, a tuple of
        positional ones, or a pair ``(args, kwargs)``), for the values random inputs
        of other sizes cannot hold: image tokens matching the images of a
        vision-language model, a grid of patches matching the patches
    """
    from yobx.torch.onnx.quantize import QUANTIZATION_KEY, computing_as

    quantization = result.model.metadata_props.get(QUANTIZATION_KEY)
    if quantization is None:
        return _validate_export(model, args, kwargs, result, captured, verbose, declared, given)
    # the quantized model computes what eager computes with the dequantized weights:
    # compared so, with the usual tolerances (a wrong graph is not hidden by the
    # quantization error)
    comparing = result.computing_as(model) if hasattr(result, "computing_as") else None
    with comparing or computing_as(model, result.model):
        report = _validate_export(model, args, kwargs, result, captured, 0, declared, given)
    exact = (
        ", the products computing in their inputs' float type (accuracy level 0: the "
        "level set is not exact by design)"
        if "accuracy level" in quantization
        else ""
    )
    report.notes.append(
        f"quantized ({quantization}): compared with the eager model on its weights "
        f"dequantized from the quantized model's{exact}"
    )
    if verbose:
        print(report.format())
    return report


def _validate_export(
    model: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any],
    result: Any,
    captured: Any,
    verbose: int,
    declared: Sequence[Any],
    given: Sequence[Any],
) -> ValidationReport:
    placeholder_values = [
        n.meta.get("val") for n in captured.graph_module.graph.nodes if n.op == "placeholder"
    ]
    inputs_list: list[Any] = [(tuple(args), dict(kwargs))]
    descriptions = ["example"]
    assignments: list[dict] = [{}]
    tracer = captured.tracer
    # the symbol of each named dimension (the ONNX inputs' dimensions carry the names)
    named = (
        {name: s.node.expr for name, s in tracer.dims.by_name.items()}
        if tracer is not None and tracer.dims is not None
        else None
    )
    if captured.shape_env is not None:
        conditions = (
            [fact.condition for fact in tracer.refinements.adopted]
            if tracer is not None and tracer.refinements is not None
            else []
        )
        assignments[0] = example_assignment(placeholder_values, captured.shape_env)
        for label, assignment in size_variants(
            placeholder_values, captured.shape_env, result.dimension_names, conditions, named
        ):
            inputs_list.append(
                inputs_for_sizes(
                    model, args, kwargs, placeholder_values, captured.shape_env, assignment
                )
            )
            descriptions.append(label)
            assignments.append(assignment)
    output = next(n for n in captured.graph_module.graph.nodes if n.op == "output")
    mutations = output.meta.get(MUTATIONS_KEY, ())
    # the file when the weights are outside it (past 2 GB), else the proto
    source = result.session_source() if hasattr(result, "session_source") else result.model_proto
    session = _session(source)
    for i, inputs in enumerate(given):
        given_args, given_kwargs = _split_inputs(inputs)
        inputs_list.append((given_args, given_kwargs))
        descriptions.append(f"given inputs {i + 1}")
        assignments.append(_given_assignment(model, session, given_args, given_kwargs, named or {}))
    report = validate(model, session, inputs_list, descriptions=descriptions, mutations=mutations)
    report.problems.extend(
        _unvaried_dimensions(declared, captured.shape_env, assignments, report.cases)
    )
    versions = getattr(captured.tracer, "versions", None)
    if versions:
        cases, problems = _version_cases(model, session, captured, versions, mutations)
        report.cases.extend(cases)
        report.problems.extend(problems)
    checks = getattr(result, "runtime_checks", None)
    if checks and captured.shape_env is not None:
        cases, notes = _check_cases(model, args, kwargs, session, captured, checks)
        report.cases.extend(cases)
        report.notes.extend(notes)
    if verbose:
        print(report.format())
    return report


def _given_assignment(
    model: torch.nn.Module, session: Any, args: tuple, kwargs: dict, named: Mapping
) -> dict:
    """The size of each named dynamic dimension in an input set, read from the ONNX
    inputs whose dimensions are named after it."""
    specs = session.get_inputs()
    feeds, error = onnx_feeds(model, args, kwargs, [spec.name for spec in specs])
    assignment: dict = {}
    if error is not None:
        return assignment
    for spec in specs:
        shape = feeds[spec.name].shape
        for dim, size in zip(spec.shape, shape):
            expr = named.get(dim) if isinstance(dim, str) else None
            if isinstance(expr, sympy.Symbol):
                assignment[expr] = sympy.Integer(size)
    return assignment


def _version_cases(
    model: torch.nn.Module,
    session: Any,
    captured: Any,
    versions: Sequence[Any],
    mutations: Sequence[Mapping[str, Any]],
) -> tuple[list[ValidationCase], list[str]]:
    """The cases of the versions other than the example's (see
    :mod:`yobx.torch.tracing.constraints.versions`): each version's own example, then its dimensions
    changed alone and together inside its conditions and constraints. A version no case
    could compare is a problem: the branch of the model choosing it was never run."""
    from yobx.torch.tracing.constraints.versions import in_dimensions

    cases: list[ValidationCase] = []
    problems: list[str] = []
    for version in versions:
        tracer = version.tracer
        if tracer.dims is captured.tracer.dims:
            continue  # the example's version: the cases above
        prefix = f"[version {version.index}: {version.when}]"
        placeholders = [n.meta.get("val") for n in version.graph.nodes if n.op == "placeholder"]
        shape_env = tracer.dims.shape_env
        conditions = [fact.condition for fact in tracer.refinements.adopted]
        conditions += [in_dimensions(tracer.dims, c.condition) for c in version.conditions]
        named = {name: s.node.expr for name, s in tracer.dims.by_name.items()}
        inputs = [((), dict(version.example), f"{prefix} example")]
        for label, assignment in size_variants(
            placeholders, shape_env, captured.dimension_names, conditions, named
        ):
            new_args, new_kwargs = inputs_for_sizes(
                model, (), version.example, placeholders, shape_env, assignment
            )
            inputs.append((new_args, new_kwargs, f"{prefix} {label}"))
        own = [
            _run_case(model, session, a, k, d, DEFAULT_ATOL, DEFAULT_RTOL, mutations)
            for a, k, d in inputs
        ]
        if not any(not c.skipped and c.error is None for c in own):
            problems.append(
                f"version {version.index} ({version.when}) was never compared: eager or "
                f"onnxruntime failed on every input set selecting it"
            )
        cases.extend(own)
    return cases, problems


def _check_cases(
    model: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any],
    session: Any,
    captured: Any,
    checks: Sequence[Any],
) -> tuple[list[ValidationCase], list[str]]:
    """One case per runtime check of the model: inputs breaking it (and no check before
    it), on which onnxruntime must fail naming it, and a note per check no sizes were
    found for. Such a check is not a failure: a check firing where it should not makes
    the compared cases fail, and one no size breaks is most often a condition that holds
    for every size (``8*n == 4*(n//4)*(2*n//(n//4))`` of a reshape in windows, which
    torch leaves unsimplified); the runtime keeps checking it."""
    import onnxruntime

    from yobx.torch.onnx.check_validation import ViolationSearch, check_fires, describe_moves
    from yobx.torch.onnx.sizes import inputs_with_sizes, sizes_for_assignment

    placeholders = [n for n in captured.graph_module.graph.nodes if n.op == "placeholder"]
    values = [n.meta.get("val") for n in placeholders]
    shape_env = captured.shape_env
    example = sizes_for_assignment(values, shape_env, example_assignment(values, shape_env))
    search = ViolationSearch(checks, values, [n.target for n in placeholders], shape_env, example)
    onnx_names = [i.name for i in session.get_inputs()]
    names_by_leaf = _onnx_names_by_leaf(model, args, kwargs, placeholders)
    # onnxruntime logs every failure it is expected to have here
    quiet = onnxruntime.RunOptions()
    quiet.log_severity_level = 4
    cases, notes = [], []
    for position, check in enumerate(checks):
        found = search.find(position)
        if found is None:
            notes.append(
                f"the runtime check `{check.expression}` was not exercised: no input sizes "
                f"inside the declared ranges were found that break it while keeping the "
                f"checks before it (it may hold for every size)"
            )
            continue
        sizes, moved, first = found
        moves = describe_moves(moved, captured.dimension_names, names_by_leaf)
        broken_args, broken_kwargs = inputs_with_sizes(model, args, kwargs, values, sizes)
        feeds, error = onnx_feeds(model, broken_args, broken_kwargs, onnx_names)
        # a check the earlier ones imply is never the first to fail: the first is named
        expected = checks[first]
        if error is None:
            _, error = check_fires(lambda feeds=feeds: session.run(None, feeds, quiet), expected)
        description = f"breaks `{check.expression}`: {moves}"
        if first != position:
            description += f" (and `{expected.expression}`, checked before)"
        cases.append(ValidationCase(description, [], error=error, check=check.expression))
    return cases, notes


def _onnx_names_by_leaf(
    model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any], placeholders: list
) -> list[str]:
    """The ONNX name of each input leaf, in order (the placeholder's name otherwise)."""
    from yobx.torch.onnx.cache_names import onnx_input_names

    renamed = onnx_input_names(model, args, kwargs)
    return [renamed.get(n.name, n.target) for n in placeholders]


def _unvaried_dimensions(
    declared: Sequence[Any], shape_env: Any, assignments: list[dict], cases: list
) -> list[str]:
    """The declared dimensions no compared case gave another size than the example."""
    problems = []
    compared = [
        assignment
        for assignment, case in zip(assignments, cases)
        if not case.skipped and case.error is None
    ][1:]
    seen: set[str] = set()
    for dim in declared:
        size = dim.size
        if not isinstance(size, torch.SymInt) or dim.spec.name in seen:
            continue
        seen.add(dim.spec.name)
        expr = shape_env.replace(size.node.expr)
        if expr.is_number:
            continue
        example = expr.xreplace(assignments[0])
        if not any(expr.xreplace(a) != example for a in compared):
            problems.append(
                f"dimension {dim.describe()} was never "
                f"compared at another size than the example's {example}: no other size "
                f"inside the constraints and the declared range was accepted by eager "
                f"PyTorch, so the model is only checked at that size"
            )
    return problems
