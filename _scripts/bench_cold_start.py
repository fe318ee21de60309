"""Cold start: ``import torch`` against importing yobx and tracing the tiny-llm demo.

Each command runs in a fresh Python process (the two alternate, run after run); the
script prints the median wall time of each and their difference (target: at most
0.5 s beyond ``import torch``), and the part of it that is torch's own floor: creating
the ShapeEnv and the fake mode any trace with dynamic dimensions needs (the ShapeEnv
imports dynamo and sympy). With ``--importtime``, it also prints the modules whose
import takes the most time beyond torch's (``python -X importtime``, cumulative)::

    python _scripts/bench_cold_start.py [--repeat 5] [--importtime]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

IMPORT_TORCH = "import torch"

#: what any trace with dynamic dimensions needs from torch: a ShapeEnv (its creation
#: imports dynamo and sympy) and a fake mode over it; no tool built on them starts faster
TORCH_FLOOR = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
FakeTensorMode(shape_env=ShapeEnv())
"""

#: imports yobx, builds the tiny-llm demo and traces it with CustomTracer
TRACE_TINY_LLM = """
import inspect
import yobx.torch
from yobx.models import load_model
from yobx.torch.tracing import CustomTracer
model, args, kwargs, dynamic_shapes = load_model("tiny-llm")
names = list(inspect.signature(model.forward).parameters)
kwargs = {**dict(zip(names, args)), **kwargs}
graph = CustomTracer().trace(model, concrete_args=kwargs, dynamic_shapes=dynamic_shapes)
assert len(graph.nodes) > 10
"""

TARGET_SECONDS = 0.5


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _wall_time(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=_environment(), cwd=ROOT)
    return time.perf_counter() - start


def _import_times(code: str) -> dict[str, tuple[int, int]]:
    """``module -> (cumulative microseconds, nesting depth)`` of ``python -X importtime``."""
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        check=True,
        env=_environment(),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    times: dict[str, tuple[int, int]] = {}
    for line in completed.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        # "import time: self [us] | cumulative | imported package", two spaces of
        # indentation per level of nesting
        _, cumulative, name = line[len("import time:") :].split("|")
        depth = (len(name) - len(name.lstrip()) - 1) // 2
        times[name.strip()] = (int(cumulative), depth)
    return times


def _print_import_report(top: int) -> None:
    """The heaviest imports that ``import torch`` alone does not do."""
    baseline = _import_times(IMPORT_TORCH)
    extra = {k: v for k, v in _import_times(TRACE_TINY_LLM).items() if k not in baseline}
    print("\nimports beyond import torch's, heaviest first (python -X importtime, cumulative):")
    for name, (micros, depth) in sorted(extra.items(), key=lambda item: -item[1][0])[:top]:
        print(f"  {micros / 1e6:7.3f} s  {'  ' * depth}{name}")


#: the same work as TRACE_TINY_LLM, timed phase by phase in one process
PHASES = (
    """
import time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import yobx.torch, yobx.torch.tracing, yobx.models
t2 = time.perf_counter()
"""
    + TRACE_TINY_LLM.replace("assert", "t3 = time.perf_counter()\nassert")
    + """
graph = CustomTracer().trace(model, concrete_args=kwargs, dynamic_shapes=dynamic_shapes)
t4 = time.perf_counter()
print(f"phases: import torch {t1 - t0:.3f} s, import yobx {t2 - t1:.3f} s, "
      f"build + first trace {t3 - t2:.3f} s (a second trace: {t4 - t3:.3f} s)")
"""
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--importtime", action="store_true", help="where the time goes")
    parser.add_argument("--top", type=int, default=25)
    options = parser.parse_args()
    codes = {
        "import torch": IMPORT_TORCH,
        "torch's floor": TORCH_FLOOR,
        "yobx + trace tiny-llm": TRACE_TINY_LLM,
    }
    measured: dict[str, list[float]] = {name: [] for name in codes}
    # one run each first: the files are in the OS cache for every measured run
    for code in codes.values():
        _wall_time(code)
    for _ in range(options.repeat):
        for name, code in codes.items():
            measured[name].append(_wall_time(code))
    medians = {name: statistics.median(times) for name, times in measured.items()}
    for name, median in medians.items():
        spread = f"{min(measured[name]):.3f}-{max(measured[name]):.3f}"
        print(f"{name:24s} median {median:6.3f} s  (min-max {spread} s)")
    difference = medians["yobx + trace tiny-llm"] - medians["import torch"]
    verdict = "ok" if difference <= TARGET_SECONDS else "OVER"
    print(
        f"{'difference':24s}        {difference:6.3f} s  (target <= {TARGET_SECONDS} s: {verdict})"
    )
    floor = medians["torch's floor"] - medians["import torch"]
    print(
        f"{'of which torch':24s}        {floor:6.3f} s  (a ShapeEnv and a FakeTensorMode over "
        f"it, beyond import torch)\n{'of which yobx':24s}        {difference - floor:6.3f} s"
    )
    subprocess.run([sys.executable, "-c", PHASES], check=True, env=_environment(), cwd=ROOT)
    if options.importtime:
        _print_import_report(options.top)


if __name__ == "__main__":
    main()
