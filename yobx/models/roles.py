"""Dynamic dimensions of a model whose factory declares none, read from input roles.

The ``yobx`` command exports dynamic batch and sequence dimensions by default. A
factory returning ``(model, args)`` or ``(model, args, kwargs)`` says nothing about
them; when every tensor input has a name whose role is known (``input_ids``,
``attention_mask``, ``pixel_values``...), the dimensions follow from the role. Any other
input stops the export with an error saying how to declare the dimensions: an input
never silently becomes static.
"""

from __future__ import annotations

from typing import Any

import torch

#: input name -> the named axes of that role (Hugging Face's argument names)
ROLE_AXES: dict[str, dict[int, str]] = {
    "input_ids": {0: "batch", 1: "seq"},
    "attention_mask": {0: "batch", 1: "seq"},
    "token_type_ids": {0: "batch", 1: "seq"},
    "position_ids": {0: "batch", 1: "seq"},
    "inputs_embeds": {0: "batch", 1: "seq"},
    "decoder_input_ids": {0: "batch", 1: "decoder_seq"},
    "decoder_attention_mask": {0: "batch", 1: "decoder_seq"},
    "pixel_values": {0: "batch"},
    "input_values": {0: "batch", 1: "samples"},
    "input_features": {0: "batch"},
}


class UndeclaredDynamicShapesError(ValueError):
    """Raised when the dynamic dimensions of an input cannot be derived."""


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return f"{dtype} {list(value.shape)}"
    return type(value).__name__


def derive_dynamic_shapes(
    model: torch.nn.Module, args: tuple, kwargs: dict[str, Any], origin: str
) -> dict[str, Any]:
    """The dynamic shapes of ``model``'s inputs from their roles.

    :param model: the model (its ``forward`` names the inputs)
    :param args: positional example inputs
    :param kwargs: keyword example inputs
    :param origin: the model's name, for the error message
    :return: ``{input name: {axis: dimension name}}``
    :raises UndeclaredDynamicShapesError: an input whose role is unknown (listing them
        and the declaration to write)
    """
    from yobx.torch.tracing.inputs import bind_arguments

    try:
        bound = bind_arguments(model.forward, tuple(args), dict(kwargs))
    except TypeError as exc:
        raise UndeclaredDynamicShapesError(
            f"{origin}: the example inputs do not match forward: {exc}"
        ) from exc
    shapes: dict[str, Any] = {}
    unknown: list[str] = []
    for name, value in bound.items():
        if value is None or isinstance(value, (bool, int, float, str)):
            continue
        axes = ROLE_AXES.get(name)
        if isinstance(value, torch.Tensor) and axes is not None and value.dim() > max(axes):
            shapes[name] = dict(axes)
        else:
            unknown.append(name)
    if unknown:
        described = ", ".join(f"{n!r} ({_describe(bound[n])})" for n in unknown)
        example = ", ".join(f"{n!r}: {{0: 'batch'}}" for n in unknown[:2])
        raise UndeclaredDynamicShapesError(
            f"{origin} declares no dynamic shapes and the role of {described} is unknown: "
            f"return (model, args, kwargs, dynamic_shapes) from the factory with "
            f"dynamic_shapes naming each dynamic dimension (e.g. {{{example}}}), or "
            f"export with --static"
        )
    return shapes


__all__ = ["ROLE_AXES", "UndeclaredDynamicShapesError", "derive_dynamic_shapes"]


#: the length of a decode step's attention mask when it spans the cache and the new
#: tokens, as a dimension expression (see yobx.torch.tracing.dynamic_shapes)
PAST_PLUS_SEQ = "past + seq"


def attention_mask_length(inputs: dict[str, Any], cache: Any) -> str:
    """The role of axis 1 of the ``attention_mask`` of a step given ``cache`` (a
    ``transformers`` cache, empty for a prefill): ``"past + seq"`` when the example's
    mask spans the cache's positions and the new tokens, as generation passes it (then
    the graph has no version for a mask longer or shorter than that, and checks it);
    ``"seq"`` for an empty cache and a mask over the new tokens; ``"total"``, a
    dimension of its own, otherwise: a cache whose layers hold other lengths (a full
    sliding window holds fewer positions than the mask spans), or a mask of another
    length in the example.

    A sliding-window layer not full yet holds every position, as the other layers: the
    step yobx exports checks that it is not full (``past < window - 1``, see
    :func:`yobx.torch.tracing.inputs.recount_sliding_layers`), so the mask spans
    ``past + seq`` wherever the step runs."""
    mask = inputs.get("attention_mask")
    tokens = inputs.get("input_ids", inputs.get("inputs_embeds"))
    layers = getattr(cache, "layers", None)
    if not isinstance(mask, torch.Tensor) or not isinstance(tokens, torch.Tensor):
        return "total"
    if layers is None or mask.dim() != 2 or tokens.dim() < 2:
        return "total"
    keys = [getattr(layer, "keys", None) for layer in layers]
    lengths = {k.shape[2] for k in keys if isinstance(k, torch.Tensor) and k.dim() == 4}
    if any(not isinstance(k, torch.Tensor) for k in keys) and lengths:
        return "total"  # some layers filled, others not: no single past
    seq = tokens.shape[1]
    if not lengths:
        return "seq" if mask.shape[1] == seq else "total"
    if len(lengths) == 1 and mask.shape[1] == lengths.pop() + seq:
        return PAST_PLUS_SEQ
    return "total"
