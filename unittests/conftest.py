"""Test-suite settings.

``YOBX_CHECK_SHAPE_RULES=1``: every fake value computed by a shape rule
(:mod:`yobx.torch.tracing.shape_rules`) is also computed by torch's fake tensors and
compared, so every trace in the suite checks the rules it used.
"""

import os

os.environ.setdefault("YOBX_CHECK_SHAPE_RULES", "1")
