"""Real architectures from tiny configurations, to measure capture with dynamic shapes.

Each builder returns an :class:`ArchitectureCase`: a small model with random seeded
weights (eval mode, eager attention, well under a million parameters), example inputs,
dynamic shapes with string dimension names in torch.export's format, and inputs at two
other sizes of the dynamic dimensions on which eager runs::

    from yobx.models.architectures import ARCHITECTURES, build

    case = build("swin")
    case.model(*case.args, **case.kwargs)
    for args, kwargs in case.other_inputs:
        case.model(*args, **kwargs)

Families: ``vision``, ``audio``, ``text``, ``clip``, ``encoder_decoder``, ``moe``,
``decoder`` (decode steps with a ``DynamicCache``), ``state_space`` (a loop over the
sequence) and ``diffusion``.
"""

from __future__ import annotations

from collections.abc import Callable

from . import decoders, diffusion, sequences, vision
from .base import ArchitectureCase, make_case

#: every case: name -> builder
ARCHITECTURES: dict[str, Callable[[], ArchitectureCase]] = {
    **vision.BUILDERS,
    **sequences.BUILDERS,
    **decoders.BUILDERS,
    **diffusion.BUILDERS,
}

#: the family of each case, known without building it
FAMILIES: dict[str, str] = {
    **dict.fromkeys(vision.BUILDERS, "vision"),
    **dict.fromkeys(["wav2vec2", "hubert"], "audio"),
    **dict.fromkeys(["distilbert", "albert", "bert"], "text"),
    "clip": "clip",
    **dict.fromkeys(["t5", "bart"], "encoder_decoder"),
    **dict.fromkeys(["mamba", "falcon_mamba"], "state_space"),
    **dict.fromkeys(["llama_decode", "qwen2_decode", "gemma_decode"], "decoder"),
    **{name: "moe" for name in decoders.BUILDERS if "mixtral" in name or "moe" in name},
    **dict.fromkeys(diffusion.BUILDERS, "diffusion"),
}


def build(name: str) -> ArchitectureCase:
    """Builds the case ``name`` (one of :data:`ARCHITECTURES`)."""
    if name not in ARCHITECTURES:
        raise KeyError(f"unknown architecture case {name!r}; known: {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[name]()


__all__ = ["ARCHITECTURES", "FAMILIES", "ArchitectureCase", "build", "make_case"]
