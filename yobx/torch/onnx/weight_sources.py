"""Where weights come from: a state dict, safetensors files, a Hugging Face index.

:func:`open_weight_source` describes every tensor of a source (name, shape, dtype)
without reading its data, and gives a loader that reads one tensor when it is called:
saving a model streams the weights tensor by tensor, so memory stays near the size of
the largest one.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

#: safetensors' dtype names -> torch dtypes
_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}

#: the file name transformers gives the index of a sharded checkpoint
HF_INDEX_NAME = "model.safetensors.index.json"
#: the file name transformers gives a checkpoint in one file
HF_SINGLE_NAME = "model.safetensors"


class WeightSourceError(ValueError):
    """Raised when a weight source cannot be read (missing file, bad index...)."""


@dataclasses.dataclass(frozen=True)
class WeightEntry:
    """One tensor of a weight source, not read yet.

    :param name: its name in the source (a state-dict name)
    :param shape: its shape
    :param dtype: its dtype
    :param origin: where it is (a file name, or ``state dict``)
    :param load: reads it (a CPU tensor)
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    origin: str
    load: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        """Size of the tensor in bytes."""
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize


def _safe_open(path: str):
    try:
        from safetensors import safe_open
    except ImportError as exc:  # pragma: no cover - a default dependency
        raise WeightSourceError(
            f"reading {path!r} needs safetensors: pip install safetensors"
        ) from exc
    try:
        return safe_open(path, framework="pt")
    except Exception as exc:
        raise WeightSourceError(
            f"cannot read safetensors file {path!r}: {type(exc).__name__}: {exc}"
        ) from exc


def _tensor_loader(path: str, name: str) -> Callable[[], torch.Tensor]:
    def load() -> torch.Tensor:
        # One file handle per read: the header is small, and nothing stays mapped
        # between two tensors.
        with _safe_open(path) as handle:
            return handle.get_tensor(name)

    return load


def _safetensors_entries(path: str, names: set[str] | None = None) -> dict[str, WeightEntry]:
    """The tensors of one safetensors file (only ``names`` when given)."""
    if not os.path.isfile(path):
        raise WeightSourceError(f"safetensors file {path!r} does not exist")
    entries = {}
    with _safe_open(path) as handle:
        for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
            if names is not None and name not in names:
                continue
            piece = handle.get_slice(name)
            dtype_name = piece.get_dtype()
            if dtype_name not in _SAFETENSORS_DTYPES:
                raise WeightSourceError(
                    f"tensor {name!r} of {path!r} has dtype {dtype_name}, which yobx "
                    f"cannot map to a torch dtype"
                )
            entries[name] = WeightEntry(
                name=name,
                shape=tuple(piece.get_shape()),
                dtype=_SAFETENSORS_DTYPES[dtype_name],
                origin=path,
                load=_tensor_loader(path, name),
            )
    return entries


def _index_entries(index_path: str) -> dict[str, WeightEntry]:
    """The tensors listed by a Hugging Face ``model.safetensors.index.json``."""
    try:
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise WeightSourceError(f"cannot read index {index_path!r}: {exc}") from exc
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise WeightSourceError(
            f"{index_path!r} has no 'weight_map': expected a Hugging Face "
            f"{HF_INDEX_NAME} mapping tensor names to shard files"
        )
    directory = os.path.dirname(os.path.abspath(index_path))
    by_shard: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        by_shard.setdefault(os.path.join(directory, shard), set()).add(name)
    entries: dict[str, WeightEntry] = {}
    for shard, names in by_shard.items():
        found = _safetensors_entries(shard, names)
        absent = sorted(names - set(found))
        if absent:
            raise WeightSourceError(
                f"index {index_path!r} places {_listing(absent)} in {shard!r}, "
                f"which does not contain them"
            )
        entries.update(found)
    return entries


def _state_dict_entries(state: Mapping[str, Any]) -> dict[str, WeightEntry]:
    entries = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise WeightSourceError(
                f"state dict entry {name!r} is a {type(tensor).__name__}, expected a tensor"
            )
        if tensor.device.type == "meta":
            raise WeightSourceError(
                f"state dict entry {name!r} is on the meta device and has no data"
            )
        tensor = tensor.detach()
        entries[name] = WeightEntry(
            name=name,
            shape=tuple(tensor.shape),
            dtype=tensor.dtype,
            origin="state dict",
            load=lambda tensor=tensor: tensor,
        )
    return entries


def _file_entries(path: str) -> dict[str, WeightEntry]:
    if os.path.isdir(path):
        for candidate in (HF_INDEX_NAME, HF_SINGLE_NAME):
            full = os.path.join(path, candidate)
            if os.path.isfile(full):
                return _file_entries(full)
        raise WeightSourceError(
            f"directory {path!r} has neither {HF_INDEX_NAME} nor {HF_SINGLE_NAME}"
        )
    if path.endswith(".json"):
        return _index_entries(path)
    if path.endswith(".safetensors"):
        return _safetensors_entries(path)
    raise WeightSourceError(
        f"cannot read weights from {path!r}: expected a .safetensors file, a "
        f"{HF_INDEX_NAME}, or a directory holding one of them"
    )


def open_weight_source(source: Any) -> dict[str, WeightEntry]:
    """Describes every tensor of ``source`` without reading the data.

    :param source: a state dict (``{name: tensor}``), the path of a ``.safetensors``
        file, a list of such paths (shards), the path of a Hugging Face
        ``model.safetensors.index.json``, or a directory holding one of them
    :return: name -> :class:`WeightEntry`
    :raises WeightSourceError: a missing file, an unreadable index, a name found twice
    """
    if isinstance(source, Mapping):
        return _state_dict_entries(source)
    if isinstance(source, (str, os.PathLike)):
        return _file_entries(os.fspath(source))
    if isinstance(source, Sequence) and all(isinstance(s, (str, os.PathLike)) for s in source):
        entries: dict[str, WeightEntry] = {}
        for path in source:
            for name, entry in _file_entries(os.fspath(path)).items():
                if name in entries:
                    raise WeightSourceError(
                        f"tensor {name!r} is in both {entries[name].origin!r} and {entry.origin!r}"
                    )
                entries[name] = entry
        return entries
    raise WeightSourceError(
        f"unsupported weight source {type(source).__name__}: expected a state dict, a "
        f".safetensors path, a list of shard paths or a {HF_INDEX_NAME}"
    )


def _listing(names: Sequence[str], limit: int = 12) -> str:
    """``'a', 'b', ... and 5 more``: a list of names short enough for one message."""
    shown = ", ".join(repr(n) for n in names[:limit])
    if len(names) > limit:
        shown += f" and {len(names) - limit} more"
    return shown


def dominant_dtype(entries: Mapping[str, WeightEntry]) -> torch.dtype | None:
    """The floating dtype holding most bytes of a source (``None`` without floats)."""
    totals: dict[torch.dtype, int] = {}
    for entry in entries.values():
        if entry.dtype.is_floating_point:
            totals[entry.dtype] = totals.get(entry.dtype, 0) + entry.nbytes
    return max(totals, key=totals.__getitem__) if totals else None


__all__ = [
    "HF_INDEX_NAME",
    "WeightEntry",
    "WeightSourceError",
    "dominant_dtype",
    "open_weight_source",
]
