"""``hf:<directory>`` and ``hf:<model id>``: real Hugging Face checkpoints, offline.

A directory written by ``save_pretrained`` (``config.json`` and safetensors, sharded
or not) names its architecture in ``config.json`` (``architectures``); a model id
(``org/name``) is looked up in the local Hugging Face cache only (nothing is
downloaded, as with ``HF_HUB_OFFLINE=1``). Either gives the architecture and the
directory, from which ``yobx export`` builds the model on the meta device and streams
the weights (the big-model path of ``--config`` and ``--weights``).
"""

from __future__ import annotations

import json
import os


class CheckpointNotFoundError(ValueError):
    """``hf:<name>`` is neither an architecture, nor a checkpoint directory, nor a model
    id in the local cache."""


def resolve_checkpoint(target: str) -> tuple[str, str | None]:
    """``(architecture, directory)`` for what follows ``hf:``: the directory is None
    for an architecture name (``LlamaForCausalLM``: a tiny random model).

    :raises CheckpointNotFoundError: a directory without a usable ``config.json``, or a
        model id missing from the local cache (the message says how to get it)
    """
    if os.path.isdir(target):
        return _architecture_of(target), target
    if "/" not in target and not target.startswith("."):
        return target, None  # an architecture of transformers
    directory = _cached_snapshot(target)
    return _architecture_of(directory), directory


def _architecture_of(directory: str) -> str:
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise CheckpointNotFoundError(
            f"{directory!r} has no config.json: hf:<directory> takes a directory written "
            "by save_pretrained (config.json and safetensors weights)"
        )
    with open(path, encoding="utf-8") as stream:
        config = json.load(stream)
    architectures = config.get("architectures") or []
    if not architectures:
        raise CheckpointNotFoundError(
            f"{path} names no architecture (its 'architectures' list is empty): save it "
            "with save_pretrained from a model class, or use hf:<Architecture> --config "
            f"{path} --weights {directory}"
        )
    return str(architectures[0])


def _cached_snapshot(model_id: str) -> str:
    """The directory of ``model_id`` in the local Hugging Face cache."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError as exc:  # pragma: no cover - transformers brings it
        raise CheckpointNotFoundError(
            f"hf:{model_id} needs huggingface_hub to read the local cache"
        ) from exc
    try:
        return snapshot_download(model_id, local_files_only=True)
    except Exception as exc:
        raise CheckpointNotFoundError(
            f"hf:{model_id} is not a directory and not in the local Hugging Face cache "
            f"({HF_HUB_CACHE}); yobx downloads nothing: fetch it where the network is "
            f"(huggingface-cli download {model_id}) or pass the directory that "
            f"save_pretrained wrote ({type(exc).__name__})"
        ) from exc
