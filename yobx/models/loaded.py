"""What :func:`yobx.models.load_model` returns: ``(model, args, kwargs, dynamic_shapes)``,
and the input sets the validation should compare on besides the sizes it makes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class LoadedModel(tuple):
    """``(model, args, kwargs, dynamic_shapes)``, unpacked as the tuple it is, with
    :attr:`validation_inputs`: input sets of other sizes whose values agree with each
    other (a vision-language model's image tokens and images), which random inputs of
    other sizes cannot give (see ``to_onnx(validation_inputs=...)``)."""

    validation_inputs: list[Any]

    def __new__(cls, items: Sequence[Any], validation_inputs: Sequence[Any] = ()):
        loaded = super().__new__(cls, items)
        loaded.validation_inputs = list(validation_inputs)
        return loaded
