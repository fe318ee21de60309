"""Checks, after every test, that every live tensor's storage looks alive."""

import gc
import os

import pytest
import torch

#: one log per process: the test started and, after it, the storages found out of range
_LOG = open(  # noqa: SIM115 - open for the whole process
    f"/tmp/storagecheck.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.{os.getpid()}.log",
    "a",
    buffering=1,
)


def _check(when, nodeid):
    bad = []
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.Tensor):
            continue
        try:
            if obj.layout != torch.strided or obj.is_nested:
                continue
            storage = obj.untyped_storage()
            count = torch._C._storage_Use_Count(storage._cdata)
            nbytes = storage.nbytes()
        except Exception:
            continue
        if (
            count <= 0
            or count > 1_000_000
            or (isinstance(nbytes, int) and (nbytes < 0 or nbytes > 1 << 40))
        ):
            bad.append((type(obj).__name__, tuple(obj.shape), count, nbytes))
    _LOG.write(f"{when} {nodeid} bad={len(bad)} {bad[:3]}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _LOG.write(f"start {item.nodeid}\n")
    yield
    _check("after", item.nodeid)
