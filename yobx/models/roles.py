"""Dynamic shapes derived from the roles of a model's inputs, for ``yobx export
--dynamic`` on a factory that declares none.

Only inputs whose names say what their axes are get dynamic dimensions (the names
Hugging Face models use); a tensor input of unknown role makes the derivation fail
with an error that says how to declare the shapes, so that ``--dynamic`` never
silently writes a static model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

#: input name -> ``{axis: dimension name}``
ROLES: dict[str, dict[int, str]] = {
    "input_ids": {0: "batch", 1: "seq"},
    "attention_mask": {0: "batch", 1: "seq"},
    "token_type_ids": {0: "batch", 1: "seq"},
    "position_ids": {0: "batch", 1: "seq"},
    "inputs_embeds": {0: "batch", 1: "seq"},
    "decoder_input_ids": {0: "batch", 1: "decoder_seq"},
    "decoder_attention_mask": {0: "batch", 1: "decoder_seq"},
    "pixel_values": {0: "batch"},
    "input_values": {0: "batch", 1: "length"},
    "input_features": {0: "batch"},
}


class UnknownRoleError(ValueError):
    """An input has no known role: its dynamic dimensions cannot be derived."""


def dynamic_shapes_from_roles(
    model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any], origin: str
) -> dict[str, Any]:
    """``dynamic_shapes`` for ``model(*args, **kwargs)`` from the inputs' names.

    :param origin: the model's name, for the error message
    :raises UnknownRoleError: a tensor input (or a container) whose role is unknown
    """
    from yobx.torch.tracing.inputs import bind_arguments

    bound = bind_arguments(model.forward, tuple(args), dict(kwargs))
    shapes: dict[str, Any] = {}
    unknown = []
    for name, value in bound.items():
        if isinstance(value, torch.Tensor) and name in ROLES:
            shapes[name] = {a: d for a, d in ROLES[name].items() if a < value.dim()}
        elif isinstance(value, torch.Tensor) or not isinstance(value, (int, float, bool, str)):
            if value is not None:
                unknown.append(name)
        else:
            shapes[name] = None
    if unknown:
        example = ", ".join(f"{n!r}: {{0: 'batch'}}" for n in unknown)
        raise UnknownRoleError(
            f"--dynamic: {origin} declares no dynamic shapes and the role of the inputs "
            f"{unknown} is unknown (known roles: {', '.join(sorted(ROLES))}); return "
            f"(model, args, kwargs, dynamic_shapes) from the factory with the dynamic "
            f"axes of each input named, e.g. {{{example}}}, or export without --dynamic"
        )
    if not any(shapes.values()):
        raise UnknownRoleError(
            f"--dynamic: {origin} declares no dynamic shapes and has no input whose role "
            f"gives them; return (model, args, kwargs, dynamic_shapes) from the factory"
        )
    return shapes
