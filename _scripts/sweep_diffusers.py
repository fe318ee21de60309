"""Sweep: every model class of the installed diffusers, built tiny, through torch.export,
yobx's tracer, yobx's ONNX export and torch.onnx, side by side.

The classes are the subclasses of ``diffusers.ModelMixin`` the package exports. Each one is
built with small sizes passed to ``__init__`` (found from the names of its parameters:
one or two blocks and layers, two heads of 16, widths of 32 or 64, 8 groups, rotary axes
summing to the head dimension, ...), a second time with fewer of them when that fails, and
with its defaults when those give fewer than 50M parameters (each attempt is first built
on the meta device: a configuration past 50M parameters is never allocated). The weights
are random; parameters initialised to zeros (zero convolutions of ControlNets, adaLN-zero
modulations, ...) get small random values, otherwise the comparison says little.

The inputs are found by running eager PyTorch: the required arguments of ``forward`` and
the common optional ones (``encoder_hidden_states``, ``timestep``, ``pooled_projections``,
position ids, ...) get candidate tensors shaped from the configuration (the main input as
an image ``(B, C, H, W)``, a video ``(B, C, F, H, W)``, tokens ``(B, L, C)`` or a signal
``(B, C, L)``, the text as ``(B, T, D)``...); the first candidate eager runs fixes the
layout. The batch is dynamic, and so are the image size, the token count and the text
length when the model runs with two values of them. Each path captures at the example
size (2, 16, 8) and is compared with eager at the other one (3, 32, 12); the output
compared is the first tensor the model returns (``return_dict=False``)::

    python _scripts/sweep_diffusers.py [--limit N] [--timeout S] [--only PATHS] [--probe]
                                       [NAME ...]

``--probe`` only builds and finds the inputs (no export): a line per class with its size
and input layout (``level``: which set of sizes built it, see :func:`tiny_kwargs`).
Every class runs in a forked process (a crash or a hang costs that line only; the
process may not map more than ``SWEEP_MEMORY_GB``, 10 by default). A line per class
(with the error of each path that fails and the seconds each path took), then the counts
per path and the classes torch.export (or torch.onnx) takes and yobx (or yobx's ONNX)
does not. Statuses: ``ok`` (close at the other size), ``UNSTABLE`` (values differ
only where eager in float64 does: see ``sweep_transformers.unstable_reference``),
``WRONG`` (values differ: the worst outcome, with the largest difference), ``fail`` (an
error, its first line), ``timeout``,
``crash``, ``-`` (eager itself fails on the tiny configuration, the model is too big or
the model is random).
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import os
import re
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

from sweep_transformers import _first_line, compared, run_forked

PATHS = ("export", "yobx", "yobx-onnx", "torch-onnx")
EXAMPLE = {"B": 2, "T": 8}
OTHER = {"B": 3, "T": 12}
MAX_PARAMS = 50_000_000
PROBE_SECONDS = 40.0
MAX_TRIES = 300
HEAD = 16
WIDTH = 32
OMIT = object()

# exact values for the parameters of ``__init__`` with these names
TINY = {
    "num_attention_heads": 2,
    "num_heads": 2,
    "n_heads": 2,
    "nheads": 2,
    "dit_heads": 2,
    "block_num_heads": 2,
    "num_key_value_heads": 2,
    "num_kv_heads": 2,
    "n_kv_heads": 2,
    "num_key_value_attention_heads": 2,
    "num_cross_attention_heads": 2,
    "cross_attention_head_dim": HEAD,
    "motion_num_attention_heads": 2,
    "decoder_num_attention_heads": 2,
    "text_num_attention_heads": 2,
    "text_num_key_value_heads": 2,
    "ctrl_num_attention_heads": 2,
    "attn_num_heads": 2,
    "face_encoder_num_heads": 2,
    "addition_embed_type_num_heads": 2,
    "norm_num_groups": 8,
    "groups": 8,
    "max_norm_num_groups": 8,
    "ctrl_max_norm_num_groups": 8,
    "motion_norm_num_groups": 8,
    "encoder_norm_num_groups": 8,
    "decoder_norm_num_groups": 8,
    "intermediate_size": 64,
    "ffn_dim": 64,
    "ff_dim": 64,
    "ffn_hidden_size": 64,
    "ff_inner_dim": 64,
    "moe_intermediate_dim": 32,
    "num_experts": 4,
    "num_routed_experts": 4,
    "multiple_of": 16,
    "hidden_size": WIDTH,
    "dim": WIDTH,
    "model_dim": WIDTH,
    "layers_per_block": 1,
    "num_layers": 1,
    "num_single_layers": 1,
    "num_refiner_layers": 1,
    "n_refiner_layers": 1,
    "num_mmdit_layers": 1,
    "num_single_dit_layers": 1,
    "num_hidden_layers": 1,
    "transformer_num_layers": 1,
    "sample_size": 16,
    "motion_max_seq_length": 32,
    "max_text_seq_length": 8,
    "text_len": 8,
    "text_len_t5": 8,
    "n_embd": WIDTH,
    "n_layer": 1,
    "n_head": 2,
    "n_inner": 64,
    "num_embeddings": EXAMPLE["T"],
}
# values given to parameters whose default is None, in the first variant and the second
NONE_FILL = (
    {"num_kv_heads": 2},
    {
        "in_channels": 4,
        "out_channels": 4,
        "patch_size": 2,
        "sample_size": 16,
        "num_kv_heads": 2,
        "caption_channels": WIDTH,
    },
    {"in_channels": 8, "num_kv_heads": 2},
)
# what the names of the parameters do not tell (the shrunk levels only)
HINTS = {
    # the padding mask is resized with torchvision, not installed
    "CosmosTransformer3DModel": {"concat_padding_mask": False},
    # micro_cond_embed_dim is five embeddings of micro_cond_encode_dim
    "UVit2DModel": {"micro_cond_encode_dim": 16, "micro_cond_embed_dim": 80},
    "OmniGenTransformer2DModel": {
        "rope_scaling": {"short_factor": [1.0] * 8, "long_factor": [1.0] * 8}
    },
    "PRXTransformer2DModel": {"axes_dim": [8, 8]},
    # the Fourier embedding of the time is concatenated to the input
    "UNet1DModel": {"extra_in_channels": 64},
}
# lists of layer indices (blocks with an extra branch): only the first layer remains
LAYER_INDICES = re.compile(r"layers$|layer_ids$|layers_places$")
# names of parameters counting layers or blocks: 1 (a tuple of them: ones)
COUNT = re.compile(
    r"(^|_)(num|n)_.*(layers|blocks)$|layers_per_.*block|^depth$|_depth$|^nlayers$"
    r"|num_res_blocks|^n_layer$|layers_per_block$"
)
HEADS = re.compile(r"heads$")
HEAD_DIM = re.compile(r"(^|_)head_dim$|^attention_head_dim$|^dim_head$|^dim_heads$")
# names of parameters giving a width: more than 64 becomes 32
WIDE = re.compile(r"dim|size|channels|channel$|features|width|hidden|^ch$|_ch$|inner")
NOT_WIDE = re.compile(
    r"sample_size|sample_(width|height|frames)|^sample|sampling|patch|vocab|codebook|rate|len|max|pos|step|resolution|image_size|window|frame"
    r"|seq|kernel|stride|batch|^num_(channels|mels)|factor|ratio|scale|theta|period|shift"
    r"|ada_norm|mel|n_fft|hop|tokens|experts|lens"
)
ROPE = re.compile(r"axes_dim|rope_dim|rope_axes|mrope_section|axes_dims")


def model_classes() -> list[str]:
    """The names of the subclasses of ``ModelMixin`` diffusers exports."""
    import diffusers

    names = []
    for name in dir(diffusers):
        if name.startswith("_"):
            continue
        try:
            value = getattr(diffusers, name)
        except Exception:
            continue
        if (
            isinstance(value, type)
            and issubclass(value, diffusers.ModelMixin)
            and value is not diffusers.ModelMixin
        ):
            names.append(name)
    return names


def _scaled_widths(values: tuple) -> tuple:
    low = min(values)
    return tuple(min(2, max(1, round(v / low))) * WIDTH for v in values)


def _rope_axes(values, head_default, head_now) -> tuple | None:
    """Rotary axes (even, at least 2) scaled as the head dimension is."""
    total = sum(values)
    target = round(total * head_now / head_default) if head_default else head_now
    if target < 2 * len(values):
        return None
    scaled = [max(2, 2 * round(v * target / total / 2)) for v in values]
    scaled[-1] += target - sum(scaled)
    return tuple(scaled) if scaled[-1] >= 2 else None


LEVELS = (0, 1, 2, 3, 4)


def tiny_kwargs(cls, level: int) -> dict:
    """Small values for the parameters of ``cls.__init__``: ``level`` 0 shrinks every
    parameter whose name says what it is, 1 and 2 the same and fill some parameters left
    to None (``NONE_FILL``), 3 only the counts of layers and heads, 4 nothing but the
    parameters without defaults."""
    fill = NONE_FILL[level] if level < len(NONE_FILL) else NONE_FILL[-1]
    shrink = 0 if level < 3 else 1
    params = {k: p for k, p in inspect.signature(cls.__init__).parameters.items() if k != "self"}
    unet_like = "block_out_channels" in params
    head_param = next((k for k in params if HEAD_DIM.search(k)), None)
    head_default = params[head_param].default if head_param else None
    head_now = 8 if unet_like else HEAD
    if not isinstance(head_default, int):
        head_default = None
    kwargs = {}
    for name, p in params.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = p.default
        if default is p.empty:
            kwargs[name] = _required_value(cls, name)
            continue
        if level >= 4:
            continue
        if default is None and name in fill:
            kwargs[name] = fill[name]
            continue
        value = _tiny_value(name, default, shrink, head_now)
        if value is not OMIT:
            kwargs[name] = value
    if shrink == 0:
        for name, p in params.items():
            default = p.default
            if (
                ROPE.search(name)
                and isinstance(default, (tuple, list))
                and default
                and all(isinstance(v, int) for v in default)
            ):
                head = kwargs.get(head_param, head_now) if head_param else head_now
                axes = _rope_axes(default, head_default, head)
                if axes is not None:
                    kwargs[name] = type(default)(axes)
        _consistency(params, kwargs)
    if shrink == 0:
        kwargs.update(HINTS.get(cls.__name__, {}))
    return kwargs


def _tiny_value(name: str, default, level: int, head_now: int):
    if isinstance(default, bool) or default is None or isinstance(default, (str, float)):
        return OMIT
    if name in TINY and level == 0:
        value = TINY[name]
        if isinstance(default, (tuple, list)):
            return type(default)([value] * len(default))
        if isinstance(default, int) and isinstance(value, int):
            return value if value < default or name == "sample_size" else OMIT
        return value
    if isinstance(default, int):
        if COUNT.search(name):
            return 1 if default > 1 else OMIT
        if HEADS.search(name) and "dim" not in name:
            return 2 if default > 2 else OMIT
        if level > 0:
            return OMIT
        if HEAD_DIM.search(name):
            return head_now if default > head_now else OMIT
        if WIDE.search(name) and not NOT_WIDE.search(name) and default > 64:
            return WIDTH
        if name.endswith("groups") and default > 8:
            return 8
        return OMIT
    if (
        isinstance(default, (tuple, list))
        and default
        and all(isinstance(v, int) and not isinstance(v, bool) for v in default)
    ):
        if LAYER_INDICES.search(name) and not COUNT.search(name) and len(default) > 1:
            return type(default)(default[:1])
        if COUNT.search(name) or "num_layers" in name or name.endswith("layers_per_block"):
            return type(default)([1 if v > 0 else v for v in default])
        if HEADS.search(name):
            return type(default)([2] * len(default))
        if level > 0:
            return OMIT
        if (
            WIDE.search(name)
            and not NOT_WIDE.search(name)
            and not ROPE.search(name)
            and max(default) > 64
        ):
            return type(default)(_scaled_widths(tuple(default)))
    return OMIT


def _required_value(cls, name: str):
    if name in ("controlnets", "adapters"):
        return "@sub"
    if name == "prefix_length":
        return 4
    if name in ("min_value",):
        return 0.0
    if name in ("max_value",):
        return 10.0
    if name in ("block_out_channels",):
        return (32, 64)
    if name in ("layers_per_block",):
        return 1
    if name in ("in_channels", "out_channels"):
        return 3
    if name in ("latent_channels",):
        return 4
    if name == "spatial_compression_ratio":
        return 4
    if name == "sample_size":
        return 16
    if "mask" in name or name.startswith("allowed"):
        return None
    return WIDTH


def _consistency(params: dict, kwargs: dict) -> None:
    """Fixes what a ratio between two parameters requires."""
    for key in ("latents_mean", "latents_std"):
        default = params[key].default if key in params else None
        if isinstance(default, (list, tuple)):
            n = next(
                (kwargs[k] for k in ("latent_channels", "z_dim", "latent_dim") if k in kwargs),
                None,
            )
            if isinstance(n, int) and n < len(default):
                kwargs[key] = type(default)(default[:n])
    if "projection_class_embeddings_input_dim" in kwargs and "addition_time_embed_dim" in params:
        proj = params["projection_class_embeddings_input_dim"].default
        add = params["addition_time_embed_dim"].default
        if isinstance(proj, int) and isinstance(add, int) and add:
            new_add = kwargs.get("addition_time_embed_dim", add)
            kwargs["projection_class_embeddings_input_dim"] = proj // add * new_add


def _sub_class(name: str):
    import diffusers

    base = name.replace("Multi", "", 1)
    for candidate in (base, "T2I" + base):
        if hasattr(diffusers, candidate):
            return getattr(diffusers, candidate)
    raise ValueError(f"no single model for {name}")


def instances(name: str, errors: list):
    """Tiny models, one per level of :func:`tiny_kwargs` that builds (on the meta device
    first: past ``MAX_PARAMS`` it is never allocated), as ``(model, level, parameters)``."""
    import diffusers
    import torch

    cls = getattr(diffusers, name)
    seen = []
    for level in LEVELS:
        try:
            kwargs = tiny_kwargs(cls, level)
        except Exception as e:
            errors.append(_first_line(e)[:80])
            continue
        if kwargs in seen:
            continue
        seen.append(kwargs)
        try:
            with torch.device("meta"):
                meta = _create(cls, name, kwargs)
            count = sum(p.numel() for p in meta.parameters())
            del meta
        except Exception as e:
            errors.append(f"meta {level}: {_first_line(e)[:80]}")
            count = None
            if level == LEVELS[-1]:
                continue
        if count is not None and count > MAX_PARAMS:
            errors.append(f"too big ({count / 1e6:.0f}M) at level {level}")
            continue
        try:
            torch.manual_seed(0)
            model = _create(cls, name, kwargs).eval()
        except Exception as e:
            errors.append(f"level {level}: {_first_line(e)[:80]}")
            continue
        count = sum(p.numel() for p in model.parameters())
        if count > MAX_PARAMS:
            errors.append(f"too big ({count / 1e6:.0f}M) at level {level}")
            continue
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.is_floating_point() and parameter.numel() and not parameter.any():
                    # zero convolutions, adaLN-zero: the output would not depend on the rest
                    parameter.normal_(std=0.05)
        yield model, level, count


def _create(cls, name: str, kwargs: dict):
    if any(v == "@sub" for v in kwargs.values() if isinstance(v, str)):
        sub = _sub_class(name)
        model = None
        for level in (0, 3):
            try:
                sub_kwargs = tiny_kwargs(sub, level)
                torch_models = [sub(**sub_kwargs), sub(**sub_kwargs)]
                model = cls(**{k: torch_models for k, v in kwargs.items() if v == "@sub"})
                break
            except Exception:
                if level == 3:
                    raise
        return model
    return cls(**kwargs)


# inputs


class Derived:
    """A value computed in the wrapper from the main input (a list of sizes...)."""

    def __init__(self, fn, text: str):
        self.fn, self.text = fn, text

    def __repr__(self) -> str:
        return self.text


class Leaf:
    """A tensor input: its shape (ints or ``"B"``, ``"S"``, ``"T"``, ``"8S"``) and content."""

    def __init__(self, shape, kind: str = "randn", high: int = 8, dtype=None):
        self.shape, self.kind, self.high, self.dtype = tuple(shape), kind, high, dtype

    def sizes(self, dims: dict) -> tuple:
        return tuple(dims[d] if isinstance(d, str) else d for d in self.shape)

    def make(self, dims: dict, seed: int):
        import torch

        shape = self.sizes(dims)
        gen = torch.Generator().manual_seed(seed)
        if self.kind == "randn":
            return torch.randn(shape, generator=gen, dtype=self.dtype or torch.float32)
        if self.kind == "ones":
            return torch.ones(shape, dtype=self.dtype or torch.int64)
        if self.kind == "int":
            return torch.randint(0, self.high, shape, generator=gen, dtype=self.dtype)
        if self.kind == "time":
            values = torch.rand(shape, generator=gen) * 900 + 50
            return values.to(self.dtype or torch.float32)
        if self.kind == "unit":
            return torch.rand(shape, generator=gen) * 0.8 + 0.1
        if self.kind == "const":
            return torch.full(shape, float(self.high), dtype=self.dtype or torch.float32)
        raise ValueError(self.kind)

    def describe(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        kind = "" if self.kind == "randn" else f" {self.kind}"
        dtype = "" if self.dtype is None else f" {str(self.dtype).split('.')[-1]}"
        return f"({dims}){kind}{dtype}"


DIM_NAMES = {"B": "batch", "T": "text", "8S": "cond"}


def _dim_name(leaf: Leaf, axis: int, layout: str) -> str:
    d = leaf.shape[axis]
    if d == "S":
        if layout in ("image", "video", "videoT"):
            return "height" if leaf.shape[axis + 1 :].count("S") else "width"
        return "seq"
    return DIM_NAMES[d]


def _config_ints(cfg, keys) -> list[int]:
    values = []
    for key in keys:
        value = cfg.get(key)
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and value > 0
            and value not in values
        ):
            values.append(value)
    return values


MAIN = (
    "sample",
    "hidden_states",
    "x",
    "latents",
    "z",
    "mel",
    "inputs_embeds",
    "latent_image_embeds",
    "z_latent",
    "controls_latents",
    "source_hidden_states",
    "bb_ca",
)
CHANNEL_KEYS = (
    "in_channels",
    "in_visual_dim",
    "io_channels",
    "in_dim",
    "latent_channels",
    "latent_dim",
    "z_dim",
    "num_mels",
    "mel_bins",
    "audio_channels",
    "input_channels",
    "num_channels",
    "input_dims",
    "hidden_size",
    "embedding_dim",
    "source_dim",
    "redux_dim",
    "condition_hidden_dim",
    "channels",
    "dit_dim",
    "conv_in_channels",
    "in_channels_audio",
)
TEXT_KEYS = (
    "cross_attention_dim",
    "joint_attention_dim",
    "caption_channels",
    "text_embed_dim",
    "text_dim",
    "cap_feat_dim",
    "context_in_dim",
    "text_hidden_dim",
    "in_text_dim",
    "encoder_hid_dim",
    "cond_token_dim",
    "text_in_dim",
    "dit_text_dim",
    "condition_dim",
    "conditioning_dim",
    "text_encoder_dim",
    "encoder_hidden_size",
    "cross_attention_input_dim",
    "llm_features_dim",
    "text_emb_dim",
    "encoder_hidden_states_channels",
    "crossattn_proj_in_channels",
    "hidden_size",
    "text_encoder_1_dim",
    "langauge_model_dim",
    "txt_in_features",
    "embedding_dim",
)
POOLED_KEYS = (
    "pooled_projection_dim",
    "global_states_input_dim",
    "clip_text_pooled_in_channels",
    "cond_embed_dim",
    "embedding_dim",
    "global_cond_dim",
    "in_text_dim2",
    "text_embed_2_dim",
    "projection_class_embeddings_input_dim",
    "clip_img_dim",
    "hidden_size",
)
TIME = {
    "timestep",
    "timesteps",
    "t",
    "timestep_r",
    "r_timestep",
    "timestep_ratio",
    "decoder_noise_time",
    "sigma",
    "seconds",
    "bb_ca_time",
    "local_latents_time",
    "timestep_img",
    "timestep_text",
    "clean_timestep",
    "start_seconds",
    "end_seconds",
    "guidance",
}
TEXT = {
    "encoder_hidden_states",
    "text_hidden_states",
    "cap_feats",
    "prompt_embeds",
    "text_bth",
    "lyric_hidden_states",
    "encoder_hidden_states_1",
    "encoder_hidden_states_t5",
    "encoder_hidden_states_llama3",
    "encoder_hidden_states_2",
    "hidden_states_1",
    "clip_text",
    "audio_encoder_hidden_states",
}
POOLED = {
    "pooled_projections",
    "pooled_embeds",
    "pooled_text_emb",
    "global_hidden_states",
    "clip_text_pooled",
    "proj_embedding",
    "image_embeds",
    "image_embeddings",
    "clip_img",
}
TEXT_MASKS = {
    "encoder_attention_mask",
    "text_embedding_mask",
    "encoder_mask",
    "text_attention_mask",
    "encoder_hidden_states_mask",
    "encoder_attention_mask_t5",
    "text_embedding_mask_t5",
    "lyric_attention_mask",
    "target_attention_mask",
}
# optional arguments given when the signature has them
COMMON_OPTIONAL = (
    TEXT
    | POOLED
    | TEXT_MASKS
    | TIME
    | {"img_ids", "txt_ids", "hidden_states", "class_labels", "img_shapes", "conditioning_mask"}
    | {"control_hidden_states", "num_frames", "height", "width", "attention_mask"}
)
CONSTANTS = {
    "return_dict": False,
    "sample_posterior": False,
    "encoder_mode": False,
    "enable_temporal_attentions": True,
}


def _layout_hint(cls, main: str | None) -> list[str]:
    """The layouts the source of ``forward`` suggests, from how it unpacks the main input's
    shape (``batch, channels, height, width = sample.shape``...)."""
    if main is None:
        return []
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return []
    hints = []
    pattern = r"^\s*([\w\s,]+?)\s*=\s*" + main + r"\.shape\b(\[[^\]]*\])?"
    for names, index in re.findall(pattern, source, re.M):
        names = [n.strip() for n in names.split(",")]
        if index in ("[-2:]", "[-2]"):
            hints.append("image")
        elif "frame" in index or (index == "[2]" and "frame" in names[0]):
            hints.append("video")
        elif index in ("[1]", "[:2]") and any("seq" in n or "tokens" in n for n in names):
            hints.append("tokens")
        elif index == "[-1]":
            hints.append("signal")
        elif not index and len(names) == 5:
            hints.append("videoT" if "frame" in names[1] else "video")
        elif not index and len(names) == 4:
            hints.append("image")
        elif not index and len(names) == 3:
            hints.append("signal" if "len" in names[2] else "tokens")
    for ndim in re.findall(main + r"\.(?:ndim|dim\(\))\s*==\s*(\d)", source):
        hints.append({"4": "image", "5": "video", "3": "tokens"}.get(ndim, "image"))
    return list(dict.fromkeys(hints))


def _main_candidates(cls, main_arg, cfg) -> list[tuple[str, Leaf, int]]:
    """``(layout, leaf, S at the example)`` for the main input, the likeliest first."""
    name = cls.__name__
    channels = _config_ints(cfg, CHANNEL_KEYS)[:3] or [4]
    if re.search(r"Autoencoder|VAE|Vae|VQ|Adapter|Encoder", name) and 3 not in channels:
        channels.append(3)
    video = re.search(r"3D|Video|Motion|I2VGenXL|SpatioTemporal|Allegro|Mochi|Wan|Cosmos", name)
    signal = re.search(r"1D|Audio|Oobleck|Vocoder|Music|SAME|MMAudio", name)
    layouts = ["image", "tokens", "video", "signal", "videoT", "vector"]
    if video:
        layouts = ["video", "videoT", "image", "tokens", "signal", "vector"]
    elif signal:
        layouts = ["signal", "tokens", "image", "video", "videoT", "vector"]
    hints = _layout_hint(cls, main_arg)
    layouts = list(dict.fromkeys([*hints, *layouts]))
    result = []
    for layout in layouts:
        for c in channels:
            if layout == "image":
                for s in (16, 32, 64):
                    result.append((layout, Leaf(("B", c, "S", "S")), s))
            elif layout in ("video", "videoT"):
                for s in (16, 32):
                    for f in (5, 2, 1):
                        shape = (
                            ("B", c, f, "S", "S") if layout == "video" else ("B", f, c, "S", "S")
                        )
                        result.append((layout, Leaf(shape), s))
            elif layout == "tokens":
                for s in (16, 64):
                    result.append((layout, Leaf(("B", "S", c)), s))
            elif layout == "signal":
                for s in (64, 2048, 8192):
                    result.append((layout, Leaf(("B", c, "S")), s))
            else:
                result.append((layout, Leaf(("B", c)), 0))
    return result


def _arg_candidates(
    arg: str, required: bool, cfg, main: Leaf, layout: str, multi: bool = False
) -> list:
    """Candidate values for one argument of ``forward`` (``OMIT`` leaves it out)."""
    import torch

    omit = [] if required else [OMIT]
    if arg in CONSTANTS:
        return [CONSTANTS[arg]]
    if arg in TIME:
        if arg == "guidance" and not cfg.get("guidance_embeds"):
            return omit or [Leaf(("B",), "const", 4)]
        if (
            arg in ("timestep_ratio", "decoder_noise_time", "sigma")
            or arg.endswith("_time")
            or "seconds" in arg
        ):
            first = [Leaf(("B",), "unit")]
        else:
            first = [Leaf(("B",), "time"), Leaf(("B",), "time", dtype=torch.int64)]
        return [*first, Leaf(("B",), "unit"), *omit, Leaf((), "time")]
    if arg in TEXT:
        keys = TEXT_KEYS
        if arg.endswith("_t5"):
            keys = tuple(k for k in cfg if "t5" in k) + keys
        elif arg.endswith(("_2", "_1")):
            keys = tuple(k for k in cfg if k.endswith(("2", "_1_dim"))) + keys
        dims = _config_ints(cfg, keys)[:3] or [WIDTH]
        return [Leaf(("B", "T", d)) for d in dims] + omit
    if arg in POOLED:
        dims = _config_ints(cfg, POOLED_KEYS)[:2] or [WIDTH]
        return [Leaf(("B", d)) for d in dims] + [Leaf(("B", 1, d)) for d in dims[:1]] + omit
    if arg == "attention_mask":
        return [*omit, Leaf(("B", "T"), "ones")]
    if arg in TEXT_MASKS:
        return [
            Leaf(("B", "T"), "ones"),
            *omit,
            Leaf(("B", "T"), "ones", dtype=torch.bool),
        ]
    if arg in ("img_ids", "txt_ids"):
        n = len(cfg.get("axes_dims_rope") or (0, 0, 0))
        seq = "S" if arg == "img_ids" else "T"
        return [
            Leaf((seq, n), "int", 8, torch.float32),
            Leaf(("B", seq, n), "int", 8, torch.float32),
        ]
    if arg == "class_labels":
        high = cfg.get("num_embeds_ada_norm") or cfg.get("num_class_embeds")
        if high:
            return [Leaf(("B",), "int", min(int(high), 10)), *omit]
        return [*omit, Leaf(("B",), "int", 10)]
    if arg in ("controlnet_cond", "image_latents", "context_latents", "control_context"):
        cond = cfg.get("conditioning_channels") or main.shape[1]
        cands = [Leaf(main.shape)]
        if layout == "video":
            cands = [Leaf((*main.shape[:1], cond, *main.shape[2:])), Leaf(main.shape)]
        if layout == "image":
            cands = [
                Leaf(("B", cond, "8S", "8S")),
                Leaf(("B", cond, "S", "S")),
                Leaf(main.shape),
            ]
        if multi:
            # one per ControlNet of a Multi* model
            cands = [[c, Leaf(c.shape)] for c in cands]
        return cands + omit
    if arg == "control_hidden_states":
        c = cfg.get("vace_in_channels") or main.shape[1]
        return [Leaf((*main.shape[:1], c, *main.shape[2:])), *omit]
    if arg == "conditioning_mask":
        return [*omit, Leaf((*main.shape[:1], 1, *main.shape[2:]))]
    if arg == "img_shapes" and layout == "tokens":
        # a grid of one row: any number of tokens
        return [Derived(lambda flats, main: [(1, 1, main.shape[1])], "[(1, 1, S)]")]
    if arg in ("added_time_ids",):
        return [Leaf(("B", 3), "unit")]
    if arg in ("original_size", "target_size", "crop_coords"):
        return [Leaf(("B", 2), "const", 16)]
    if arg in ("micro_conds",):
        return [Leaf(("B", 5), "unit")]
    if arg in ("fps",):
        return [Leaf(("B",), "const", 8, torch.int64)]
    if arg in ("input_ids", "target_input_ids", "decoder_input_tokens", "prior_token_id"):
        high = min(int(cfg.get("vocab_size") or cfg.get("codebook_size") or 16), 16)
        return [Leaf(("B", "T"), "int", high), Leaf(("B", "S", "S"), "int", high)]
    if arg == "added_cond_kwargs":
        return [*omit, {"resolution": None, "aspect_ratio": None}]
    if arg in ("scale",):
        return [2, 1]
    if arg in ("conditioning_scale",):
        return [*omit, [1.0, 1.0]]
    if arg == "hidden_states" and not required:
        dims = _config_ints(cfg, ("text_encoder_dim", *TEXT_KEYS))[:2] or [WIDTH]
        return [Leaf(("B", "T", d)) for d in dims]
    if arg in ("num_frames", "height", "width") and layout == "tokens":
        # the tokens as a grid of one frame and one row
        size = {"num_frames": 1, "height": 1}.get(arg)
        if size is None:
            return [Derived(lambda flats, main: main.shape[1], "S"), *omit]
        return [size, *omit]
    if not required:
        return [OMIT]
    if "mask" in arg:
        return [
            Leaf(("B", "S"), "ones", dtype=torch.bool),
            Leaf(("B", "T"), "ones"),
            Leaf(("B", "S"), "ones"),
        ]
    # unknown: a few generic shapes
    return [Leaf(main.shape), Leaf(("B",), "unit"), Leaf(("B", "T", WIDTH))]


class Probe:
    """A layout that runs: the arguments (tensors as leaves), the output's path, the sizes."""

    def __init__(self, layout, structure, s0, path):
        self.layout, self.structure, self.s0, self.path = layout, structure, s0, path
        self.s1, self.t1, self.b1 = s0, EXAMPLE["T"], EXAMPLE["B"]
        self.names, self.leaves = [], []
        for arg, value in structure.items():
            for flat, leaf in _flatten(arg, value):
                self.names.append(flat)
                self.leaves.append(leaf)

    def dims(self, other: bool) -> dict:
        if other:
            return {"B": self.b1, "S": self.s1, "8S": 8 * self.s1, "T": self.t1}
        return {"B": EXAMPLE["B"], "S": self.s0, "8S": 8 * self.s0, "T": EXAMPLE["T"]}

    def inputs(self, other: bool) -> tuple:
        dims = self.dims(other)
        seed = 1000 if other else 0
        return tuple(leaf.make(dims, seed + i) for i, leaf in enumerate(self.leaves))

    def dynamic(self) -> dict:
        """``{name: {axis: dimension name}}`` of the axes that change between the sizes."""
        a, b = self.dims(False), self.dims(True)
        result = {}
        for name, leaf in zip(self.names, self.leaves):
            axes = {}
            for axis, d in enumerate(leaf.shape):
                if isinstance(d, str) and a[d] != b[d]:
                    axes[axis] = _dim_name(leaf, axis, self.layout)
            result[name] = axes
        return result

    def describe(self) -> str:
        parts = []
        for arg, value in self.structure.items():
            if isinstance(value, Leaf):
                parts.append(f"{arg}{value.describe()}")
            elif isinstance(value, (list, dict)) and _flatten(arg, value):
                parts.append(f"{arg}[...]")
            elif arg not in CONSTANTS:
                parts.append(f"{arg}={value!r}")
        dyn = sorted({n for axes in self.dynamic().values() for n in axes.values()})
        return f"{self.layout} S={self.s0}->{self.s1} " + " ".join(parts) + f" dyn={','.join(dyn)}"


def _flatten(arg: str, value) -> list:
    if isinstance(value, Leaf):
        return [(arg, value)]
    if isinstance(value, (list, tuple)):
        return [(f"{arg}_{i}", v) for i, v in enumerate(value) if isinstance(v, Leaf)]
    if isinstance(value, dict):
        return [(f"{arg}_{k}", v) for k, v in value.items() if isinstance(v, Leaf)]
    return []


def _assemble(structure: dict, flats: dict) -> dict:
    kwargs = {}
    main = next(iter(flats.values()), None)
    for arg, value in structure.items():
        if isinstance(value, Derived):
            kwargs[arg] = value.fn(flats, main)
        elif isinstance(value, Leaf):
            kwargs[arg] = flats[arg]
        elif isinstance(value, (list, tuple)):
            kwargs[arg] = type(value)(
                flats[f"{arg}_{i}"] if isinstance(v, Leaf) else v for i, v in enumerate(value)
            )
        elif isinstance(value, dict):
            kwargs[arg] = {
                k: flats[f"{arg}_{k}"] if isinstance(v, Leaf) else v for k, v in value.items()
            }
        else:
            kwargs[arg] = value
    return kwargs


def _output_path(out, prefix=()) -> tuple | None:
    """Where the first floating tensor of the output is."""
    import torch

    if isinstance(out, torch.Tensor):
        return prefix if out.numel() else None
    if isinstance(out, dict):
        items = list(out.items())
    elif isinstance(out, (list, tuple)):
        items = list(enumerate(out))
    else:
        return None
    for key, value in items:
        path = _output_path(value, (*prefix, key))
        if path is not None:
            return path
    return None


def make_wrapper(model, probe: Probe):
    """A module taking the flat tensors positionally and returning one tensor."""
    import torch

    names = probe.names
    source = f"def forward(self, {', '.join(names)}):\n    return self.run(({', '.join(names)},))\n"
    namespace: dict = {}
    exec(source, namespace)

    def run(self, values):
        out = self.model(**_assemble(self.structure, dict(zip(self.names, values))))
        for key in self.path:
            out = out[key]
        return out

    cls = type("Tiny", (torch.nn.Module,), {"forward": namespace["forward"], "run": run})
    wrapper = cls()
    wrapper.model = model
    wrapper.structure, wrapper.names, wrapper.path = probe.structure, names, probe.path
    return wrapper


def _eager(model, structure, probe_like: Probe, other: bool):
    import torch

    values = probe_like.inputs(other)
    flats = dict(zip(probe_like.names, values))
    with torch.no_grad():
        return model(**_assemble(structure, flats))


def _pick(out, path):
    for key in path:
        out = out[key]
    return out


def _config_of(model) -> dict:
    """The configuration, the first sub-model's one for the Multi* classes."""
    if hasattr(model, "config"):
        return dict(model.config)
    for module in model.modules():
        if module is not model and hasattr(module, "config"):
            return dict(module.config)
    return {}


def find_inputs(name: str, model, deadline: float) -> Probe:
    """The first candidate layout eager runs at the example size, then the other sizes."""
    import torch

    cfg = _config_of(model)
    signature = inspect.signature(model.forward).parameters
    args = [
        (k, p.default is p.empty)
        for k, p in signature.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in signature.values()) and not args:
        raise RuntimeError("forward(*args, **kwargs)")
    main_arg = next((k for k, req in args if k in MAIN and req), None)
    if main_arg is None:
        main_arg = next((k for k, _ in args if k in MAIN), None)
    mains = _main_candidates(type(model), main_arg, cfg)
    tries, last = 0, None
    # first the likeliest arguments with every main input, then the other combinations
    for first_pass in (True, False):
        for layout, main, s0 in mains:
            lists = []
            for arg, required in args:
                if arg == main_arg:
                    continue
                if not required and arg not in COMMON_OPTIONAL and arg not in CONSTANTS:
                    continue
                multi = type(model).__name__.startswith(("Multi", "SD3Multi", "FluxMulti"))
                multi = multi or "MultiControlNet" in type(model).__name__
                cands = _arg_candidates(arg, required, cfg, main, layout, multi)
                lists.append((arg, cands))
            combos = sorted(itertools.product(*(range(len(c)) for _, c in lists)), key=sum)
            combos = combos[:1] if first_pass else combos[1:40]
            for combo in combos:
                if tries >= MAX_TRIES or time.perf_counter() > deadline:
                    raise RuntimeError(f"no inputs after {tries} tries: {last}")
                tries += 1
                structure = {main_arg: main} if main_arg else {}
                for (arg, cands), index in zip(lists, combo):
                    if cands[index] is not OMIT:
                        structure[arg] = cands[index]
                probe = Probe(layout, structure, s0, ())
                try:
                    out = _eager(model, structure, probe, False)
                    path = _output_path(out)
                    if path is None:
                        raise RuntimeError("no tensor in the output")
                    if not _pick(out, path).is_floating_point():
                        raise RuntimeError("the output is not a floating tensor")
                except Exception as e:
                    last = _first_line(e)
                    if os.environ.get("SWEEP_DEBUG"):
                        print(f"  {probe.describe()}\n      {last}", file=sys.stderr)
                    continue
                probe.path = path
                again = _pick(_eager(model, structure, probe, False), path)
                if not torch.equal(_pick(out, path), again):
                    raise RuntimeError("random: two eager runs differ")
                _other_sizes(model, probe)
                return probe
    raise RuntimeError(f"no inputs after {tries} tries: {last}")


def _other_sizes(model, probe: Probe) -> None:
    """The largest change of sizes eager takes: batch, S and T, then fewer of them."""
    has_s = any("S" in leaf.shape or "8S" in leaf.shape for leaf in probe.leaves)
    has_t = any("T" in leaf.shape for leaf in probe.leaves)
    s1 = [2 * probe.s0] if has_s else []
    t1 = [OTHER["T"]] if has_t else []
    options = [
        (b, s, t)
        for b in (OTHER["B"], EXAMPLE["B"])
        for s in (*s1, probe.s0)
        for t in (*t1, EXAMPLE["T"])
    ]
    for b, s, t in options:
        probe.b1, probe.s1, probe.t1 = b, s, t
        try:
            out = _pick(_eager(model, probe.structure, probe, True), probe.path)
            if out.is_floating_point():
                return
        except Exception:
            continue
    probe.b1, probe.s1, probe.t1 = EXAMPLE["B"], probe.s0, EXAMPLE["T"]


def build(name: str, probe_seconds: float = PROBE_SECONDS):
    """The tiny model wrapped to return one tensor, its probe, and a description: the
    first level of :func:`tiny_kwargs` that builds and runs with inputs found."""
    errors: list = []
    deadline = time.perf_counter() + probe_seconds
    for model, level, count in instances(name, errors):
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            errors.append("no time left")
            break
        try:
            probe = find_inputs(name, model, time.perf_counter() + max(remaining / 2, 5))
        except Exception as e:
            errors.append(f"inputs {level}: {_first_line(e)}")
            continue
        wrapper = make_wrapper(model, probe).eval()
        return wrapper, probe, f"level {level}, {count / 1e6:.2f}M, {probe.describe()}"
    raise RuntimeError("; ".join(dict.fromkeys(errors)))


def _run_path(path: str, model, probe: Probe) -> str:
    import torch

    example, other = probe.inputs(False), probe.inputs(True)
    with torch.no_grad():
        expected = model(*other)
    dims = probe.dynamic()
    if path == "export":
        from torch.export import Dim

        dynamic = {n: {a: Dim.DYNAMIC for a in axes} for n, axes in dims.items()}
        program = torch.export.export(model, example, dynamic_shapes=dynamic)
        with torch.no_grad():
            got = program.module()(*other)
    elif path == "yobx":
        from yobx.torch.tracing import CustomTracer

        tracer = CustomTracer()
        graph = tracer.trace(
            model, concrete_args=dict(zip(probe.names, example)), dynamic_shapes=dims
        )
        with torch.no_grad():
            got = torch.fx.GraphModule(tracer.traced_model, graph)(*other)
    else:
        import onnxruntime

        if path == "yobx-onnx":
            from yobx.torch.onnx import to_onnx

            proto = to_onnx(model, example, dynamic_shapes=dims).model_proto
        else:
            from torch.export import Dim

            dynamic = {n: {a: Dim.DYNAMIC for a in axes} for n, axes in dims.items()}
            program = torch.onnx.export(
                model, example, dynamic_shapes=dynamic, dynamo=True, verbose=False
            )
            proto = program.model_proto
        session = onnxruntime.InferenceSession(
            proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        names = [i.name for i in session.get_inputs()]
        if set(names) <= set(probe.names):
            by_name = dict(zip(probe.names, other))
            feeds = {n: by_name[n].numpy() for n in names}
        else:
            feeds = {n: t.numpy() for n, t in zip(names, other)}
        got = session.run(None, feeds)[0]
    return compared(expected, got, model, lambda m, cast: m(*[cast(t) for t in other]))


def _child(name: str, paths: list[str], probe_seconds: float, queue) -> None:
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.CRITICAL)
    import resource

    import torch

    torch.set_num_threads(int(os.environ.get("SWEEP_THREADS", "1")))
    # a capture asking for tens of gigabytes fails instead of starving the machine
    limit = int(float(os.environ.get("SWEEP_MEMORY_GB", "10")) * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        model, probe, info = build(name, probe_seconds)
    except Exception as e:
        text = f"{type(e).__name__}: {e}".strip().splitlines()[0][:600]
        queue.put(("eager", f"fail: {text}"))
        if os.environ.get("SWEEP_TRACEBACK"):
            traceback.print_exc()
        return
    queue.put(("eager", "ok", info))
    for path in paths:
        start = time.perf_counter()
        try:
            status = _run_path(path, model, probe)
        except Exception as e:
            status = f"fail: {_error_line(e)}"
            if os.environ.get("SWEEP_TRACEBACK"):
                traceback.print_exc()
        queue.put((path, status, time.perf_counter() - start))


def _error_line(e: BaseException) -> str:
    """The first line of the error, and of its cause when it wraps one (torch.onnx)."""
    line = _first_line(e)
    if e.__cause__ is not None and type(e).__name__.startswith("Torch"):
        line = f"{type(e).__name__} <- {_first_line(e.__cause__)}"
    return line


def sweep_one(name: str, paths: list[str], timeout: float) -> dict:
    """The status of each path for one class (a forked process)."""
    probe_seconds = min(PROBE_SECONDS, timeout / 3)
    return run_forked(_child, (name, paths, probe_seconds), paths, timeout)


def _preload(paths: list[str]) -> None:
    """Imports what every child needs once, before forking."""
    import diffusers  # noqa: F401
    import torch

    if "yobx" in paths or "yobx-onnx" in paths:
        import yobx.torch.tracing
    if "yobx-onnx" in paths:
        import yobx.torch.onnx  # noqa: F401
    if "yobx-onnx" in paths or "torch-onnx" in paths:
        import onnxruntime  # noqa: F401
        import torch.onnx  # noqa: F401


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="class names (default: every one)")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--only", default=",".join(PATHS), help="comma-separated paths")
    parser.add_argument("--probe", action="store_true", help="build and find inputs only")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    paths = [] if args.probe else [p for p in args.only.split(",") if p]
    _preload(paths)
    todo = [n for n in model_classes() if not args.names or n in args.names]
    if args.limit:
        todo = todo[: args.limit]
    counts: dict = {p: {} for p in ["eager", *paths]}
    table = []
    start = time.perf_counter()
    print(f"{'class':42s} " + " ".join(f"{p:10s}" for p in ["eager", *paths]), flush=True)
    for name in todo:
        results = sweep_one(name, paths, args.timeout)
        short = {p: results[p][0].split(":")[0] for p in ["eager", *paths]}
        if results["eager"][0] != "ok" and short["eager"] == "fail":
            short["eager"] = "-"
        for p, s in short.items():
            counts[p][s] = counts[p].get(s, 0) + 1
        table.append((name, results))
        print(f"{name:42s} " + " ".join(f"{short[p]:10s}" for p in ["eager", *paths]), flush=True)
        if results["eager"][0] == "ok":
            if args.probe:
                print(f"    {results['eager'][1]}", flush=True)
        else:
            print(f"    eager: {results['eager'][0]}", flush=True)
        for p in paths:
            if results[p][0].startswith(("fail", "WRONG", "UNSTABLE")):
                print(f"    {p}: {results[p][0]}", flush=True)
        times = [f"{p} {results[p][1]:.0f}" for p in paths if len(results[p]) > 1]
        if times:
            print(f"    seconds: {', '.join(times)}", flush=True)
    print(f"\n{len(todo)} classes in {time.perf_counter() - start:.0f} s")
    for p in ["eager", *paths]:
        print(f"  {p:12s} " + ", ".join(f"{k} {v}" for k, v in sorted(counts[p].items())))
    for theirs, ours in (("export", "yobx"), ("torch-onnx", "yobx-onnx")):
        if theirs in paths and ours in paths:
            lost = [n for n, r in table if r[theirs][0] == "ok" and r[ours][0] != "ok"]
            ahead = [n for n, r in table if r[ours][0] == "ok" and r[theirs][0] != "ok"]
            print(f"{theirs} ok, {ours} not ({len(lost)}): {', '.join(lost)}")
            print(f"{ours} ok, {theirs} not ({len(ahead)}): {', '.join(ahead)}")


if __name__ == "__main__":
    main(sys.argv[1:])
