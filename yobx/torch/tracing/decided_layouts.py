"""torch's own layout decisions, settled from the dimensions' ranges when they can be.

Where no shape rule applies, torch's fake kernels compute layouts themselves: the
output of an elementwise decomposition, or ``empty_like`` of a transposed query in the
meta function of ``scaled_dot_product_attention``. Both order dimensions with
``compute_elementwise_output_logical_to_physical_perm``, a sympy evaluation per
comparison of symbolic strides (a fifth of the fake dispatch in an ONNX lowering).

:func:`decided_layouts` replaces that function, in the thread of the patch window only,
by one that first tries :func:`~.shape_rules._strides.decided_perm` (the same
algorithm, comparisons settled from the ranges) and otherwise calls torch's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch._prims_common as prims_common

from .patches import patched_attributes
from .shape_rules._strides import decided_perm

_NAME = "compute_elementwise_output_logical_to_physical_perm"


def _settled_first(original):
    def perm(*tensors, _skip_checks=False, ambiguity_check=False):
        if not ambiguity_check:
            decided = decided_perm(tensors)
            if decided is not None:
                return decided, False
        return original(*tensors, _skip_checks=_skip_checks, ambiguity_check=ambiguity_check)

    return perm


@contextlib.contextmanager
def decided_layouts() -> Iterator[None]:
    """Inside the block, torch's elementwise layout permutation is settled from the
    ranges of the dimensions when they decide it (restored on exit)."""
    original = getattr(prims_common, _NAME)
    with patched_attributes([(prims_common, _NAME, _settled_first(original))]):
        yield
