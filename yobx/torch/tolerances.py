"""Default tolerances when yobx compares two runs of a model (onnxruntime against eager
in validation, two recorded stages in inspection): one convention for every layer.

float32 kernels computing the same values in another order (fused, decomposed,
batched) differ by a few ulps of the largest magnitudes involved; 1e-4 absolute and
relative leaves room for that and still catches a wrong element.
"""

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-4

__all__ = ["DEFAULT_ATOL", "DEFAULT_RTOL"]
