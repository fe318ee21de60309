"""Random programs of :mod:`unittests.torch.tracing.program_generator` exported to ONNX
and compared with eager in onnxruntime, at the example's sizes and at other sizes.

An outcome is ``correct`` (onnxruntime equals eager at every size compared),
``refused`` (:func:`yobx.torch.onnx.to_onnx` raised), ``narrowed`` (some sizes are
outside the constraints the export reported, and onnxruntime refused them with an error
naming the broken check), ``eager_failed`` or ``wrong``: onnxruntime failed or differed
from eager on inputs inside the reported constraints, or returned values differing from
eager's outside them (the model's runtime checks let them through). ``wrong`` must never
happen.
"""

from __future__ import annotations

import dataclasses
import warnings

from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.runtime_checks import CHECK_NODE_PREFIX
from yobx.torch.onnx.validation import validate
from yobx.torch.passes import MUTATIONS_KEY

from ..tracing.program_generator import Program
from ..tracing.program_harness import _CONSTRAINT_FUNCTIONS, _quiet_fake_tensor_log


@dataclasses.dataclass
class OnnxOutcome:
    """What happened to one program.

    :param kind: ``correct``, ``refused``, ``narrowed``, ``eager_failed`` or ``wrong``
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
                return OnnxOutcome("wrong", program, message, checked)
            checked += 1
    if narrowed:
        return OnnxOutcome("narrowed", program, narrowed, checked)
    return OnnxOutcome("correct", program, "", checked)
