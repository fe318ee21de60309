#!/usr/bin/env bash
# The CI worker crash (a StorageImpl released once too often), reproduced in ~15 s a run:
# yobx's tracer and default passes on the passes fuzzer's programs, then torch.export on
# other programs of it; storagecheck.py touches the storage of every live tensor after
# each test (a freed one segfaults, exit code 139). variant.py disables one piece of
# yobx in the test process (YOBX_VARIANT, see its code; "base" disables nothing).
# Run two loops side by side (the crash needs a loaded machine), from the project root:
#   bash _scripts/crash_hunt/run.sh base 8 & bash _scripts/crash_hunt/run.sh skip_remove_inplace 8
# Each run appends "<variant> run <i> rc=<code>" to /tmp/crash_hunt.log.
set -u
variant="${1:-base}"
runs="${2:-8}"
here="$(cd "$(dirname "$0")" && pwd)"
for i in $(seq 1 "$runs"); do
  YOBX_VARIANT="$variant" PYTHONPATH="$here" MALLOC_PERTURB_=165 PYTHONFAULTHANDLER=1 \
    timeout 900 python -m pytest -p no:xdist -p no:cacheprovider -p variant -p storagecheck -q \
    "unittests/torch/passes/test_passes_fuzz.py::test_fuzz_tracer_and_symbolic_trace[0]" \
    "unittests/torch/passes/test_passes_fuzz.py::test_fuzz_export" > "/tmp/crash_hunt.$variant.$i.log" 2>&1
  echo "$variant run $i rc=$? $(date +%T)" >> /tmp/crash_hunt.log
done
