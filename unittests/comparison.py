"""The one helper the tests use to compare outputs: same structure, close values.

Exact by default, as a rewrite or a capture must be when it runs the same kernels;
pass ``atol``/``rtol`` where kernels legitimately differ (batched vs per-example sums,
onnxruntime vs eager).
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

#: tolerances for results computed by other kernels in another order
CLOSE = {"atol": 1e-5, "rtol": 1e-5}


def assert_same(expected, got, atol: float = 0.0, rtol: float = 0.0) -> None:
    """Compares nested outputs (tensors, tuples, lists, dicts, ``ModelOutput``, caches):
    the same structure and types, tensors equal within ``atol``/``rtol`` (NaNs equal),
    anything else equal."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"expected a tensor, got {type(got)}"
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, equal_nan=True)
    elif isinstance(expected, dict):
        assert set(expected) == set(got), (sorted(expected), sorted(got))
        for key in expected:
            assert_same(expected[key], got[key], atol, rtol)
    elif isinstance(expected, (tuple, list)):
        assert len(expected) == len(got), (len(expected), len(got))
        for a, b in zip(expected, got):
            assert_same(a, b, atol, rtol)
    elif type(expected) in pytree.SUPPORTED_NODES:
        assert type(got) is type(expected), (type(expected), type(got))
        assert_same(pytree.tree_leaves(expected), pytree.tree_leaves(got), atol, rtol)
    else:
        assert expected == got, (expected, got)
