"""Models to export: built-in demos, user factories and tiny Hugging Face models.

:func:`load_model` resolves a model name as the ``yobx`` command accepts it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from yobx.models.demos import tiny_cnn, tiny_gru, tiny_lstm, transformer_encoder
from yobx.models.loaded import LoadedModel
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


def _normalize(result: Any, origin: str) -> LoadedModel:
    import torch

    if not isinstance(result, (tuple, list)) or not 2 <= len(result) <= 5:
        raise ModelLoadError(
            f"{origin} must return (model, args[, kwargs[, dynamic_shapes[, "
            f"validation_inputs]]]), got {type(result).__name__}"
        )
    model, args, *rest = result
    kwargs = rest[0] if rest else {}
    dynamic_shapes = rest[1] if len(rest) > 1 else None
    validation_inputs = list(rest[2] or []) if len(rest) > 2 else []
    if isinstance(result, LoadedModel):
        validation_inputs += result.validation_inputs
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(
            f"{origin} returned a {type(model).__name__} as model, expected a torch.nn.Module"
        )
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)) or not isinstance(kwargs or {}, dict):
        raise ModelLoadError(f"{origin} must return args as a tuple and kwargs as a dict")
    return LoadedModel((model, tuple(args), dict(kwargs or {}), dynamic_shapes), validation_inputs)


def _import_module(module_name: str) -> Any:
    """Imports ``package.module`` or ``path/to/file.py``; modules in the current
    directory are found (as ``python -m`` finds them, which the ``yobx`` script does
    not do by itself)."""
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise ModelLoadError(f"cannot import module {module_name!r}: no such file")
        spec = importlib.util.spec_from_file_location(
            os.path.splitext(os.path.basename(path))[0], path
        )
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise ModelLoadError(
                f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
            ) from exc
        return module
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelLoadError(f"cannot import module {module_name!r}: {exc}") from exc
    except Exception as exc:
        # the user's module fails while imported (a SyntaxError...): bad input, as
        # for path/to/file.py above, not a traceback
        raise ModelLoadError(
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        if added:
            sys.path.remove(cwd)


def _load_hf(
    name: str, config: str | None, dtype: Any, task: str | None = None
) -> tuple[Any, tuple, dict, Any]:
    architecture = name[3:]
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ModelLoadError(f"{name}: transformers is not installed") from exc
    from yobx.models.huggingface import TASKS, hf_generation_model, hf_model, hf_model_from_config

    if task not in (None, *TASKS):
        raise ModelLoadError(f"unknown task {task!r}: expected one of {', '.join(TASKS)}")
    try:
        if task == "text-generation":
            model = hf_generation_model(architecture, config_path=config, dtype=dtype)
            return _normalize(model, name)
        if config is None:
            return _normalize(hf_model(architecture), name)
        return _normalize(hf_model_from_config(architecture, config, dtype=dtype), name)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"{name}: {type(exc).__name__}: {exc}") from exc


def load_model(
    name: str, config: str | None = None, dtype: Any = None, task: str | None = None
) -> tuple[Any, tuple, dict, Any]:
    """Returns ``(model, args, kwargs, dynamic_shapes)`` for a model name.

    :param name: a built-in demo (``tiny-llm``, ``tiny-cnn``, ``tiny-lstm``,
        ``tiny-gru``, ``transformer-encoder``), ``module:factory`` (a module importable
        from the current directory, or ``path/to/file.py:factory``) where the factory
        returns ``(model, args[, kwargs[, dynamic_shapes]])``, or ``hf:<Architecture>``
        (``hf:LlamaForCausalLM``) for a Hugging Face model built from a tiny
        configuration with random weights. A factory may return a fifth element: input
        sets the validation compares on besides the sizes it makes
        (:attr:`LoadedModel.validation_inputs`)
    :param config: with ``hf:<Architecture>``, a ``config.json`` (or its directory):
        the model is built from it with its parameters on the meta device, to be
        exported and given its weights afterwards
    :param dtype: with ``config``, the dtype of the parameters (the checkpoint's)
    :param task: with ``hf:<Architecture>``, ``feature-extraction`` (the default: the
        model's inputs, no cache) or ``text-generation`` (one step with its cache, see
        :func:`yobx.models.huggingface.hf_generation_model`)
    :raises ModelLoadError: unknown name, missing module or factory, failing factory
    """
    if config is not None and not name.startswith("hf:"):
        raise ModelLoadError(
            f"a configuration applies to hf:<Architecture> models, not to {name!r}"
        )
    if task is not None and not name.startswith("hf:"):
        raise ModelLoadError(f"a task applies to hf:<Architecture> models, not to {name!r}")
    if name in DEMOS:
        return _normalize(DEMOS[name](), f"demo {name!r}")
    if name.startswith("hf:"):
        return _load_hf(name, config, dtype, task)
    if ":" in name:
        module_name, _, attribute = name.rpartition(":")
        module = _import_module(module_name)
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
        "'module:factory', 'path/to/file.py:factory' or 'hf:<Architecture>'"
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
