"""Hugging Face models built from tiny configurations with random weights.

Nothing is downloaded: the configuration is created in code with small sizes.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from yobx.models.hf_configs import TINY_SIZES
from yobx.models.roles import attention_mask_length

#: Small sizes applied to any configuration having these attributes: those of
#: :data:`yobx.models.hf_configs.TINY_SIZES` for a decoder, and a few of its own.
_TINY = {
    **{
        key: TINY_SIZES[key]
        for key in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "max_position_embeddings",
            "n_embd",
            "n_layer",
            "n_head",
            "n_positions",
            "n_inner",
        )
    },
    "max_seq_len": 64,
    "type_vocab_size": 2,
    # rotary dimensions must fit in a head (32 / 4 heads = 8)
    "rotary_dim": 4,
}


def tiny_config(architecture: str) -> Any:
    """Returns a tiny configuration for ``architecture`` (e.g. ``LlamaForCausalLM``)."""
    config_class = _model_class(architecture).config_class
    defaults = config_class()
    overrides = {k: v for k, v in _TINY.items() if hasattr(defaults, k)}
    # Special token ids of the full-size vocabulary fall outside the tiny one.
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        value = getattr(defaults, name, None)
        if isinstance(value, int) and value >= _TINY["vocab_size"]:
            overrides[name] = 0
    config = config_class(**overrides)
    # Eager attention is the reference implementation, and the cache object is not an
    # input or output of these demos.
    config._attn_implementation = "eager"
    config.use_cache = False
    if hasattr(config, "hidden_dropout_prob"):
        config.hidden_dropout_prob = 0.0
        config.attention_probs_dropout_prob = 0.0
    return config


def _model_class(architecture: str) -> Any:
    import transformers

    model_class = getattr(transformers, architecture, None)
    if model_class is None or not hasattr(model_class, "config_class"):
        raise ValueError(f"transformers has no model architecture named {architecture!r}")
    return model_class


def _token_inputs(model: torch.nn.Module, config: Any, batch: int, seq: int):
    """``(model, args, kwargs, dynamic_shapes)`` with token ids and an attention mask."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
    attention_mask = torch.ones((batch, seq), dtype=torch.int64)
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    # Position embeddings are tables: the sequence cannot exceed their size.
    max_positions = (
        getattr(config, "max_position_embeddings", None)
        or getattr(config, "n_positions", None)
        or getattr(config, "max_seq_len", None)
    )
    seq_dim = torch.export.Dim("seq", max=max_positions) if max_positions else "seq"
    dims = {0: "batch", 1: seq_dim}
    return model, (), kwargs, {"input_ids": dims, "attention_mask": dims}


def hf_model(architecture: str, batch: int = 2, seq: int = 5):
    """Returns ``(model, args, kwargs, dynamic_shapes)`` for a tiny random model: token
    ids and a mask for a text model, the inputs of its family for any other (see
    :mod:`yobx.models.hf_families`)."""
    from yobx.models.hf_families import family_of, hf_family_model

    model_class = _model_class(architecture)
    if family_of(model_class) != "text":
        return hf_family_model(architecture, batch=batch)
    config = tiny_config(architecture)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_class(config).eval()
    return _token_inputs(model, config, batch, seq)


#: what ``--task`` may ask of ``hf:``: the model's own inputs and outputs
#: (``feature-extraction``, the default), or one step of generation with its cache
TASKS = ("feature-extraction", "text-generation")


#: the tasks ``yobx export --task`` takes beside ``feature-extraction`` (the model's
#: own inputs and outputs), and transformers' auto mappings of the architectures
#: serving each
TASK_MAPPINGS = {
    "text-generation": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",),
    "text2text-generation": (
        "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
        "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    ),
    "image-classification": ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",),
    "automatic-speech-recognition": (
        "MODEL_FOR_CTC_MAPPING_NAMES",
        "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    ),
}
#: every task ``yobx export --task`` takes
HF_TASKS = ("feature-extraction", *TASK_MAPPINGS)


def _serves(architecture: str, task: str) -> bool:
    from transformers.models.auto import modeling_auto

    for mapping in TASK_MAPPINGS[task]:
        for names in getattr(modeling_auto, mapping, {}).values():
            if architecture in (names if isinstance(names, (list, tuple)) else [names]):
                return True
    return False


def export_kind(architecture: str, task: str | None = None) -> str:
    """What ``task`` exports of ``architecture``: ``feature-extraction`` (the model's
    own inputs and outputs), ``text-generation`` (one step with its cache) or
    ``text2text-generation`` (an encoder graph and a decoder step).

    Without a task, the architecture decides, as transformers' auto mappings classify
    it: a causal language model taking a cache is exported for ``text-generation``, an
    encoder-decoder one (T5, BART, Whisper) for ``text2text-generation``, any other
    model for its outputs. ``image-classification`` and ``automatic-speech-recognition``
    (CTC) are the model's outputs, checked to be what the architecture does; a speech
    encoder-decoder's ``automatic-speech-recognition`` is its ``text2text-generation``.

    :raises ValueError: an unknown task, or one the architecture does not serve
    """
    if task not in (None, *HF_TASKS):
        raise ValueError(f"unknown task {task!r}: expected one of {', '.join(HF_TASKS)}")
    model_class = _model_class(architecture)
    encoder_decoder = getattr(model_class.config_class(), "is_encoder_decoder", False)
    if task is None:
        if encoder_decoder and _serves(architecture, "text2text-generation"):
            return "text2text-generation"
        parameters = inspect.signature(model_class.forward).parameters
        takes_cache = "cache" in parameters or "past_key_values" in parameters
        if takes_cache and _serves(architecture, "text-generation"):
            return "text-generation"
        return "feature-extraction"
    if task in ("image-classification", "automatic-speech-recognition"):
        if not _serves(architecture, task):
            raise ValueError(
                f"{architecture} does not do {task}: transformers' "
                f"{' or '.join(TASK_MAPPINGS[task])} does not list it"
            )
        speech_seq2seq = encoder_decoder and task == "automatic-speech-recognition"
        return "text2text-generation" if speech_seq2seq else "feature-extraction"
    return task


def hf_generation_model(
    architecture: str,
    batch: int = 2,
    seq: int = 3,
    past: int = 5,
    config_path: str | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[Any, tuple, dict, dict]:
    """``(model, args, kwargs, dynamic_shapes)`` for one step of generation of a tiny
    random decoder: ``input_ids`` and ``position_ids`` where the model takes them
    (``batch``, ``seq``), ``attention_mask`` over the cache and the new tokens
    (``batch``, ``total``: ``past + seq``) and the cache (argument ``cache``,
    ``past_key_values`` before transformers 5), a ``DynamicCache`` of ``past``
    positions (``batch``, ``past``), whose tensors the ONNX model takes as
    ``past_key_values.<layer>.key|value``. The exported step serves the prefill
    (``past = 0``) and the decode (``seq = 1``) alike; it returns ``logits`` and the
    updated cache (``present.*``), which :func:`yobx.torch.onnx.generate.generate`
    feeds back.

    :param config_path: a ``config.json`` (or its directory): the model of that
        configuration, its parameters on the meta device (the weights are applied to
        the export, as :func:`hf_model_from_config` does); a tiny random one by default
    :param dtype: with ``config_path``, the dtype of the floating parameters and of
        the cache
    :raises ValueError: the architecture is not a decoder with a cache
    """
    import transformers

    model_class = _model_class(architecture)
    parameters = inspect.signature(model_class.forward).parameters
    # transformers 5 renamed the argument (past_key_values still goes through **kwargs)
    argument = "cache" if "cache" in parameters else "past_key_values"
    if argument not in parameters:
        raise ValueError(
            f"{architecture} takes no past_key_values: text-generation needs a decoder "
            "with a cache (an architecture ...ForCausalLM)"
        )
    if config_path is None:
        config = tiny_config(architecture)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = model_class(config).eval()
    else:
        model = _meta_model(model_class, config_path, dtype)
    config = model.config
    config.use_cache = True
    cache = transformers.DynamicCache(config=config)
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    generator = torch.Generator().manual_seed(2)
    layers = config.num_hidden_layers
    for layer in range(layers):
        shape = (batch, heads, past, head_dim)
        keys, values = (torch.randn(shape, generator=generator, dtype=dtype) for _ in "kv")
        cache.update(keys, values, layer)
    kwargs = {
        "input_ids": torch.randint(3, config.vocab_size, (batch, seq), generator=generator),
        "attention_mask": torch.ones((batch, past + seq), dtype=torch.int64),
        argument: cache,
    }
    if "position_ids" in parameters:
        # given, not computed from the cache's length: a left-padded prompt's positions
        # start after its padding (generate computes them from the mask)
        kwargs["position_ids"] = torch.arange(past, past + seq).repeat(batch, 1)
    try:
        if config_path is None:  # a model on the meta device cannot run
            with torch.no_grad():
                # on a copy: the step appends its keys and values to the cache it is given
                model(**copy.deepcopy(kwargs))
    except Exception as e:
        raise ValueError(
            f"{architecture} does not run one step with a DynamicCache of {layers} "
            f"layers of (batch, {heads}, past, {head_dim}): {type(e).__name__}: {e}"
        ) from e
    from yobx.torch.tracing.inputs import cache_dynamic_shapes

    cache_dims = cache_dynamic_shapes(cache, {0: "batch", 2: "past"})
    dynamic_shapes = {
        "input_ids": {0: "batch", 1: "seq"},
        # "past + seq": the mask spans the cache and the new tokens, as generation
        # passes it (no version for a longer or shorter mask)
        "attention_mask": {0: "batch", 1: attention_mask_length(kwargs, cache)},
        argument: cache_dims,
        "position_ids": {0: "batch", 1: "seq"},
    }
    dynamic_shapes = {name: dynamic_shapes[name] for name in kwargs}
    return model, (), kwargs, dynamic_shapes


def _meta_model(model_class: Any, config_path: str, dtype: torch.dtype | None) -> Any:
    """The model of ``config_path`` with its parameters on the meta device (eager
    attention, the reference implementation)."""
    import os

    from yobx.torch.onnx.weights import empty_weights

    if not os.path.exists(config_path):
        raise ValueError(f"configuration {config_path!r} does not exist")
    config = model_class.config_class.from_pretrained(config_path)
    config._attn_implementation = "eager"
    with empty_weights(), _default_dtype(dtype):
        return model_class(config).eval()


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """Creates floating tensors in ``dtype`` (the weights' dtype: a mismatch is an
    error when they are applied), as transformers' ``from_pretrained`` does."""
    if dtype is None:
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def hf_model_from_config(
    architecture: str,
    config_path: str,
    dtype: torch.dtype | None = None,
    batch: int = 2,
    seq: int = 5,
):
    """Returns ``(model, args, kwargs, dynamic_shapes)`` for a model of real size built
    from ``config_path`` (a ``config.json`` or its directory) without its weights.

    Parameters are on the meta device (nothing is allocated), buffers computed in
    ``__init__`` (rotary tables) are computed on the CPU
    (:func:`yobx.torch.onnx.weights.empty_weights`); the weights are applied to the
    exported model.

    :param architecture: a transformers model class (``LlamaForCausalLM``)
    :param config_path: a ``config.json`` or a directory holding one
    :param dtype: the dtype of the floating parameters (the checkpoint's)
    """
    model = _meta_model(_model_class(architecture), config_path, dtype)
    # the cache object is not an input or output of the exported model
    model.config.use_cache = False
    return _token_inputs(model, model.config, batch, seq)
