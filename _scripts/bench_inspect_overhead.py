"""Measures what yobx.torch.inspect costs: decorators outside recording, record_run per call.

Run: ``python _scripts/bench_inspect_overhead.py``.
"""

import time
import timeit

import torch

from yobx.torch.inspect import record_run, trace_func


def plain(x):
    return x


@trace_func
def decorated(x):
    return x


def main() -> None:
    number = 200_000
    base = min(timeit.repeat(lambda: plain(1), number=number, repeat=5)) / number
    wrapped = min(timeit.repeat(lambda: decorated(1), number=number, repeat=5)) / number
    print(f"decorator outside recording: {(wrapped - base) * 1e9:.0f} ns per call added")

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(20)]).eval()
    x = torch.randn(8, 64)
    gm = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        gm(x)
        start = time.perf_counter()
        for _ in range(20):
            gm(x)
        direct = (time.perf_counter() - start) / 20
    for keep in (True, False):
        start = time.perf_counter()
        result = record_run(gm, x, keep_tensors=keep)
        recorded = time.perf_counter() - start
        calls = len(result.graph)
        print(
            f"record_run keep_tensors={keep}: {recorded * 1e3:.2f} ms for {calls} calls "
            f"(direct run {direct * 1e3:.2f} ms, {(recorded - direct) / calls * 1e6:.1f} us "
            "added per call)"
        )


if __name__ == "__main__":
    main()
