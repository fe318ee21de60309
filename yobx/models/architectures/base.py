"""The description of one architecture case and the helpers its builders share."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

#: ``sizes -> kwargs``: builds the inputs of a case for given sizes of its dynamic dims
InputMaker = Callable[[dict[str, int]], dict[str, Any]]


@dataclasses.dataclass
class ArchitectureCase:
    """A small model with example inputs and inputs at other sizes.

    :param name: short name of the case (``vit``, ``llama_decode``)
    :param family: ``vision``, ``audio``, ``text``, ``clip``, ``encoder_decoder``,
        ``moe``, ``decoder`` or ``diffusion``
    :param model: the model, in eval mode, with random seeded weights
    :param args: positional example inputs (empty: every input is passed by keyword)
    :param kwargs: example inputs by parameter name
    :param dynamic_shapes: torch.export's format keyed by parameter name, with string
        dimension names (``{"pixel_values": {0: "batch", 2: "height"}}``)
    :param other_inputs: ``(args, kwargs)`` at other sizes of the dynamic dimensions,
        one per entry of :attr:`other_sizes`; eager runs on each
    :param sizes: the example's size of each dimension name
    :param other_sizes: the sizes of each entry of :attr:`other_inputs`
    :param make_inputs: ``sizes -> kwargs``, to build inputs at any other sizes
    :param stress_sizes: sizes on which eager runs but where torch.export's program
        refuses the inputs, because it adopted a fact of the example that does not hold
        there (a parity, a square image...); a capture may refuse them through its
        runtime checks or compute them right, never compute them wrong
    """

    name: str
    family: str
    model: torch.nn.Module
    args: tuple
    kwargs: dict[str, Any]
    dynamic_shapes: dict[str, Any]
    other_inputs: list[tuple[tuple, dict[str, Any]]]
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)
    other_sizes: list[dict[str, int]] = dataclasses.field(default_factory=list)
    make_inputs: InputMaker | None = None
    stress_sizes: list[dict[str, int]] = dataclasses.field(default_factory=list)

    def inputs_at(self, sizes: dict[str, int]) -> dict[str, Any]:
        """Inputs by name with the example's sizes updated by ``sizes``."""
        if self.make_inputs is None:
            raise ValueError(f"case {self.name!r} cannot build inputs at other sizes")
        return self.make_inputs({**self.sizes, **sizes})


def make_case(
    name: str,
    family: str,
    model: torch.nn.Module,
    make_inputs: InputMaker,
    dynamic_shapes: dict[str, Any],
    sizes: dict[str, int],
    other_sizes: list[dict[str, int]],
    stress_sizes: list[dict[str, int]] | None = None,
) -> ArchitectureCase:
    """Builds the example and the other inputs of a case from one input maker;
    ``other_sizes`` and ``stress_sizes`` update the example's ``sizes``."""
    others = [((), make_inputs({**sizes, **o})) for o in other_sizes]
    return ArchitectureCase(
        name=name,
        family=family,
        model=model,
        args=(),
        kwargs=make_inputs(dict(sizes)),
        dynamic_shapes=dynamic_shapes,
        other_inputs=others,
        sizes=dict(sizes),
        other_sizes=[{**sizes, **o} for o in other_sizes],
        make_inputs=make_inputs,
        stress_sizes=[{**sizes, **o} for o in stress_sizes or []],
    )


def seeded_model(build: Callable[[], torch.nn.Module], seed: int = 0) -> torch.nn.Module:
    """Builds a model with seeded random weights, in eval mode, without touching the
    caller's random state."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build().eval()


def generator_for(sizes: dict[str, int]) -> torch.Generator:
    """A generator seeded from the sizes: the same sizes always give the same inputs."""
    seed = 1
    for name in sorted(sizes):
        seed = (seed * 1_000_003 + sizes[name] * 31 + len(name)) % (2**31)
    return torch.Generator().manual_seed(seed)


def hf_config(config_name: str, **values: Any) -> Any:
    """A transformers configuration with eager attention, no dropout and no cache."""
    import transformers

    config = getattr(transformers, config_name)(**values)
    config._attn_implementation = "eager"
    if "use_cache" not in values and hasattr(config, "use_cache"):
        config.use_cache = False
    for sub in ("text_config", "vision_config"):
        if hasattr(config, sub):
            getattr(config, sub)._attn_implementation = "eager"
    return config


def hf_model(class_name: str, config: Any) -> torch.nn.Module:
    """Instantiates ``transformers.<class_name>`` from ``config`` with seeded weights."""
    import transformers

    return seeded_model(lambda: getattr(transformers, class_name)(config))


def token_inputs(vocab_size: int, with_mask: bool = True) -> InputMaker:
    """Inputs ``input_ids [batch, seq]`` and an ``attention_mask`` hiding the last
    token of the last sequence (padding), so that masking is exercised."""

    def make(sizes: dict[str, int]) -> dict[str, Any]:
        g = generator_for(sizes)
        shape = (sizes["batch"], sizes["seq"])
        kwargs: dict[str, Any] = {"input_ids": torch.randint(1, vocab_size, shape, generator=g)}
        if with_mask:
            mask = torch.ones(shape, dtype=torch.int64)
            mask[-1, -1] = 0
            kwargs["attention_mask"] = mask
        return kwargs

    return make


def count_parameters(model: torch.nn.Module) -> int:
    """Number of parameters of ``model``."""
    return sum(p.numel() for p in model.parameters())


def named_axes(kwargs: dict[str, Any], dynamic_shapes: dict[str, Any]) -> dict[str, dict]:
    """The named axes of every tensor of ``kwargs``, read through ``dynamic_shapes``.

    :return: ``{path: {axis: name}}`` where ``path`` is written as torch.export writes
        its guards (``['past_key_values']['key_cache'][0]``)
    :raises ValueError: a spec that does not fit the inputs
    """
    import torch.utils._pytree as pytree

    from yobx.torch.tracing import register_cache_flattening

    register_cache_flattening(list(kwargs.values()))
    axes: dict[str, dict] = {}

    def walk(value: Any, spec: Any, path: str) -> None:
        if spec is None:
            return
        if isinstance(value, torch.Tensor):
            items = spec.items() if isinstance(spec, dict) else enumerate(spec)
            axes[path] = {axis: name for axis, name in items if isinstance(name, str)}
            return
        node = pytree.SUPPORTED_NODES.get(type(value))
        if node is None or node.flatten_with_keys_fn is None:
            raise ValueError(f"dynamic shapes {spec!r} given for {path}, a {type(value)}")
        entries, _ = node.flatten_with_keys_fn(value)
        if isinstance(spec, dict):
            for key, child in entries:
                walk(child, spec.get(getattr(key, "key", None)), path + str(key))
        else:
            for (key, child), sub in zip(entries, spec, strict=True):
                walk(child, sub, path + str(key))

    for name, spec in dynamic_shapes.items():
        walk(kwargs[name], spec, f"[{name!r}]")
    return axes


def measured_sizes(kwargs: dict[str, Any], dynamic_shapes: dict[str, Any]) -> dict[str, int]:
    """The size of each named dimension in ``kwargs``, read through ``dynamic_shapes``.

    :raises ValueError: a name with two different sizes, or a spec that does not fit
    """
    import torch.utils._pytree as pytree

    sizes: dict[str, int] = {}
    axes = named_axes(kwargs, dynamic_shapes)  # registers DynamicCache with pytree first
    leaves = dict(
        (pytree.keystr(path), leaf) for path, leaf in pytree.tree_flatten_with_path(kwargs)[0]
    )
    for path, names in axes.items():
        for axis, name in names.items():
            size = int(leaves[path].shape[axis])
            if sizes.setdefault(name, size) != size:
                raise ValueError(f"{name!r} is {sizes[name]} and {size} ({path})")
    return sizes
