"""Models to export: built-in demos, user factories and tiny Hugging Face models.

:func:`load_model` resolves a model name as the ``yobx`` command accepts it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from yobx.models.demos import tiny_cnn, tiny_gru, tiny_lstm, transformer_encoder
from yobx.models.tiny_llm import TinyLLM, TinyLLMConfig, tiny_llm

#: Built-in demo models: name -> factory returning (model, args, kwargs, dynamic_shapes).
DEMOS: dict[str, Callable[[], tuple]] = {
    "tiny-llm": tiny_llm,
    "tiny-cnn": tiny_cnn,
    "tiny-lstm": tiny_lstm,
    "tiny-gru": tiny_gru,
    "transformer-encoder": transformer_encoder,
}


class ModelLoadError(ValueError):
    """Raised when a model name cannot be resolved or its factory fails."""


def _normalize(result: Any, origin: str) -> tuple[Any, tuple, dict, Any]:
    import torch

    if not isinstance(result, (tuple, list)) or not 2 <= len(result) <= 4:
        raise ModelLoadError(
            f"{origin} must return (model, args[, kwargs[, dynamic_shapes]]), "
            f"got {type(result).__name__}"
        )
    model, args, *rest = result
    kwargs = rest[0] if rest else {}
    dynamic_shapes = rest[1] if len(rest) > 1 else None
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(
            f"{origin} returned a {type(model).__name__} as model, expected a torch.nn.Module"
        )
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)) or not isinstance(kwargs or {}, dict):
        raise ModelLoadError(f"{origin} must return args as a tuple and kwargs as a dict")
    return model, tuple(args), dict(kwargs or {}), dynamic_shapes


def load_model(name: str) -> tuple[Any, tuple, dict, Any]:
    """Returns ``(model, args, kwargs, dynamic_shapes)`` for a model name.

    :param name: a built-in demo (``tiny-llm``, ``tiny-cnn``, ``tiny-lstm``,
        ``tiny-gru``, ``transformer-encoder``), ``package.module:factory`` where the
        factory returns ``(model, args[, kwargs[, dynamic_shapes]])``, or
        ``hf:<Architecture>`` (``hf:LlamaForCausalLM``) for a Hugging Face model built
        from a tiny configuration with random weights
    :raises ModelLoadError: unknown name, missing module or factory, failing factory
    """
    if name in DEMOS:
        return _normalize(DEMOS[name](), f"demo {name!r}")
    if name.startswith("hf:"):
        architecture = name[3:]
        try:
            import transformers  # noqa: F401
        except ImportError as exc:
            raise ModelLoadError(f"{name}: transformers is not installed") from exc
        from yobx.models.huggingface import hf_model

        try:
            return _normalize(hf_model(architecture), name)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"{name}: {type(exc).__name__}: {exc}") from exc
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ModelLoadError(f"cannot import module {module_name!r}: {exc}") from exc
        factory = getattr(module, attribute, None)
        if factory is None or not callable(factory):
            raise ModelLoadError(f"module {module_name!r} has no callable {attribute!r}")
        try:
            result = factory()
        except Exception as exc:
            raise ModelLoadError(f"factory {name!r} failed: {type(exc).__name__}: {exc}") from exc
        return _normalize(result, f"factory {name!r}")
    known = ", ".join(sorted(DEMOS))
    raise ModelLoadError(
        f"unknown model {name!r}: expected one of {known}, "
        "'package.module:factory' or 'hf:<Architecture>'"
    )


__all__ = [
    "DEMOS",
    "ModelLoadError",
    "TinyLLM",
    "TinyLLMConfig",
    "load_model",
    "tiny_cnn",
    "tiny_gru",
    "tiny_llm",
    "tiny_lstm",
    "transformer_encoder",
]
