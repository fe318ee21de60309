"""Direct lowering against make_fx's on every architecture case and demo model.

For each model, exports with ``to_onnx(direct_lowering=True)`` and ``False``, validates
both with onnxruntime against eager PyTorch (example and other sizes of the dynamic
dimensions), compares the multisets of aten operators of the two lowered graphs, and
prints the number of nodes written directly and the lowering times (median of
``--repeat`` runs, the two paths alternating)::

    python _scripts/compare_direct_lowering.py [--repeat 3] [--models vit,t5,tiny-llm]

Exit status 1 when a model validates on one path and not on the other, or when the two
aten graphs use other operators than ``clone`` and ``type_as`` (what make_fx writes
for an operator returning its argument, an eval dropout or a cast to the same dtype,
which the direct lowering leaves out, and the copies where the capture and make_fx
chose other layouts for a value: ONNX has no layouts, these are ``Identity`` nodes the
optimizer removes); such differences are printed.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
import warnings

import torch

from yobx.models import load_model
from yobx.models.architectures import ARCHITECTURES, build
from yobx.torch.onnx import capture as capture_module
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.lowering import lower_to_aten

DEMOS = ["tiny-llm", "tiny-cnn", "transformer-encoder", "hf:GPT2LMHeadModel", "hf:BertModel"]

#: scalar bookkeeping make_fx may write in another number or order on either path
_SCALAR_TARGETS = {"sym_size", "sym_stride", "sym_numel", "sym_storage_offset"}
#: what make_fx writes for an operator the capture found to return its argument (an eval
#: dropout's clone, a type_as of the same dtype), or where it gave a value other strides
_NO_OPS = {"aten.clone.default", "aten.type_as.default"}


def _load(name: str):
    if name in ARCHITECTURES:
        case = build(name)
        return case.model, case.args, case.kwargs, case.dynamic_shapes
    return load_model(name)


def _operators(lowered) -> collections.Counter:
    counts = collections.Counter()
    for node in lowered.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if isinstance(node.target, torch._ops.OpOverload):
            name = str(node.target)
        elif node.target.__module__ == "_operator":
            # symbolic size arithmetic: kept only when used, either way
            continue
        if name.split(".")[-2 if "." in name else -1] in _SCALAR_TARGETS:
            continue
        counts[name] += 1
    return counts


def _lowering_times(model, args, kwargs, dynamic_shapes, repeat: int) -> dict:
    times = {True: [], False: []}
    lowered = {}
    for _ in range(repeat):
        for direct in (True, False):
            captured = capture_module.capture(model, args, kwargs, dynamic_shapes, None)
            start = time.perf_counter()
            lowered[direct] = lower_to_aten(captured.graph_module, direct=direct)
            times[direct].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}, lowered


def _validate(model, args, kwargs, dynamic_shapes, direct: bool) -> str:
    try:
        result = to_onnx(
            model,
            args,
            kwargs,
            dynamic_shapes=dynamic_shapes,
            validate=True,
            direct_lowering=direct,
        )
    except Exception as exc:
        return f"fails: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    report = result.validation
    return f"ok ({report.n_checked} cases)" if report.ok else "WRONG: " + report.format()[:200]


def compare(name: str, repeat: int) -> bool:
    """Prints one line for ``name``; returns whether both paths agree."""
    model, args, kwargs, dynamic_shapes = _load(name)
    try:
        times, lowered = _lowering_times(model, args, kwargs, dynamic_shapes, repeat)
    except Exception as exc:
        print(f"{name:28s} capture or lowering fails: {type(exc).__name__}")
        return True
    direct_ops, reference_ops = _operators(lowered[True]), _operators(lowered[False])
    same = direct_ops == reference_ops
    for operator in _NO_OPS:
        direct_ops.pop(operator, None)
        reference_ops.pop(operator, None)
    direct_ok = _validate(model, args, kwargs, dynamic_shapes, True)
    reference_ok = _validate(model, args, kwargs, dynamic_shapes, False)
    agree = direct_ops == reference_ops and direct_ok.split(" ")[0] == reference_ok.split(" ")[0]
    print(
        f"{name:28s} direct {lowered[True].n_direct:4d}  lower {times[True] * 1000:7.1f} ms "
        f"vs {times[False] * 1000:7.1f} ms ({times[True] / times[False]:.2f})  "
        f"same operators: {same}  direct: {direct_ok}  make_fx: {reference_ok}"
    )
    if not same:
        print("   only direct:", dict(_operators(lowered[True]) - _operators(lowered[False])))
        print("   only make_fx:", dict(_operators(lowered[False]) - _operators(lowered[True])))
    return agree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--models", default="")
    options = parser.parse_args()
    names = options.models.split(",") if options.models else [*DEMOS, *sorted(ARCHITECTURES)]
    warnings.simplefilter("ignore")
    failing = [name for name in names if not compare(name, options.repeat)]
    print("disagreeing:", failing)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
