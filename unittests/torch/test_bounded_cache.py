"""A process-wide cache empties itself when full, and the tracer's caches are such."""

from yobx.torch.bounded_cache import BoundedCache
from yobx.torch.tracing.core import loops
from yobx.torch.tracing.shape_rules import remembered
from yobx.torch.tracing.symbolic import symbolic, symbolic_memo


def test_a_full_cache_empties_itself_before_a_new_entry():
    cache = BoundedCache(3)
    for key in "abc":
        cache[key] = key.upper()
    # a known key is updated in place: nothing is lost
    cache["b"] = "B2"
    assert cache == {"a": "A", "b": "B2", "c": "C"}
    cache["d"] = "D"
    assert cache == {"d": "D"}
    assert cache.get("a") is None


def test_the_tracer_caches_kept_for_the_process_are_bounded():
    caches = [
        symbolic._PROOFS,
        symbolic_memo._RESULTS,
        remembered._PROCESS_OUTPUTS,
        loops._ITERATED,
    ]
    assert all(isinstance(cache, BoundedCache) and cache.limit > 0 for cache in caches)
