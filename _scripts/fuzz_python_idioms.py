"""Differential fuzzing of Python idioms on sizes: lists repeated by a size, numpy's
functions of sizes, ``torch.linspace`` between sizes, ``list(range(n))``.

Each program chains one to three snippets (``torch.tensor([1.5] * n)``,
``sum([1.0] * n)``, ``np.sqrt(n * 4)``, ``torch.cat([out] * n)``, a list written into...)
on an input whose first dimension ``n`` is dynamic, is traced from ``n = 3`` and compared
with eager at ``n`` = 3, 1, 2, 5 and 7. Outcomes: ``correct`` (exact wherever the graph
runs, a constraint it checks refusing the other sizes), ``refused`` (a clear
:class:`~yobx.torch.tracing.TracingError` while tracing), ``wrong`` (values or shapes
differ: printed in full) and ``crash`` (any other exception: printed)::

    python _scripts/fuzz_python_idioms.py [--count 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import torch

from yobx.torch.tracing import CustomTracer, TracingError
from yobx.torch.tracing.constraints.constraints import ConstraintViolationError

#: the statements a program chains, each reading ``x`` and updating ``out``
SNIPPETS = (
    "v = torch.tensor([1.5] * x.shape[0]); out = out + v[:, None]",
    "v = torch.tensor(x.shape[0] * [[1.0, 2.0]]); out = out + v.sum()",
    "out = out + len([0] * x.shape[0])",
    "out = out + len([0, 1] * x.shape[0])",
    "out = torch.cat([out] * 2, 0)[: out.shape[0]]",
    "out = out + torch.cat([out] * x.shape[0], 0).sum()",
    "out = out + torch.stack([out] * x.shape[0], 0).mean(0)",
    "out = out + sum([1.0] * x.shape[0])",
    "l = [2.0] * x.shape[0]; l.append(1.0); out = out + len(l)",
    "l = [2.0] * x.shape[0]; out = out + l[0]",
    "out = out * float(np.sqrt(x.shape[0] * 4))",
    "out = out + np.floor(x.shape[0] / 3)",
    "out = out + np.maximum(x.shape[0], 3)",
    "out = out + np.cos(x.shape[0])",
    "out = out + torch.linspace(0, x.shape[0], x.shape[0] + 1)[: x.shape[0], None]",
    "out = out + torch.linspace(-x.shape[0] / 2, x.shape[0] / 2, x.shape[0])[:, None]",
    "out = out + bool([0] * x.shape[0])",
    "out = out + (1 if [0] * x.shape[0] == [0, 0] else 0)",
    "out = out + max([1] * x.shape[0] + [0])",
    "out = out + math.exp(x.shape[0] / 10)",
    "out = out + torch.tensor(list(range(x.shape[0]))[::-1], dtype=out.dtype)[:, None]",
    "out = out * torch.as_tensor(list(range(1, x.shape[0] + 1)), dtype=torch.float32)[:, None]",
    "out = out + len(list(range(x.shape[0]))[:])",
    "l = list(range(x.shape[0])); l.append(0); out = out + len(l)",
    "out = out + sum(list(range(x.shape[0])))",
    "out = out + (3 if list(range(x.shape[0] - 1)) else 4)",
    "out = out + max(list(range(x.shape[0])) + [0])",
)
SIZES = (3, 1, 2, 5, 7)


def program(rng: random.Random) -> tuple[type, str]:
    """A module chaining random snippets, and its source."""
    snippets = rng.sample(SNIPPETS, rng.randint(1, 3))
    body = "\n        ".join(["out = x * 1.0", *snippets, "return out"])
    source = f"class Program(torch.nn.Module):\n    def forward(self, x):\n        {body}\n"
    namespace = {"torch": torch, "np": np, "math": math}
    exec(source, namespace)
    return namespace["Program"], source


def outcome(model: torch.nn.Module) -> tuple[str, str]:
    """``(outcome, detail)`` of tracing ``model`` and comparing it with eager."""
    try:
        tracer = CustomTracer()
        graph = tracer.trace(
            model, concrete_args={"x": torch.randn(3, 4)}, dynamic_shapes={"x": {0: "n"}}
        )
    except TracingError:
        return "refused", ""
    except Exception as e:
        return "crash", f"trace: {type(e).__name__}: {e}"
    module = torch.fx.GraphModule(tracer.traced_model, graph)
    for n in SIZES:
        x = torch.randn(n, 4)
        expected = model(x)
        try:
            got = module(x)
        except ConstraintViolationError:
            continue  # refused, naming the constraint
        except Exception as e:
            return "crash", f"n={n}: {type(e).__name__}: {e}"
        if got.shape != expected.shape or not torch.allclose(got, expected, atol=1e-4):
            return "wrong", f"n={n}"
    return "correct", ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200, help="number of programs")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    rng = random.Random(args.seed)
    counts = dict.fromkeys(("correct", "refused", "wrong", "crash"), 0)
    for _ in range(args.count):
        cls, source = program(rng)
        kind, detail = outcome(cls())
        counts[kind] += 1
        if kind in ("wrong", "crash"):
            print(f"{kind.upper()} {detail}\n{source}")
    print(f"{args.count} programs: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 1 if counts["wrong"] or counts["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
