#!/usr/bin/env bash
# A check for storages released once too often, in ~15 s a run: yobx's tracer and
# default passes on the passes fuzzer's programs, then torch.export on other programs of
# it, with glibc's MALLOC_PERTURB_ and storagecheck.py touching the storage of every live
# tensor after each test (a freed one segfaults: exit code 139).
#
# It reproduced the CI worker crash of stops 47-50 in about half the runs (two loops side
# by side): a deep copy of a traced graph module copied the trace's FakeTensorMode held
# in its versions' meta, and with it the StorageWeakRef objects of the fake mode's
# converter; each copy released the same weak reference, and a buffer's storage was freed
# while torch.export's fakes still used it. SymbolicDimensions.__deepcopy__ returns the
# object itself since; 0 crashes in 20 runs after, 6 in 13 before.
#
# Run two loops side by side (the crash needed a loaded machine), from the project root:
#   bash _scripts/crash_hunt/run.sh 8 & bash _scripts/crash_hunt/run.sh 8
# Each run appends "run <i> rc=<code>" to /tmp/crash_hunt.log.
set -u
runs="${1:-8}"
here="$(cd "$(dirname "$0")" && pwd)"
for i in $(seq 1 "$runs"); do
  PYTHONPATH="$here" MALLOC_PERTURB_=165 PYTHONFAULTHANDLER=1 \
    timeout 900 python -m pytest -p no:xdist -p no:cacheprovider -p storagecheck -q \
    "unittests/torch/passes/test_passes_fuzz.py::test_fuzz_tracer_and_symbolic_trace[0]" \
    "unittests/torch/passes/test_passes_fuzz.py::test_fuzz_export" > "/tmp/crash_hunt.$$.$i.log" 2>&1
  echo "run $i rc=$? $(date +%T)" >> /tmp/crash_hunt.log
done
