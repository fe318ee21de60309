"""Tiny configurations of transformers models, and the models built from them.

A configuration class's defaults describe a full-size model. :func:`tiny_model` shrinks
them key by key (:data:`TINY_SIZES`), cuts per-layer and per-stage lists with the
numbers of layers and stages, replaces a timm backbone (timm is not a dependency of
transformers) with transformers' own ResNet, and then builds the model.

Shrinking keys one by one can break a rule that ties several keys together, which
the configuration's validators (or the model's constructor) then refuse: "num_attention_heads
(4) must be the same as num_key_value_heads (2)", "`mrope_section` must sum to half of
`head_dim`", "num_query_pool (3) must be less than the number of layers (2)".
:func:`tiny_model` repairs such a configuration from the message: it tries, for each key
the message names, the value of another key it names, ``1``, the full-size default, and
(for a list of layer indexes) the last layers, and keeps an edit when the message changes
(numbers aside), until the model builds.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

#: small sizes given to any configuration (and sub-configuration) having the key
TINY_SIZES: dict[str, Any] = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    # mixtures of experts: four small experts, two per token
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 64,
    "n_inner": 37,
    "d_model": 32,
    "d_ff": 37,
    "d_kv": 8,
    "num_layers": 2,
    "num_heads": 4,
    "num_decoder_layers": 2,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 37,
    "decoder_ffn_dim": 37,
    "head_dim": 8,
    # GPT-J's rotary part of a head: within the tiny head (32 / 4)
    "rotary_dim": 8,
    # as wide as the text: a vision-language projector writes into its embeddings
    "projection_dim": 32,
    "projection_size": 32,
    # a vision tower writing into the text's embeddings (Qwen2-VL, GLM-4V): as wide
    "out_hidden_size": 32,
    "depth": 2,
    "embed_dim": 32,
    "image_size": 32,
    "patch_size": 8,
    "embedding_size": 8,
    "num_mel_bins": 16,
    "input_feat_per_channel": 16,
    "max_source_positions": 16,
    "max_target_positions": 64,
    # a waveform encoder's feature extractor: two convolutions instead of seven
    "conv_dim": [16, 16],
    "conv_stride": [5, 2],
    "conv_kernel": [10, 3],
    "num_feat_extract_layers": 2,
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 2,
    # convolutional stages (ResNet, MobileNet...): two small ones
    "hidden_sizes": [8, 16],
    "depths": [1, 1],
    "num_stages": 2,
    # Autoformer's decoder starts from the context's last steps: within the tiny context
    "label_length": 2,
    # a detector's object queries, picked among the anchors of a tiny image (RT-DETR)
    "num_queries": 10,
}
#: sizes a configuration leaves unset (``None``) and its model needs: a forecaster's
#: horizon (the context defaults to it)
_UNSET_SIZES = {"prediction_length": 4}
#: keys derived from the number of stages, recomputed by the configuration
_DERIVED = ("stage_names", "out_features", "out_indices")
#: numbers of layers, whose per-layer lists are cut with them
_LAYER_COUNTS = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "num_decoder_layers",
    "encoder_layers",
    "decoder_layers",
)
#: numbers of stages of a convolutional or hierarchical model, whose per-stage lists
#: (strides, patch sizes, heads, ratios) are cut with them
_STAGE_LISTS = ("depths", "hidden_sizes")
#: numbers of stages given beside their lists
_STAGE_COUNTS = ("num_encoder_blocks", "num_stages")
#: the number of attention heads of each stage (Swin's ``num_heads``, [3, 6, 12, 24])
_STAGE_HEADS = ("num_heads", "num_attention_heads", "num_attention_heads_per_stage")
#: backbones of timm, which transformers does not install: replaced by transformers' own
#: ResNet, whose features the detection heads read as they read timm's
_TIMM_BACKBONES = ("timm_backbone",)
#: special tokens must fall inside the tiny vocabulary
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
#: the token standing for an image's features in a vision-language model's text
IMAGE_TOKENS = ("image_token_id", "image_token_index")
#: the token standing for an audio clip's features in a speech-language model's text
AUDIO_TOKENS = ("audio_token_id", "audio_token_index")
#: the tokens starting and ending an image's tokens in a text (Qwen2-VL, GLM-4V)
IMAGE_STARTS = ("vision_start_token_id", "image_start_token_id")
IMAGE_ENDS = ("vision_end_token_id", "image_end_token_id")
#: how many tokens at the end of the tiny vocabulary are kept for the media tokens and
#: the other special tokens beyond it (random texts never draw them)
SPECIAL_TOKENS = 8
#: how many edits :func:`tiny_model` makes to a configuration its validators refuse
_REPAIRS = 8
#: the largest number tried as a size while repairing a configuration
_LARGEST = 2048


def _shrunk(values: dict[str, Any], keep_stages: bool = False) -> dict[str, Any]:
    """A configuration's ``to_dict()`` with small sizes (sub-configurations too);
    ``keep_stages`` keeps the number of stages of a backbone (see :func:`tiny_model`)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value.get("model_type") in _TIMM_BACKBONES:
            out[key] = _shrunk(_resnet_backbone(value), keep_stages)
        elif isinstance(value, dict) and "model_type" in value:
            out[key] = _shrunk(value, keep_stages)
        elif keep_stages and key in _STAGE_LISTS and isinstance(value, (list, tuple)):
            out[key] = _kept_stages(key, len(value))
        elif key in TINY_SIZES and _same_kind(value, TINY_SIZES[key]):
            out[key] = TINY_SIZES[key]
        elif value is None and key in _UNSET_SIZES:
            out[key] = _UNSET_SIZES[key]
        elif key not in _DERIVED or keep_stages:
            out[key] = value
    if keep_stages:
        _narrow_stage_widths(values, out)
    for key in _TOKEN_IDS:
        if isinstance(out.get(key), int) and out[key] >= TINY_SIZES["vocab_size"]:
            out[key] = 0
    # a value per layer (`layer_types`, Gemma3n's `intermediate_size`) or per stage
    # (PVT's `strides`, `sr_ratios`): the first ones, as many as the layers or stages kept
    counts = {
        values[key]: out[key]
        for key in _LAYER_COUNTS
        if isinstance(values.get(key), int) and isinstance(out.get(key), int)
    }
    layers = min(counts.values(), default=None)
    for key in _STAGE_LISTS:
        if isinstance(values.get(key), (list, tuple)) and isinstance(out.get(key), list):
            counts.setdefault(len(values[key]), len(out[key]))
            for count in _STAGE_COUNTS:
                if values.get(count) == len(values[key]):
                    out[count] = len(out[key])
    for key, value in out.items():
        kept = counts.get(len(value)) if isinstance(value, (list, tuple)) else None
        if kept is not None and kept < len(value) and value is values.get(key):
            out[key] = type(value)(value[:kept])
    _fit_mrope_sections(out)
    for key in _STAGE_HEADS:
        heads = out.get(key)
        if isinstance(heads, list) and heads and all(_is_int(h) and h > 0 for h in heads):
            # the stages' widths are the tiny width times powers of two (Swin's
            # embed_dim 96 doubles at each stage): head counts that are powers of two
            # divide them, 3 does not divide 32 (3 heads become 4, 6 become 8)
            out[key] = [1 << round(math.log2(h)) for h in heads]
    _fit_window(out)
    # settings of some layers by their index (Gemma 4's `per_layer_config`, `"05"`):
    # those of the layers kept
    if layers is not None and isinstance(out.get("per_layer_config"), dict):
        out["per_layer_config"] = {
            index: setting
            for index, setting in out["per_layer_config"].items()
            if str(index).isdigit() and int(index) < layers
        }
    return out


def _kept_stages(key: str, count: int) -> list[int]:
    """``count`` small stages: one block each, widths doubling from 8."""
    return [8 * 2**i for i in range(count)] if key == "hidden_sizes" else [1] * count


def _narrow_stage_widths(values: dict[str, Any], out: dict[str, Any]) -> None:
    """The widths a detection head reads from its backbone's stages (RT-DETR's
    ``encoder_in_channels`` [512, 1024, 2048], the last three of the backbone's
    ``hidden_sizes``) narrowed as the backbone's were: a list of distinct numbers
    equal to consecutive full-size stage widths takes the tiny stage widths."""
    pairs = [
        (values[key]["hidden_sizes"], out[key]["hidden_sizes"])
        for key in values
        if isinstance(values[key], dict)
        and isinstance(out.get(key), dict)
        and isinstance(values[key].get("hidden_sizes"), list)
        and len(values[key]["hidden_sizes"]) == len(out[key].get("hidden_sizes") or [])
    ]
    for key, value in out.items():
        if not isinstance(value, list) or len(set(value)) != len(value) or len(value) < 2:
            continue
        for full, tiny in pairs:
            starts = [i for i in range(len(full)) if full[i : i + len(value)] == value]
            if starts:
                out[key] = tiny[starts[0] : starts[0] + len(value)]
                break


def _fit_mrope_sections(values: dict[str, Any]) -> None:
    """Multimodal rotary embeddings (Qwen2-VL) split half a head among time, rows and
    columns (``mrope_section``, ``[16, 24, 24]`` for heads of 128): the sections are
    scaled to the tiny head, each keeping at least one."""
    head = values.get("head_dim")
    if not _is_int(head) and _is_int(values.get("hidden_size")):
        heads = values.get("num_attention_heads")
        head = values["hidden_size"] // heads if _is_int(heads) and heads > 0 else None
    for key in ("rope_parameters", "rope_scaling"):
        rope = values.get(key)
        sections = rope.get("mrope_section") if isinstance(rope, dict) else None
        if not _is_int(head) or not isinstance(sections, list) or sum(sections) == head // 2:
            continue
        half, total = head // 2, sum(sections)
        scaled = [max(1, section * half // total) for section in sections]
        scaled[0] += half - sum(scaled)
        if scaled[0] >= 1:
            values[key] = {**rope, "mrope_section": scaled}


def _fit_window(values: dict[str, Any]) -> None:
    """A hierarchical vision transformer attending within windows (Swin: ``window_size``
    7 on a 56x56 grid of patches, halved at each of its ``depths``' stages) builds each
    window's position table with the configured size, and shrinks the window (no shift)
    on a grid as small as it: a regime full-size models never meet, where the tiny
    image's grid (4x4 patches, then 2x2) would put them. Windows of 2 on a grid twice
    as wide at the last stage keep the full-size model's regime."""
    window, depths = values.get("window_size"), values.get("depths")
    patch = values.get("patch_size")
    if not all(_is_int(v) for v in (window, patch, values.get("image_size"))):
        return
    if not isinstance(depths, list) or window <= 2:
        return
    values["window_size"] = 2
    values["image_size"] = patch * 2 * 2 ** len(depths)


def _resnet_backbone(timm: dict[str, Any]) -> dict[str, Any]:
    """A transformers ResNet configuration standing for a timm backbone's (same input
    channels; its stages, shrunk, are the features the model reads)."""
    from transformers import ResNetConfig

    resnet = ResNetConfig(num_channels=timm.get("num_channels", 3)).to_dict()
    return {key: value for key, value in resnet.items() if key not in _DERIVED}


def _same_kind(value: Any, tiny: Any) -> bool:
    if isinstance(tiny, list):
        return isinstance(value, (list, tuple))
    return isinstance(value, int) and not isinstance(value, bool)


def tiny_model(cls: Any, keep_stages: bool = False) -> tuple[Any, torch.nn.Module]:
    """``(config, model)``: the configuration of ``cls`` with small sizes (see the
    module's docstring), eager attention, no dropout and no cache (the cache is not an
    input of these models), and the model built from it with seeded random weights, in
    evaluation mode.

    A backbone's stages are cut to two. A detection head reading three or four of them
    (RT-DETR, D-FINE) needs them all: ``keep_stages`` keeps their number (one block
    each, widths 8, 16, 32...), with the selected stages (``out_indices``) and the
    widths the head reads from them narrowed alike.

    :raises Exception: what the configuration or the model raised at the last try,
        when no edit of the keys it names (see the module's docstring) makes it build
    """
    config_class = cls.config_class
    defaults = config_class().to_dict()
    values = _shrunk(defaults, keep_stages)
    # the configurations tried and the rules they broke: an edit never leads back to
    # either (two rules on one key would otherwise undo each other's edit forever, and
    # an edit breaking a rule satisfied before is no progress)
    seen: list[dict[str, Any]] = [values]
    broken: set[str] = set()
    for _ in range(_REPAIRS + 1):
        built = _built(cls, values)
        if not isinstance(built, Exception):
            return built
        broken.add(_shape(str(built)))
        edited = _repaired(cls, values, defaults, str(built), (seen, broken))
        if edited is None:
            break
        values = edited
        seen.append(values)
    # the rule no edit satisfied (the edits before it made progress)
    raise built


def tiny_config(cls: Any) -> Any:
    """The configuration :func:`tiny_model` builds its model from."""
    return tiny_model(cls)[0]


def _built(cls: Any, values: dict[str, Any]) -> tuple[Any, torch.nn.Module] | Exception:
    """The configuration and model of ``values``, or what building them raised."""
    try:
        config = _finished(cls.config_class.from_dict(values))
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = spread_zero_matrices(cls(config).eval())
    except Exception as e:
        return e
    return config, model


def spread_zero_matrices(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its all-zero matrices given small random values. A head
    initialised to zeros (RT-DETR's scores of its anchors, a router's scores of its
    experts) gives every candidate the same score: ``topk`` then picks among ties, which
    eager and onnxruntime break differently, and the comparison of an export says
    nothing. A trained model has no such ties."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2 and parameter.numel() and not parameter.any():
                parameter.normal_(std=0.02)
    return model


def _finished(config: Any) -> Any:
    """``config`` with media tokens inside the vocabulary, eager attention, no cache and
    no dropout."""
    vocab = int(config_attribute(config, "vocab_size", TINY_SIZES["vocab_size"]))
    for name in (*IMAGE_TOKENS, *AUDIO_TOKENS):
        # the tiny vocabulary's last token (the text hf: builds never draws it)
        if isinstance(getattr(config, name, None), int) and getattr(config, name) >= vocab - 1:
            setattr(config, name, vocab - 1)
    # the other special tokens beyond the vocabulary (an image's start and end, a
    # video's token...): distinct tokens just below it
    free = iter(range(vocab - 2, vocab - SPECIAL_TOKENS, -1))
    for name, value in config.to_dict().items():
        special = name.endswith(("_token_id", "_token_index")) and name not in _TOKEN_IDS
        if special and _is_int(value) and value >= vocab - 1 and name not in IMAGE_TOKENS:
            setattr(config, name, next(free, vocab - SPECIAL_TOKENS))
    for sub in (config, *(getattr(config, n, None) for n in ("text_config", "vision_config"))):
        if sub is None:
            continue
        if "mrope_section" in getattr(sub, "ignore_keys_at_rope_validation", ()):
            # sections the modeling code assumes when the configuration has none
            # (Qwen2-VL and GLM-4V read [16, 24, 24] by default): given, then fitted
            rope = getattr(sub, "rope_parameters", None)
            if isinstance(rope, dict) and "rope_type" in rope and "mrope_section" not in rope:
                sub.rope_parameters = {**rope, "mrope_section": [16, 24, 24]}
            _fit_mrope_sections(sub.__dict__)
        sub._attn_implementation = "eager"
        if hasattr(sub, "use_cache"):
            sub.use_cache = False
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout"):
            if isinstance(getattr(sub, name, None), float):
                setattr(sub, name, 0.0)
    return config


def _repaired(
    cls: Any, values: dict[str, Any], defaults: dict[str, Any], message: str, tried: tuple
) -> dict[str, Any] | None:
    """``values`` with one edit after which the model builds, or breaks a rule (a
    message, numbers aside) not broken yet, or ``None``. ``tried`` holds the
    configurations tried and the rules broken so far. The candidates, in this order:
    for each key the message names, the values of the other keys it names and the
    numbers it gives (smallest first), then ``1``, the full-size default and, for a
    list of numbers, the last layers (``-1, -2...``)."""
    seen, broken = tried
    named = _named(message, _leaves(values))
    numbers = [int(n) for n in re.findall(r"(?<![\w.])\d+(?![\w.])", message)]
    edits = [
        (rank, candidate if _is_int(candidate) else 0, path, candidate)
        for path in named
        for rank, candidate in _candidates(path, values, defaults, named, numbers)
    ]
    # by rank, then smallest first; the order of the message otherwise (a stable sort:
    # the candidates themselves, lists and numbers, do not compare)
    for _rank, _size, path, candidate in sorted(edits, key=lambda edit: edit[:2]):
        edited = _with(values, path, candidate)
        if edited in seen:
            continue
        built = _built(cls, edited)
        if not isinstance(built, Exception) or _shape(str(built)) not in broken:
            return edited
    return None


def _candidates(
    path: tuple, values: dict[str, Any], defaults: dict[str, Any], named: list, numbers: list
) -> list[tuple[int, Any]]:
    """``(rank, value)`` for each value tried at ``path`` (see :func:`_repaired`)."""
    value = _at(values, path)
    found: list[tuple[int, Any]] = []
    if _is_int(value):
        others = [_at(values, other) for other in named if _is_int(_at(values, other))]
        found += [(0, number) for number in [*others, *numbers]] + [(1, 1)]
    found.append((2, _at(defaults, path)))
    if isinstance(value, list) and value and all(_is_int(v) for v in value):
        found.append((3, [-1 - i for i in range(len(value))]))
    # a size is never made larger than _LARGEST (the model must stay tiny)
    return [
        (rank, c)
        for rank, c in found
        if c is not None and c != value and (not _is_int(c) or 0 < c <= _LARGEST)
    ]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _leaves(values: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The paths of the values that are not sub-configurations."""
    found = []
    for key, value in values.items():
        if isinstance(value, dict):
            found += _leaves(value, (*prefix, key))
        else:
            found.append((*prefix, key))
    return found


def _named(message: str, paths: list[tuple]) -> list[tuple]:
    """The paths of the keys ``message`` names: by their dotted path where it gives one
    (```vision_config.text_hidden_size```), else by their name (every
    ``hidden_size``)."""
    words = set(re.findall(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", message))
    dotted = [tuple(word.split(".")) for word in words if "." in word]
    # a dotted name ends the path (``head_config.audio_hidden_size`` may sit deeper)
    exact = [p for p in paths if any(tuple(map(str, p[-len(d) :])) == d for d in dotted)]
    leaves = {d[-1] for d in dotted}
    return exact + [p for p in paths if str(p[-1]) in words and str(p[-1]) not in leaves]


def _shape(message: str) -> str:
    """A message with its numbers out: the same rule broken with other values reads
    the same."""
    return re.sub(r"-?\d+", "#", message)


def _at(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        values = values.get(key) if isinstance(values, dict) else None
    return values


def _with(values: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of ``values`` with ``value`` at ``path``."""
    head, *rest = path
    return {**values, head: _with(values[head], tuple(rest), value) if rest else value}


def config_attribute(config: Any, name: str, default: Any = None) -> Any:
    """``config.name``, else the vision or text sub-configuration's."""
    for holder in (
        config,
        getattr(config, "vision_config", None),
        getattr(config, "text_config", None),
    ):
        value = getattr(holder, name, None) if holder is not None else None
        if value is not None:
            return value
    return default
