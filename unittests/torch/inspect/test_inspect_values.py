"""Summaries and digests of recorded values."""

import hashlib
import subprocess
import sys

import pytest
import torch

from yobx.torch.inspect import (
    ObjectSummary,
    SummaryCache,
    TensorSummary,
    ValueSummary,
    summarize,
    tensor_digest,
)


def test_digest_is_blake2b_over_dtype_shape_bytes():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    expected = hashlib.blake2b(digest_size=16)
    expected.update(b"torch.float32")
    expected.update(b"(2, 3)")
    expected.update(t.numpy().tobytes())
    assert tensor_digest(t) == expected.hexdigest()
    assert len(tensor_digest(t)) == 32


def test_digest_changes_with_permutation_dtype_shape_and_one_element():
    t = torch.arange(12, dtype=torch.float32)
    base = tensor_digest(t)
    # Same multiset of values in another order: an XOR or sum reduction would not see it.
    assert tensor_digest(t.flip(0)) != base
    assert tensor_digest(t[torch.randperm(12, generator=torch.Generator().manual_seed(0))]) != base
    assert tensor_digest(t.to(torch.float64)) != base
    assert tensor_digest(t.to(torch.int32)) != base
    assert tensor_digest(t.reshape(3, 4)) != base
    changed = t.clone()
    changed[7] = torch.nextafter(changed[7], torch.tensor(100.0))
    assert tensor_digest(changed) != base
    assert tensor_digest(t.clone()) == base


def test_digest_same_for_any_layout_and_across_processes():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    transposed = t.t().contiguous().t()  # same values, column-major storage
    assert not transposed.is_contiguous()
    assert tensor_digest(transposed) == tensor_digest(t)
    code = (
        "import torch; from yobx.torch.inspect import tensor_digest; "
        "print(tensor_digest(torch.arange(12, dtype=torch.float32).reshape(3, 4)))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert other == tensor_digest(t)


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.bool, torch.int8, torch.complex64]
)
def test_digest_other_dtypes(dtype):
    t = torch.arange(8).to(dtype)
    assert tensor_digest(t) == tensor_digest(t.clone())
    assert tensor_digest(t) != tensor_digest(torch.arange(8, dtype=torch.float32))


def test_bfloat16_digest_sees_low_bits():
    a = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    b = a.clone()
    b.view(torch.int16)[0] += 1  # the next representable bfloat16
    assert a[0] != b[0]
    assert tensor_digest(a) != tensor_digest(b)


def test_tensor_summary_statistics_and_counts():
    t = torch.tensor([1.0, -2.0, float("nan"), float("inf"), 4.0, float("-inf")])
    s = TensorSummary(t)
    assert (s.dtype, s.shape, s.device) == (torch.float32, (6,), "cpu")
    assert (s.min, s.max, s.mean) == (-2.0, 4.0, 1.0)
    assert (s.nan_count, s.inf_count) == (1, 2)
    text = repr(s)
    assert "float32[6]" in text and "nan=1" in text and "inf=2" in text
    assert s.digest[:12] in text


def test_tensor_summary_keeps_a_copy():
    t = torch.zeros(3)
    s = TensorSummary(t)
    t += 1  # the model modifies the tensor after the call
    assert s.tensor.tolist() == [0.0, 0.0, 0.0]
    assert TensorSummary(t, keep=False).has_tensor is False
    with pytest.raises(ValueError, match="keep_tensors=True"):
        TensorSummary(t, keep=False).tensor


def test_summary_of_int_bool_empty_and_fake_tensors():
    ints = TensorSummary(torch.tensor([3, 1, 2]))
    assert (ints.min, ints.max, ints.mean) == (1, 3, 2.0)
    flags = TensorSummary(torch.tensor([True, False, True, True]))
    assert flags.mean == 0.75
    empty = TensorSummary(torch.zeros(0, 4))
    assert empty.shape == (0, 4) and empty.min is None and empty.digest is not None
    meta = TensorSummary(torch.zeros(2, device="meta"))
    assert meta.digest is None and meta.shape == (2,)


def test_summarize_structures():
    out = summarize({"a": (torch.ones(2), 3), "b": [None, "x"], "size": torch.Size([2, 3])})
    assert isinstance(out["a"][0], TensorSummary)
    assert isinstance(out["a"][1], ValueSummary) and out["a"][1].value == 3
    assert repr(out["b"][0]) == "None"
    assert isinstance(out["size"], tuple) and out["size"][1].value == 3
    named = summarize(torch.max(torch.tensor([[1.0, 5.0]]), dim=1))
    assert set(named) == {"values", "indices"}
    assert named["values"].tensor.tolist() == [5.0]


def test_summarize_pytree_object():
    from transformers import DynamicCache

    from yobx.torch.tracing import register_cache_flattening

    # registered with pytree (as a trace of a model using it does): summarized by parts
    register_cache_flattening()
    cache = DynamicCache()
    cache.update(torch.ones(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), 0)
    summary = summarize(cache)
    assert isinstance(summary, ObjectSummary)
    assert len(summary.children) >= 2


def test_summary_cache_reuses_unchanged_tensors_only():
    cache = SummaryCache()
    t = torch.ones(3)
    first = cache.summarize_tensor(t)
    assert cache.summarize_tensor(t) is first
    t.add_(1)  # bumps the version counter
    second = cache.summarize_tensor(t)
    assert second is not first
    assert second.tensor.tolist() == [2.0, 2.0, 2.0]
    assert first.tensor.tolist() == [1.0, 1.0, 1.0]
