"""Random programs of :mod:`unittests.torch.tracing.program_generator` exported to ONNX
and compared with eager in onnxruntime, at the example's sizes and at other sizes.

An outcome is ``correct`` (onnxruntime equals eager at every size compared),
``refused`` (:func:`yobx.torch.onnx.to_onnx` raised), ``narrowed`` (some sizes are
outside the constraints the export reported, and onnxruntime refused them with an error
naming the broken check), ``eager_failed``, ``unstable`` (onnxruntime differs from eager
only where eager in float32 differs as much from eager in float64: a sum of thousands
of terms times a large factor, whose float32 value depends on the order of the
additions) or ``wrong``: onnxruntime failed or differed from eager on inputs inside the
reported constraints, or returned values differing from eager's outside them (the
model's runtime checks let them through). ``wrong`` must never happen.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings

import numpy as np
import onnxruntime
import torch
import torch.utils._pytree as pytree

from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.runtime_checks import CHECK_NODE_PREFIX
from yobx.torch.onnx.validation import DEFAULT_ATOL, DEFAULT_RTOL, validate
from yobx.torch.passes import MUTATIONS_KEY

from ..tracing.program_generator import Program
from ..tracing.program_harness import _CONSTRAINT_FUNCTIONS, _quiet_fake_tensor_log


@dataclasses.dataclass
class OnnxOutcome:
    """What happened to one program.

    :param kind: ``correct``, ``refused``, ``narrowed``, ``eager_failed``, ``unstable``
        or ``wrong``
    :param program: the program
    :param message: the error or the difference
    :param checked: size sets compared
    """

    kind: str
    program: Program
    message: str = ""
    checked: int = 0

    def report(self) -> str:
        """The outcome, its message and the program."""
        return f"# {self.kind}: {self.message}\n{self.program.describe()}"


def constraint_holds(expression: str, dims: dict[str, int]) -> bool | None:
    """Evaluates a reported constraint at ``dims`` (None if it cannot): sympy's and
    Python's spellings of min and max both appear in the rendered constraints."""
    functions = {**_CONSTRAINT_FUNCTIONS, "max": max, "min": min, "abs": abs}
    try:
        value = eval(expression, {"__builtins__": {}}, {**functions, **dims})
    except Exception:
        return None
    return bool(value) if isinstance(value, (bool, int)) else None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def run_onnx_program(program: Program, sizes: int = 3) -> OnnxOutcome:
    """Exports ``program`` with its dynamic shapes and compares onnxruntime with eager
    at ``sizes`` size sets (the example's first)."""
    module = program.module()
    example = program.example_inputs()
    with warnings.catch_warnings(), _quiet_fake_tensor_log():
        warnings.simplefilter("ignore")
        try:
            module(**program.example_inputs())
        except Exception as e:
            return OnnxOutcome("eager_failed", program, _first_line(e))
        try:
            result = to_onnx(module, (), example, dynamic_shapes=program.dynamic_shapes)
        except Exception as e:
            return OnnxOutcome("refused", program, _first_line(e))
        expressions = [getattr(c, "expression", None) for c in result.constraints]
        output = next(n for n in result.graph_module.graph.nodes if n.op == "output")
        mutations = output.meta.get(MUTATIONS_KEY, ())
        checked, narrowed = 0, ""
        for dims in program.size_sets[:sizes]:
            # sizes outside a constraint (or where one cannot be evaluated): the model
            # must refuse them naming a check, or compute what eager computes
            broken = [e for e in expressions if e and constraint_holds(e, dims) is not True]
            inputs = [((), program.make_inputs(dims))]
            report = validate(module, result, inputs, mutations=mutations)
            case = report.cases[0]
            if case.skipped:
                continue
            if broken and case.error is not None and CHECK_NODE_PREFIX in case.error:
                narrowed = f"at {dims}: outside the constraint `{broken[0]}`, refused"
                continue
            if not report.ok:
                where = f" (outside `{broken[0]}`)" if broken else ""
                message = f"at {dims}{where}: " + "; ".join(report.reasons())[:500]
                if case.error is None and _undetermined(program, result, dims, mutations):
                    return OnnxOutcome("unstable", program, message, checked)
                return OnnxOutcome("wrong", program, message, checked)
            checked += 1
    if narrowed:
        return OnnxOutcome("narrowed", program, narrowed, checked)
    return OnnxOutcome("correct", program, "", checked)


def _undetermined(program: Program, result, dims: dict[str, int], mutations) -> bool:
    """Whether eager itself is undetermined where onnxruntime differs from it, output by
    output (outputs first, then the inputs the program writes, as the ONNX model returns
    them): eager in float32 differs, out of tolerance, from a float64 copy of the
    program, and onnxruntime is no further from that float64 reference than twice eager
    in float32 is (two orders of additions of the same float32 sum)."""
    inputs = program.make_inputs(dims)
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    got = session.run(None, {i.name: inputs[i.name].numpy() for i in session.get_inputs()})
    references = []
    for dtype in (torch.float32, torch.float64):
        model = copy.deepcopy(program.module()).to(dtype)
        cast = {
            k: v.clone().to(dtype) if v.is_floating_point() else v.clone()
            for k, v in inputs.items()
        }
        with torch.no_grad():
            values = [v for v in pytree.tree_leaves(model(**cast)) if v is not None]
        for mutation in mutations:
            if mutation["kind"] != "USER_INPUT_MUTATION":
                return False
            values.append(cast[mutation["target"]])
        references.append(values)
    if not (len(got) == len(references[0]) == len(references[1])):
        return False
    for onnx_value, single, double in zip(got, *references):
        onnx_value = onnx_value.astype(np.float64)
        single = single.numpy().astype(np.float64)
        double = double.numpy().astype(np.float64)
        tolerance = DEFAULT_ATOL + DEFAULT_RTOL * np.abs(single)
        if not (np.abs(onnx_value - single) > tolerance).any():
            continue
        eager_error = np.abs(single - double)
        if not (eager_error > tolerance).any():
            return False  # eager is determined here: the difference is onnxruntime's
        if np.abs(onnx_value - double).max() > 2 * eager_error.max():
            return False
    return True
