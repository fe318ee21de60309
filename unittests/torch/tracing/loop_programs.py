"""Random loops over a dynamic size, for differential tests of the tracer's scans.

:func:`loop_program` writes a module carrying one to three states through
``for i in range(...)`` over the first dimension ``n`` of its input (``range(n)``,
``range(1, n)``, ``range(n - 1)``, ``reversed(range(n))``, ``x.unbind(0)``): updates
reading ``x[i]``, states read by other states, states exchanged in Python
(``a, b = b, a``), values kept from the step before, a submodule, lists of one value
per step stacked or concatenated after the loop, writes into a buffer at the step's
index, the index as a number (``h + i``), a value of the last step returned by name
(``last = ...``), in-place updates, decisions on the index, and writes after the loop
into states that may still be views of the input (a loop of zero steps). :func:`traced_outcome`
traces it from ``n = 4`` and :func:`exported_outcome` exports it to ONNX; both compare
with eager at ``n`` = 4, 0, 1, 2, 3 and 6, on the outputs and on the input after the
call. Outcomes: ``correct`` (exact wherever the graph runs, a constraint it checks
refusing the other sizes), ``refused`` (a clear error while capturing), ``wrong``
(values, shapes or the written input differ) and ``crash`` (any other exception).
Used by ``_scripts/fuzz_loops.py`` and the tests.
"""

from __future__ import annotations

import os
import random
import tempfile

import numpy as np
import torch

from yobx.torch.tracing import CustomTracer, TracingError
from yobx.torch.tracing.constraints.constraints import ConstraintViolationError

_FOLDER = tempfile.mkdtemp(prefix="yobx_fuzz_loops_")
EXAMPLE = 4
SIZES = (4, 0, 1, 2, 3, 6)
RANGES = (
    "i in range(x.shape[0])",
    "i in range(1, x.shape[0])",
    "i in range(x.shape[0] - 1)",
    "i in reversed(range(x.shape[0]))",
    "row in x.unbind(0)",
)
#: the first value of a state (``{c}`` a constant); ``x[:1]...`` are views of ``x``
INITS = (
    "x[0] * {c}",
    "torch.zeros_like(x[0])",
    "x[:1].sum(0) * 0",
    "x[-1:].squeeze(0)",
    "x[:1][0]",
    # a constant and a parameter: the first step computes with them otherwise than the
    # steps after it read the state (it runs apart, before the scan)
    "torch.zeros(3) + {c}",
    "self.h0 * {c}",
)
#: one step's statements (``{a}``, ``{b}`` states, ``{c}`` a constant) and their
#: weights: the forms a scan takes come more often than those that unroll the loop
STEPS = {
    "{a} = {a} * {c} + x[i]": 6,
    "{a} = {a} + {b} * {c}": 4,
    "{a} = torch.tanh({a} + x[i] * {c})": 3,
    "{a} = {a} + x[i:i + 1].sum(0)": 2,
    "{a} = {a} + x[:, 0][i]": 2,
    "outs.append({a} * {c})": 3,
    "outs.append(x[i] + {a})": 2,
    "buf[i] = {a} * {c}": 3,
    "{a}, {b} = {b}, {a}": 1,
    "{a}, {b} = {b}, {a} + x[i]": 1,
    "prev = {a}": 1,
    "buf[i] = {a}": 1,
    "{a} = {a} + i": 1,
    # the index as a number in tensor operations, a value of the last step kept by name
    "{a} = {a} * {c} + x[i] * (i + 1)": 1,
    "{a} = ({a} - i) * {c} + x[i]": 1,
    "last = {a} * {c} + x[i]": 2,
    "{a} = {a} + (i % 2)": 1,
    "{a}.add_(x[i])": 1,
    "{a} = {a}.clone(); {a}[::2] = x[i, ::2]": 1,
    "if i == 0:\n                {a} = {a} * 2": 1,
    "{a} = x[i] if i == 0 else {a} * {c} + x[i]": 1,
    "{a} = torch.tanh(self.linear({a}) + x[i])": 3,
    "{a}, {b} = {a} + {b} * {c}, {b} * {c} + x[i]": 2,
    "for _ in range(2):\n                {a} = {a} * {c} + x[i]": 2,
    "outs.append(torch.cat([{a}, x[i]]))": 1,
    # the index plus an offset, chunks of a flat view at the index
    "{a} = {a} * {c} + x[i - 1]": 1,
    "{a} = {a} + x[i + 1] * {c}": 1,
    "buf[i - 1] = {a} * {c}": 1,
    "{a} = {a} + x.reshape(-1)[3 * i : 3 * i + 3] * {c}": 2,
    "flat[3 * i : 3 * (i + 1)] = {a} * {c}": 2,
}
#: statements that read the index otherwise than as ``x[i]``: not for ``row in ...``
_INDEXED = ("i % 2", "+ i", "- i", "(i + 1)", "[i]", "[i:", "[i,", "i ==", "[i -", "[i +", "3 * i")
#: what comes after the loop
AFTER = (
    "{a}.mul_({c})",
    "{a}[:1] = 0",
    "x.add_(1)",
    "",
    "",
    "",
)


def loop_program(rng: random.Random) -> tuple[type, str]:
    """A module with a random loop, and its source."""
    names = ["s0", "s1", "s2"][: rng.randint(1, 3)]

    def fill(template: str) -> str:
        a, b = rng.choice(names), rng.choice(names)
        return template.format(a=a, b=b, c=rng.choice((0.5, 2.0, -1.0)))

    lines = [f"{name} = {fill(rng.choice(INITS))}" for name in names]
    if rng.random() < 0.3:
        lines.append("last = x.sum(0) * 0.5")  # else no `last` without a step
    lines += [
        "outs = []",
        "buf = torch.zeros_like(x)",
        "flat = x.new_zeros(x.shape[0] * 3)",
        f"prev = {names[0]}",
    ]
    header = rng.choice(RANGES)
    lines.append(f"for {header}:")
    steps = rng.choices(list(STEPS), weights=list(STEPS.values()), k=rng.randint(1, 4))
    if header.startswith("row"):
        # the slice the step reads is `row`; other uses of an index do not apply
        steps = [t.replace("x[i]", "row") for t in steps]
        steps = [t for t in steps if not any(u in t for u in _INDEXED)] or ["s0 = s0 + row"]
    body = [fill(step) for step in steps]
    lines += ["    " + line for line in body]
    after = fill(rng.choice(AFTER))
    if after:
        lines.append(after)
    outputs = [*names, "prev", "buf", "flat", "x * 1"]
    if any(line.startswith("last =") for line in body):
        outputs.append("last")
    if any("outs.append" in line for line in body):
        join = rng.choice(("torch.stack(outs)", "torch.cat(outs)"))
        lines.append(f"stacked = {join} if outs else buf[:0]")
        lines.append("count = len(outs)")
        outputs += ["stacked", "stacked.sum() * 0 + count"]
    lines.append(f"return {', '.join(outputs)}")
    text = "\n        ".join(lines)
    source = (
        "class Program(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = torch.nn.Linear(3, 3)\n"
        "        self.h0 = torch.nn.Parameter(torch.randn(3))\n\n"
        f"    def forward(self, x):\n        {text}\n"
    )
    # a file of its own: the tracer reads the user's frames (code run from a string is
    # taken for internal code) and the messages name its lines
    filename = os.path.join(_FOLDER, f"program_{rng.getrandbits(48):012x}.py")
    with open(filename, "w") as f:
        f.write(source)
    namespace = {"torch": torch}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["Program"], source


def _same(expected: tuple, got: tuple) -> bool:
    if len(expected) != len(got):
        return False
    for e, g in zip(expected, got):
        g = torch.as_tensor(g)
        if tuple(e.shape) != tuple(g.shape) or not torch.allclose(e, g, atol=1e-5):
            return False
    return True


def _eager(model: torch.nn.Module, x: torch.Tensor) -> tuple | None:
    """Eager's outputs and the input after the call, None where eager fails."""
    try:
        outputs = model(x)
    except (IndexError, RuntimeError, UnboundLocalError):
        return None  # UnboundLocalError: `last` read after a loop of no step
    return (*(o.clone() for o in outputs), x)


def _compare(model: torch.nn.Module, run) -> tuple[str, str]:
    """Runs ``run(x)`` (the outputs and the input after the call) against eager at
    every size."""
    for n in SIZES:
        torch.manual_seed(n)
        x = torch.randn(n, 3)
        expected = _eager(model, x.clone())
        if expected is None:
            continue
        try:
            got = run(x.clone())
        except ConstraintViolationError:
            continue  # refused, naming the constraint
        except Exception as e:
            if "yobx check failed" in str(e):
                continue  # onnxruntime refusing the sizes, naming the check
            return "crash", f"n={n}: {type(e).__name__}: {str(e)[:400]}"
        if not _same(expected, got):
            return "wrong", f"n={n}"
    return "correct", ""


def traced_outcome(model: torch.nn.Module) -> tuple[str, str]:
    """``(outcome, detail)`` of tracing ``model`` and comparing it with eager."""
    try:
        tracer = CustomTracer()
        graph = tracer.trace(
            model,
            concrete_args={"x": torch.randn(EXAMPLE, 3)},
            dynamic_shapes={"x": {0: "n"}},
        )
    except TracingError:
        return "refused", ""
    except Exception as e:
        return "crash", f"trace: {type(e).__name__}: {str(e)[:400]}"
    module = torch.fx.GraphModule(tracer.traced_model, graph)

    def run(x):
        return (*module(x), x)

    return _compare(model, run)


def exported_outcome(model: torch.nn.Module) -> tuple[str, str]:
    """``(outcome, detail)`` of exporting ``model`` to ONNX and comparing onnxruntime
    with eager (ONNX does not write into its inputs: the model returns the final value
    of the input it writes after its outputs, compared with eager's input after the
    call; one it does not write must be as it came in)."""
    import onnxruntime

    from yobx.torch.onnx import to_onnx
    from yobx.torch.onnx.errors import OnnxExportError
    from yobx.torch.passes import MUTATIONS_KEY

    try:
        result = to_onnx(model, (torch.randn(EXAMPLE, 3),), dynamic_shapes=({0: "n"},))
    except (TracingError, OnnxExportError):
        return "refused", ""
    except Exception as e:
        return "crash", f"export: {type(e).__name__}: {str(e)[:400]}"
    try:
        session = onnxruntime.InferenceSession(
            result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )
    except Exception as e:
        return "crash", f"load: {type(e).__name__}: {str(e)[:400]}"
    name = session.get_inputs()[0].name
    output = next(n for n in result.graph_module.graph.nodes if n.op == "output")
    written = bool(output.meta.get(MUTATIONS_KEY, ()))

    def run(x):
        outputs = [torch.from_numpy(np.asarray(o)) for o in session.run(None, {name: x.numpy()})]
        return tuple(outputs) if written else (*outputs, x)

    return _compare(model, run)


def loop_outcomes(seed: int, count: int, check) -> list[tuple[str, str, str]]:
    """``(outcome, detail, source)`` of ``check`` (:func:`traced_outcome` or
    :func:`exported_outcome`) on the ``count`` programs of ``seed``, each module's
    weights seeded by its position."""
    rng = random.Random(seed)
    outcomes = []
    for index in range(count):
        cls, source = loop_program(rng)
        torch.manual_seed(index)
        kind, detail = check(cls())
        outcomes.append((kind, detail, source))
    return outcomes
