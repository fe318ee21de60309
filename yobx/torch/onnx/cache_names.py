"""ONNX names of the tensors of a ``transformers`` cache, in inputs and outputs.

A decode step takes a ``DynamicCache`` and returns it updated: the flat names of
both would be the same (``past_key_values_key_cache_0``), and an ONNX output cannot
share its name with an input. The convention of Hugging Face's ONNX exports is used:

* an input cache passed as argument ``past_key_values`` gives the inputs
  ``past_key_values.<layer>.key`` and ``past_key_values.<layer>.value`` (the
  argument's name is the prefix, except transformers 5's ``cache``, which keeps the
  convention's ``past_key_values``);
* a cache in the outputs gives ``present.<layer>.key`` and ``present.<layer>.value``
  (a second cache in the outputs: ``present_1.<layer>.key``...).

An encoder-decoder model's cache (``EncoderDecoderCache``: the decoder's
self-attention cache and the cross-attention cache of the encoder's keys and values)
follows Optimum's convention: ``past_key_values.<layer>.decoder.key`` (self-attention)
and ``past_key_values.<layer>.encoder.key`` (cross-attention), ``present.<layer>.decoder.key``
and ``present.<layer>.encoder.key`` in the outputs.

The legacy form of a cache, one ``(key, value)`` pair of tensors per layer (the
``tiny-llm`` demo, older transformers models), follows the same convention when its
name says what it is: the argument ``past_key_values``, and an output under the key
``present_key_values``, ``past_key_values`` or ``present``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from yobx.torch.pytree_paths import flatten_with_paths

from ..tracing.inputs import bind_arguments, placeholder_names, register_cache_flattening

#: the prefix of an input cache whose argument has another name: transformers 5
#: calls it ``cache``, runtimes and Hugging Face's exports ``past_key_values``
_INPUT_PREFIXES = {"cache": "past_key_values"}
#: prefix of the tensors of a cache in the outputs
PRESENT = "present"
#: the argument holding a cache in legacy form, and the output keys that do
LEGACY_ARGUMENT = "past_key_values"
LEGACY_OUTPUT_KEYS = ("present_key_values", "past_key_values", "present")


def _legacy_pairs(value: Any) -> list[tuple[Any, Any]] | None:
    """The ``(key, value)`` pairs of a cache in legacy form (a list or tuple of pairs
    of tensors, one per layer), or None."""
    if not isinstance(value, (list, tuple)) or not value:
        return None
    for pair in value:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            return None
        if not all(isinstance(t, torch.Tensor) for t in pair):
            return None
    return [tuple(pair) for pair in value]


def _pair_names(pairs: list[tuple[Any, Any]], prefix: str) -> dict[int, str]:
    return {
        id(tensor): f"{prefix}.{index}.{kind}"
        for index, pair in enumerate(pairs)
        for kind, tensor in zip(("key", "value"), pair)
    }


def _is_cache(value: Any) -> bool:
    layers = getattr(value, "layers", None)
    return (
        isinstance(layers, (list, tuple))
        and type(value).__name__.endswith("Cache")
        and all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers)
    )


def _is_encoder_decoder_cache(value: Any) -> bool:
    return _is_cache(getattr(value, "self_attention_cache", None)) and _is_cache(
        getattr(value, "cross_attention_cache", None)
    )


def _caches(value: Any) -> list[Any]:
    """The caches found in a structure, in pytree order: a cache, or an encoder-decoder
    cache (its two caches under one prefix, :func:`cache_tensor_names` tells them apart)."""
    if _is_cache(value) or _is_encoder_decoder_cache(value):
        return [value]
    found = []
    if isinstance(value, Mapping):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif type(value) in pytree.SUPPORTED_NODES:
        items = pytree.SUPPORTED_NODES[type(value)].flatten_fn(value)[0]
    else:
        return found
    for item in items:
        found.extend(_caches(item))
    return found


def cache_tensor_names(cache: Any, prefix: str) -> dict[int, str]:
    """``id(tensor) -> "<prefix>.<layer>.key"`` (or ``.value``) for a cache;
    ``"<prefix>.<layer>.decoder.key"`` and ``"<prefix>.<layer>.encoder.key"`` for the
    self- and cross-attention caches of an encoder-decoder cache."""
    if _is_encoder_decoder_cache(cache):
        parts = (
            ("decoder.", cache.self_attention_cache),
            ("encoder.", cache.cross_attention_cache),
        )
    else:
        parts = (("", cache),)
    names = {}
    for part, layers in parts:
        for index, layer in enumerate(layers.layers):
            # a flattening that keeps a layer's other tensors (transformers'
            # exporters register one: a sliding window's size, its count of
            # positions seen) names them after their attribute
            for attribute, tensor in vars(layer).items():
                if isinstance(tensor, torch.Tensor) and attribute not in ("keys", "values"):
                    names[id(tensor)] = f"{prefix}.{index}.{part}{attribute.lstrip('_')}"
            for kind, tensor in (("key", layer.keys), ("value", layer.values)):
                if isinstance(tensor, torch.Tensor):
                    names[id(tensor)] = f"{prefix}.{index}.{part}{kind}"
    return names


def onnx_input_names(
    model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any]
) -> dict[str, str]:
    """Input (placeholder) name -> ONNX input name, for the inputs that are in a cache."""
    bound = bind_arguments(model.forward, tuple(args), dict(kwargs))
    legacy = _legacy_pairs(bound.get(LEGACY_ARGUMENT))
    if legacy is None and not any(_caches(value) for value in bound.values()):
        return {}
    register_cache_flattening(list(bound.values()))
    names: dict[int, str] = {} if legacy is None else _pair_names(legacy, LEGACY_ARGUMENT)
    for arg_name, value in bound.items():
        for cache in _caches(value):
            names.update(cache_tensor_names(cache, _INPUT_PREFIXES.get(arg_name, arg_name)))
    leaves_with_path = flatten_with_paths(list(bound.values()))
    flat_names = placeholder_names(list(bound), [path for path, _ in leaves_with_path])
    return {
        flat: names[id(leaf)]
        for flat, (_, leaf) in zip(flat_names, leaves_with_path)
        if id(leaf) in names
    }


def present_names(structure: Any) -> dict[int, str]:
    """``id(tensor) -> "present.<layer>.key"`` for the caches of an output structure."""
    names: dict[int, str] = {}
    caches = _caches(structure)
    if isinstance(structure, Mapping):
        caches += [
            pairs
            for key in LEGACY_OUTPUT_KEYS
            if (pairs := _legacy_pairs(structure.get(key))) is not None
        ]
    for index, cache in enumerate(caches):
        prefix = PRESENT if index == 0 else f"{PRESENT}_{index}"
        if isinstance(cache, list):
            names.update(_pair_names(cache, prefix))
        else:
            names.update(cache_tensor_names(cache, prefix))
    return names
