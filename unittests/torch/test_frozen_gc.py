"""The collector keeps off the objects older than a capture, and is as it was after."""

from __future__ import annotations

import gc

import pytest
import torch

from yobx.torch.frozen_gc import frozen_during_call, older_objects_frozen
from yobx.torch.tracing import CustomTracer


class _Cycle:
    def __init__(self):
        self.me = self


_FROZEN_THEN_BACK = """
import gc, weakref
from yobx.torch.frozen_gc import older_objects_frozen

class Cycle:
    def __init__(self):
        self.me = self

assert gc.get_freeze_count() == 0
old = Cycle()
alive = weakref.ref(old)
with older_objects_frozen():
    assert gc.get_freeze_count() > 0
    del old
    gc.collect()
    # frozen: a full collection does not reach it
    assert alive() is not None
    new = Cycle()
    new_alive = weakref.ref(new)
    del new
    gc.collect()
    # made inside the block: collected as usual
    assert new_alive() is None
assert gc.get_freeze_count() == 0
gc.collect()
assert alive() is None
print("ok")
"""


def test_older_objects_frozen_then_back_and_collected_as_usual():
    # In a process of its own: full collections of a test worker that ran hundreds of
    # captures crashed three times in about a dozen CI runs (a segmentation fault
    # inside gc.collect, here and once at a worker's exit), which is still to be
    # understood; what this test checks is the freezing, not that process's objects
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FROZEN_THEN_BACK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_unfrozen_after_an_error():
    with pytest.raises(RuntimeError, match="inside"):
        with older_objects_frozen():
            raise RuntimeError("inside")
    assert gc.get_freeze_count() == 0


def test_objects_the_user_froze_stay_frozen():
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        with older_objects_frozen():
            pass
        # nothing unfrozen (the count would be 0) nor frozen again (it would grow by the
        # objects created since); frozen objects freed meanwhile leave the count
        assert 0 < gc.get_freeze_count() <= count
    finally:
        gc.unfreeze()


def test_disabled_collector_is_left_alone():
    gc.disable()
    try:
        with older_objects_frozen():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_decorated_function_and_trace_leave_nothing_frozen():
    seen = []

    @frozen_during_call
    def work(x):
        """Doubles."""
        seen.append(gc.get_freeze_count())
        return 2 * x

    assert work(3) == 6 and seen[0] > 0 and work.__doc__ == "Doubles."
    CustomTracer().trace(torch.nn.ReLU(), concrete_args={"input": torch.randn(2)})
    assert gc.get_freeze_count() == 0
