"""Shape rules of tensor factories sized by dynamic dimensions: ``torch.arange``.

They apply when a size argument is symbolic (the inputs hold no tensor to tell):
``torch.arange(seq)``, ``torch.arange(past, past + seq)``.
"""

from __future__ import annotations

from typing import Any

import torch

from ._base import TensorFactory, Unsupported, decide

_INTEGERS = (int, torch.SymInt)


def arange(factory: TensorFactory, args: tuple, kwargs: dict) -> torch.Tensor:
    """``torch.arange(end)`` / ``(start, end)`` on integers, step 1: ``end - start``
    elements, when ``end >= start`` is known from the dimension ranges."""
    if set(kwargs) - {"dtype", "device"} or not 1 <= len(args) <= 3:
        raise Unsupported("unexpected arguments")
    start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    if any(isinstance(a, bool) or not isinstance(a, _INTEGERS) for a in (start, end, step)):
        raise Unsupported("non-integer bounds")
    if not isinstance(step, int) or step != 1:
        raise Unsupported("step")
    if not any(isinstance(a, torch.SymInt) for a in (start, end)):
        raise Unsupported("static bounds")
    if not decide(end >= start):
        raise Unsupported("empty range: torch raises")
    dtype = kwargs.get("dtype") or torch.int64
    device = torch.device(kwargs.get("device") or "cpu")
    if device.type != "cpu":
        raise Unsupported("device")
    length: Any = end if isinstance(start, int) and start == 0 else end - start
    return factory.new([length], dtype, device)


FUNCTION_RULES: dict[Any, Any] = {torch.arange: arange}
