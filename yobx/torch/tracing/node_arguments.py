"""The arguments a node of a traced graph stores as they are.

Recording an operation (:mod:`.core.proxy_dispatch`, :mod:`.core.traced_attributes`) and
remembering a shape rule's answer for its arguments (:mod:`.shape_rules.remembered`) both
skip the walk over arguments of these types: they never hold a proxy.
"""

from __future__ import annotations

import torch

#: argument types a node stores as they are, never proxies (torch.fx's answer for
#: them, reached without its chain of isinstance tests: most arguments are these)
ATOMIC_ARGUMENTS = frozenset(
    {
        int,
        float,
        bool,
        str,
        type(None),
        type(...),
        torch.dtype,
        torch.device,
        torch.memory_format,
        torch.layout,
    }
)
