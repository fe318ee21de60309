"""Random cache steps whose decisions on sizes give versions that compute alike or not,
captured and exported to ONNX, compared with eager at every side of each decision.

Each program takes ``x`` (batch, seq, 4) and ``cache`` (batch, past, 4), makes one to
three decisions on ``seq`` and ``past`` (some compute the same number on both sides, as
transformers' ``get_seq_length`` does for an empty cache, some change the computation)
and runs a random chain of operators on the cache and the new rows, among them operators
whose behaviour depends on a size of 1 or 0 (``squeeze``, ``chunk``, slices, reductions
over an empty axis). The versions the tracer captures are merged where they compute
alike (:mod:`yobx.torch.tracing.constraints.version_merging`); the fuzzer checks that
the joined graph (``CustomTracer(runtime_checks=False)``) and the ONNX model still
compute what eager computes, on sizes selecting every version: ``seq`` and ``past`` at
0, 1 and more. A decision beyond the budget of versions stays a constraint, unchecked in
that graph: a size breaking it counts as narrowed when the same capture with its checks
refuses it.

::

    python _scripts/fuzz_version_merging.py --count 300 [--start 0] [--show] [--make-fx]

prints the outcome counts: ``correct``, ``narrowed`` (onnxruntime refused sizes with an
error naming a check of the model), ``refused`` (the export raised), ``wrong`` (a value
differs from eager, or onnxruntime failed otherwise: must never happen), and how many
programs had versions merged. ``--make-fx`` lowers every node through make_fx
(``to_onnx(direct_lowering=False)``), whose kernels take decisions on each version's
example that the direct rules do not: the export judges them
(:mod:`yobx.torch.onnx.version_guards`).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: decisions: (source, computes the same on both sides)
DECISIONS = [
    "n{k} = 0 if cache.numel() == 0 else cache.shape[1]",
    "n{k} = 0 if cache.shape[1] == 0 else cache.shape[1]",
    "n{k} = 1 if x.shape[1] == 1 else x.shape[1]",
    "n{k} = x.shape[1] if x.shape[1] > 1 else 1",
    "n{k} = 1 if (x.shape[1] > 1 and mask is None) else 0",
    "n{k} = 2 if x.shape[1] == 1 else 1",
    "n{k} = 3 if cache.shape[1] == 0 else 1",
]

#: operators on ``h`` (batch, rows, 4); ``{n}`` is a number a decision computed
OPERATORS = [
    "h = h * {n}",
    "h = h + {n}",
    "h = h + torch.arange({n}, {n} + h.shape[1], dtype=h.dtype)[None, :, None]",
    "h = h.squeeze(1).reshape(h.shape[0], -1, 4)",
    "h = h.softmax(dim=1)",
    "h = h.cumsum(dim=1)",
    "h = h.flip(1)",
    "h = h[:, -1:, :] + h.sum(dim=1, keepdim=True)",
    "h = h - h.mean(dim=1, keepdim=True)",
    "h = torch.nn.functional.pad(h, (0, 0, 1, 0))",
    "h = h.chunk(2, dim=1)[0] if h.shape[1] > 1 else h",
    "h = h[:, h.shape[1] - x.shape[1]:, :] * 2",
    "h = torch.cat([h, x], dim=1)",
    "h = h + h.amax(dim=-1, keepdim=True)",
    "h = (h > 0).to(h.dtype) * h + {n}",
    "h = h.transpose(1, 2).contiguous().transpose(1, 2)",
    "h = h * (torch.arange(h.shape[1])[None, :, None] >= {n})",
]

#: (batch, seq, past) compared: every side of the decisions above
SIZES = [(2, 3, 5), (2, 3, 0), (1, 1, 0), (3, 1, 4), (2, 5, 1), (1, 2, 0), (2, 1, 1), (1, 4, 2)]


def generate(seed: int) -> str:
    """The source of a random program."""
    rng = random.Random(seed)
    lines = ["def forward(self, x, cache, mask=None):"]
    numbers = []
    for k in range(rng.randint(1, 3)):
        lines.append("    " + rng.choice(DECISIONS).format(k=k))
        numbers.append(f"n{k}")
    lines.append("    h = torch.cat([cache, x], dim=1)")
    for _ in range(rng.randint(2, 6)):
        lines.append("    " + rng.choice(OPERATORS).format(n=rng.choice(numbers)))
    lines.append(f"    return h, x + {rng.choice(numbers)}")
    return "\n".join(lines)


def module_of(source: str):
    import torch

    namespace: dict = {"torch": torch}
    exec(source, namespace)
    return type("Program", (torch.nn.Module,), {"forward": namespace["forward"]})()


def inputs(batch: int, seq: int, past: int, seed: int = 0) -> dict:
    import torch

    generator = torch.Generator().manual_seed(seed + 100 * batch + 10 * seq + past)
    return {
        "x": torch.randn(batch, seq, 4, generator=generator),
        "cache": torch.randn(batch, past, 4, generator=generator),
    }


DIMS = {"x": {0: "batch", 1: "seq"}, "cache": {0: "batch", 1: "past"}}


def _close(expected, got) -> bool:
    import numpy as np

    expected = [e.detach().numpy() for e in expected]
    if len(expected) != len(got):
        return False
    return all(
        e.shape == g.shape and np.allclose(e, g, atol=1e-4, rtol=1e-4, equal_nan=True)
        for e, g in zip(expected, got)
    )


def _checked_refusal(model, tracer, sizes: tuple) -> str | None:
    """The first line of the error the capture with runtime checks raises at ``sizes``
    (None when it raises none) when ``tracer`` (without checks) left constraints."""
    import torch

    from yobx.torch.tracing import ConstraintViolationError, CustomTracer

    if not tracer.constraints:
        return None
    checked = CustomTracer()
    graph = checked.trace(model, concrete_args=inputs(*SIZES[0]), dynamic_shapes=DIMS)
    try:
        torch.fx.GraphModule(checked.traced_model, graph)(**inputs(*sizes))
    except ConstraintViolationError as e:
        return str(e).splitlines()[0][:200]
    return None


def run(seed: int, direct_lowering: bool = True) -> tuple[str, str, int]:
    """``(outcome, message, merged versions)`` of the program of ``seed``
    (``direct_lowering``: see :func:`~yobx.torch.onnx.to_onnx`)."""
    import onnxruntime
    import torch

    from yobx.torch.onnx import to_onnx
    from yobx.torch.onnx.runtime_checks import CHECK_NODE_PREFIX
    from yobx.torch.tracing import CustomTracer

    source = generate(seed)
    model = module_of(source)
    example = inputs(*SIZES[0])
    try:
        model(**example)
    except Exception:
        return "eager_failed", "", 0
    tracer = CustomTracer(runtime_checks=False)
    try:
        graph = tracer.trace(model, concrete_args=inputs(*SIZES[0]), dynamic_shapes=DIMS)
    except Exception as e:
        return "refused", f"trace: {type(e).__name__}: {str(e).splitlines()[0][:200]}", 0
    merged = sum(v.computed_by is not None for v in tracer.versions)
    module = torch.fx.GraphModule(tracer.traced_model, graph)
    try:
        result = to_onnx(
            model, (), inputs(*SIZES[0]), dynamic_shapes=DIMS, direct_lowering=direct_lowering
        )
    except Exception as e:
        return "refused", f"to_onnx: {type(e).__name__}: {str(e).splitlines()[0][:200]}", merged
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    narrowed = ""
    for sizes in SIZES:
        case = inputs(*sizes)
        try:
            with torch.no_grad():
                expected = model(**case)
        except Exception:
            continue
        try:
            got = module(**inputs(*sizes))
            differs = "" if _close(expected, [g.detach().numpy() for g in got]) else "differs"
        except Exception as e:
            differs = f"{type(e).__name__}: {e}"
        if differs:
            # the graph checks nothing: right only where the tracer left no constraint
            # (a decision beyond the budget of versions stays one, which the same
            # capture with its checks refuses)
            refusal = _checked_refusal(model, tracer, sizes)
            if refusal is None:
                return "wrong", f"graph at {sizes}: {differs}"[:300], merged
            narrowed = f"at {sizes}: {refusal}"
        try:
            out = session.run(None, {n: case[n].numpy() for n in names})
        except Exception as e:
            if CHECK_NODE_PREFIX in str(e):
                narrowed = f"at {sizes}: {str(e).splitlines()[0][:200]}"
                continue
            return "wrong", f"onnxruntime fails at {sizes}: {str(e)[:300]}", merged
        if not _close(expected, out):
            return "wrong", f"onnx differs from eager at {sizes}", merged
    return ("narrowed", narrowed, merged) if narrowed else ("correct", "", merged)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--show", action="store_true", help="print each failing program")
    parser.add_argument(
        "--make-fx",
        action="store_true",
        help="lower every node through make_fx (to_onnx(direct_lowering=False)): torch's "
        "kernels then take decisions on each version's example, which the export judges "
        "(yobx.torch.onnx.version_guards)",
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    counts: collections.Counter = collections.Counter()
    merged_programs = 0
    start = time.perf_counter()
    for seed in range(args.start, args.start + args.count):
        outcome, message, merged = run(seed, direct_lowering=not args.make_fx)
        counts[outcome] += 1
        merged_programs += merged > 0
        if outcome in ("wrong", "refused") or (args.show and outcome == "narrowed"):
            print(f"seed {seed}: {outcome}: {message}")
            if args.show or outcome == "wrong":
                print(generate(seed))
    seconds = time.perf_counter() - start
    print(
        f"{args.count} programs in {seconds:.0f} s: "
        + ", ".join(f"{k} {counts[k]}" for k in ("correct", "narrowed", "refused", "wrong"))
        + f", eager_failed {counts['eager_failed']}; versions merged in {merged_programs}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
