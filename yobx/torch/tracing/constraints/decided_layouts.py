"""torch's own layout decisions, settled from the dimensions' ranges when they can be.

Where no shape rule applies, torch's fake kernels compute layouts themselves: the
output of an elementwise decomposition, or ``empty_like`` of a transposed query in the
meta function of ``scaled_dot_product_attention``. Both order dimensions with
``compute_elementwise_output_logical_to_physical_perm``, a sympy evaluation per
comparison of symbolic strides (a fifth of the fake dispatch in an ONNX lowering).
Contiguity tests are the same kind of comparisons: make_fx records the memory format
of every value it traces (``shape_prop._extract_tensor_metadata``), a tenth of a
lowering.

:func:`decided_layouts` replaces that function, in the thread of the patch window only,
by one that first tries :func:`~.shape_rules._strides.decided_perm` (the same
algorithm, comparisons settled from the ranges) and otherwise calls torch's; and the
same for ``is_contiguous_for_memory_format_or_false``
(:func:`~.shape_rules._strides.decided_contiguity`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch._prims_common as prims_common
import torch._subclasses.fake_impls as fake_impls
import torch.fx.passes.shape_prop as shape_prop

from ..isolation.patching import memoized_replacements, patched_attributes
from ..shape_rules import check_enabled, rule_or_torch
from ..shape_rules._strides import decided_contiguity, decided_perm

_NAME = "compute_elementwise_output_logical_to_physical_perm"
_CONTIGUITY = "is_contiguous_for_memory_format_or_false"


def _or_none(decide, *args):
    """``decide(*args)``; an input it did not foresee is torch's to answer (``None``),
    except in the check mode of the test suite, which surfaces the bug."""
    return rule_or_torch(lambda: decide(*args), lambda: None, check_enabled())


def _settled_first(original):
    def perm(*tensors, _skip_checks=False, ambiguity_check=False):
        if not ambiguity_check:
            decided = _or_none(decided_perm, tensors)
            if decided is not None:
                return decided, False
        return original(*tensors, _skip_checks=_skip_checks, ambiguity_check=ambiguity_check)

    return perm


def _contiguity_settled_first(original):
    def is_contiguous(tensor, *, memory_format):
        decided = _or_none(decided_contiguity, tensor, memory_format)
        if decided is not None:
            return decided
        return original(tensor, memory_format=memory_format)

    return is_contiguous


@memoized_replacements
def _replacements() -> list:
    contiguity = _contiguity_settled_first(prims_common.is_contiguous_for_memory_format_or_false)
    return [
        (prims_common, _NAME, _settled_first(getattr(prims_common, _NAME))),
        # torch asks it by its own name in these modules (fake kernels, the metadata
        # make_fx records for every value)
        *(
            (module, _CONTIGUITY, contiguity)
            for module in (prims_common, shape_prop, fake_impls)
            if getattr(module, _CONTIGUITY, None) is prims_common.__dict__[_CONTIGUITY]
        ),
    ]


@contextlib.contextmanager
def decided_layouts() -> Iterator[None]:
    """Inside the block, torch's elementwise layout permutation and its contiguity
    tests are settled from the ranges of the dimensions when they decide them
    (restored on exit)."""
    with patched_attributes(_replacements()):
        yield
