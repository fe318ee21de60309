"""Greedy generation with an exported decode step, run by onnxruntime.

An export for generation is checked by what it generates: :func:`generate` runs the
ONNX model of one step with its cache (inputs ``input_ids``, ``attention_mask`` and
``position_ids`` where the model takes them, ``past_key_values.<layer>.key|value``;
outputs ``logits`` and ``present.<layer>.key|value``, see
:mod:`yobx.torch.onnx.cache_names`) in a loop: the prompt first with an empty cache
(prefill), then one token at a time (decode), each step's ``present`` tensors becoming
the next step's ``past_key_values``. The tokens are the argmax of the last position's
logits, as ``model.generate(do_sample=False)`` picks them.

An encoder-decoder model (T5, BART, Whisper) is exported as two graphs (see
:mod:`yobx.models.hf_seq2seq`): the encoder, run once, and the decoder's step, whose
cache holds the decoder's own keys and values and the cross-attention's keys and values
of the encoder's output (empty at the first step, where the step computes them).
:func:`generate_seq2seq` runs them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: the input name of a cache's tensor, and the output name it comes back as (an
#: encoder-decoder's: ``past_key_values.<layer>.decoder.key`` for self-attention,
#: ``.encoder.key`` for cross-attention)
_PAST = re.compile(r"^past_key_values\.(\d+)\.((?:decoder\.|encoder\.)?(?:key|value))$")
_PRESENT = "present.{layer}.{kind}"

_ONNX_TO_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(bfloat16)": np.float32,
}


class GenerationError(ValueError):
    """The ONNX model is not a decode step :func:`generate` can run."""


def _session(model: Any) -> Any:
    import onnxruntime

    if isinstance(model, onnxruntime.InferenceSession):
        return model
    if isinstance(model, (str, os.PathLike)):
        source: Any = os.fspath(model)
    else:  # an onnx.ModelProto, an onnx_ir.Model or an ExportResult
        proto = getattr(model, "model_proto", model)
        if hasattr(proto, "graph") and not hasattr(proto, "SerializeToString"):
            import onnx_ir as ir

            proto = ir.serde.serialize_model(proto)
        source = proto.SerializeToString()
    return onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"])


def _empty_cache(session: Any, batch: int) -> dict[str, np.ndarray]:
    """The cache inputs of the prefill: each ``(batch, heads, 0, head_dim)``, the static
    sizes read from the model's inputs."""
    cache = {}
    for value in session.get_inputs():
        if not _PAST.match(value.name):
            continue
        shape = list(value.shape)
        if len(shape) != 4 or not all(isinstance(d, int) for d in (shape[1], shape[3])):
            raise GenerationError(
                f"cache input {value.name!r} has shape {shape}: generate needs "
                "(batch, heads, past, head_dim) with static heads and head_dim"
            )
        dtype = _ONNX_TO_NUMPY.get(value.type)
        if dtype is None:
            raise GenerationError(f"cache input {value.name!r} has type {value.type}")
        cache[value.name] = np.zeros((batch, shape[1], 0, shape[3]), dtype=dtype)
    return cache


def generate(
    model: Any,
    input_ids: Any,
    max_new_tokens: int,
    attention_mask: Any = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
) -> np.ndarray:
    """Greedy decoding with an exported decode step and onnxruntime.

    :param model: the decode step's ONNX model: a file name, an
        ``onnxruntime.InferenceSession``, an ``onnx.ModelProto``, an ``onnx_ir.Model``
        or the :class:`~yobx.torch.onnx.ExportResult` of :func:`~yobx.torch.onnx.to_onnx`
    :param input_ids: the prompts, ``(batch, seq)`` integers (numpy or torch)
    :param max_new_tokens: how many tokens to add at most
    :param attention_mask: ``(batch, seq)``, 0 on padding (left padding); all ones by
        default
    :param eos_token_id: a token (or tokens) ending a sequence: once a row emitted it,
        it gets ``pad_token_id`` afterwards, and the loop stops when every row did
    :param pad_token_id: what finished rows get (``eos_token_id`` by default)
    :return: ``(batch, seq + new)``: the prompts followed by the generated tokens
    :raises GenerationError: the model lacks ``input_ids``, ``logits`` or a cache
    """
    session = _session(model)
    names = {value.name for value in session.get_inputs()}
    outputs = [value.name for value in session.get_outputs()]
    if "input_ids" not in names or "logits" not in outputs:
        raise GenerationError(
            f"generate needs a model taking input_ids and returning logits; it takes "
            f"{sorted(names)} and returns {outputs}"
        )
    ids = np.asarray(_numpy(input_ids), dtype=np.int64)
    batch = ids.shape[0]
    mask = (
        np.ones(ids.shape, dtype=np.int64)
        if attention_mask is None
        else np.asarray(_numpy(attention_mask), dtype=np.int64)
    )
    cache = _empty_cache(session, batch)
    if not cache:
        raise GenerationError(
            "the model takes no past_key_values.<layer>.key|value inputs: export the "
            "step with its cache (a DynamicCache in past_key_values) to generate with it"
        )
    _check_fed(names, {"input_ids", "attention_mask", "position_ids", *cache})
    eos, pad = end_tokens(eos_token_id, pad_token_id)
    finished = np.zeros(batch, dtype=bool)
    tokens, step = ids, ids
    past = 0
    for _ in range(max_new_tokens):
        feeds = {"input_ids": step, **cache}
        if "attention_mask" in names:
            feeds["attention_mask"] = mask
        if "position_ids" in names:
            # positions count the tokens the mask keeps (left padding shifts them);
            # padding gets 1, as transformers' generate gives it
            feeds["position_ids"] = mask_positions(mask)[:, past:]
        results = dict(zip(outputs, session.run(None, feeds)))
        chosen, finished = next_tokens(results["logits"], finished, eos, pad)
        tokens = np.concatenate([tokens, chosen[:, None]], axis=1)
        if finished.all():
            break
        past += step.shape[1]
        cache = _next_cache(cache, results)
        step = chosen[:, None]
        mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
    return tokens


def _check_fed(names: set[str], fed: set[str]) -> None:
    """Raises when the step takes inputs the loop does not feed."""
    unfed = sorted(names - fed)
    if not unfed:
        return
    message = f"the model takes {unfed}, which generate does not feed"
    if any(name.startswith("past_key_values.") for name in unfed):
        # transformers' exporters register a flattening of caches keeping every
        # attribute of a layer; yobx's keeps keys and values (the runtimes' convention)
        message += (
            ": tensors of the cache besides its keys and values (a sliding window's "
            "size): the step was exported while a flattening of caches other than "
            "yobx's was registered (transformers' exporters register one); export it "
            "in a process that has not run them, or run it with transformers' runners"
        )
    raise GenerationError(message)


def generate_seq2seq(
    encoder: Any,
    decoder: Any,
    inputs: Mapping[str, Any],
    max_new_tokens: int,
    decoder_start_token_id: int,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
) -> np.ndarray:
    """Greedy decoding of an encoder-decoder model exported as an encoder and a
    decoder step (:func:`yobx.models.hf_seq2seq.hf_seq2seq_generation`), with
    onnxruntime, as ``model.generate(do_sample=False)`` does it.

    :param encoder: the encoder's ONNX model (any form :func:`generate` takes): it
        takes ``inputs`` and returns the encoder's output first
    :param decoder: the decoder step's ONNX model: ``decoder_input_ids``,
        ``encoder_hidden_states``, ``attention_mask`` (the encoder's, where it takes
        one) and ``past_key_values.<layer>.decoder|encoder.key|value``; it returns
        ``logits`` and ``present.<layer>.decoder|encoder.key|value``
    :param inputs: the encoder's inputs by name (``input_ids`` and ``attention_mask``,
        or ``input_features``), numpy or torch
    :param max_new_tokens: how many tokens to add at most
    :param decoder_start_token_id: the token every decoded sequence starts with
    :param eos_token_id: see :func:`generate`
    :param pad_token_id: see :func:`generate`
    :return: ``(batch, 1 + new)``: the start token followed by the generated tokens
    :raises GenerationError: the models are not an encoder and a decoder step
    """
    encoder_session, session = _session(encoder), _session(decoder)
    feeds = {n: _numpy(v) for n, v in inputs.items()}
    encoder_names = [value.name for value in encoder_session.get_inputs()]
    missing = [n for n in encoder_names if n not in feeds]
    if missing:
        raise GenerationError(f"the encoder takes {missing}, which inputs does not give")
    hidden = encoder_session.run(None, {n: feeds[n] for n in encoder_names})[0]
    names = {value.name for value in session.get_inputs()}
    outputs = [value.name for value in session.get_outputs()]
    needed = {"decoder_input_ids", "encoder_hidden_states"}
    if not needed <= names or "logits" not in outputs:
        raise GenerationError(
            f"generate_seq2seq needs a decoder step taking {sorted(needed)} and returning "
            f"logits; it takes {sorted(names)} and returns {outputs}"
        )
    batch = hidden.shape[0]
    step_feeds = {"encoder_hidden_states": hidden}
    if "attention_mask" in names:
        mask = feeds.get("attention_mask")
        step_feeds["attention_mask"] = (
            np.ones(hidden.shape[:2], dtype=np.int64) if mask is None else mask
        )
    cache = _empty_cache(session, batch)
    eos, pad = end_tokens(eos_token_id, pad_token_id)
    finished = np.zeros(batch, dtype=bool)
    tokens = step = np.full((batch, 1), decoder_start_token_id, dtype=np.int64)
    for _ in range(max_new_tokens):
        results = dict(
            zip(outputs, session.run(None, {"decoder_input_ids": step, **step_feeds, **cache}))
        )
        chosen, finished = next_tokens(results["logits"], finished, eos, pad)
        tokens = np.concatenate([tokens, chosen[:, None]], axis=1)
        if finished.all():
            break
        cache = _next_cache(cache, results)
        step = chosen[:, None]
    return tokens


def end_tokens(eos_token_id: Any, pad_token_id: int | None) -> tuple[set, int]:
    """The tokens ending a sequence, and what a finished row gets afterwards
    (``pad_token_id``, else the smallest end token, else 0)."""
    eos = set() if eos_token_id is None else set(np.atleast_1d(eos_token_id).tolist())
    return eos, pad_token_id if pad_token_id is not None else (min(eos) if eos else 0)


def mask_positions(mask: np.ndarray) -> np.ndarray:
    """The positions of the tokens of a left-padded mask, as transformers' generate
    computes them: counted from the first token kept, 1 on padding."""
    return np.where(mask == 0, 1, np.cumsum(mask, axis=1) - 1)


def next_tokens(
    logits: np.ndarray, finished: np.ndarray, eos: set, pad: int
) -> tuple[np.ndarray, np.ndarray]:
    """The greedy choice of the last position of ``logits`` for each row (``pad`` for
    a finished row), and the rows finished after it."""
    chosen = logits[:, -1, :].argmax(axis=-1).astype(np.int64)
    chosen = np.where(finished, pad, chosen)
    return chosen, finished | np.isin(chosen, list(eos))


def _next_cache(cache: dict[str, np.ndarray], results: dict[str, np.ndarray]) -> dict:
    """Each ``present.<layer>.<kind>`` output as the next ``past_key_values`` input."""
    following = {}
    for name in cache:
        layer, kind = _PAST.match(name).groups()  # type: ignore[union-attr]
        present = _PRESENT.format(layer=layer, kind=kind)
        if present not in results:
            raise GenerationError(f"the model takes {name!r} but returns no {present!r}")
        following[name] = results[present]
    return following


def _numpy(value: Any) -> Any:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else value
