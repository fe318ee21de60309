"""Summaries of the values seen during a recorded run: tensors, scalars and containers.

A summary is what a user reads first (dtype, shape, statistics, digest); the full tensor
stays reachable through :attr:`TensorSummary.tensor` when the recording kept it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

#: Number of hexadecimal characters shown for a digest in reprs; the full digest is kept.
DIGEST_DISPLAY_LENGTH = 12


def tensor_digest(tensor: torch.Tensor) -> str:
    """Return a stable content digest of a tensor.

    The digest is a BLAKE2b hash over the dtype, the shape and the bytes of the elements in
    row-major order, so it changes when any element, their order, the shape or the dtype
    changes, and it is the same across processes (unlike Python's salted ``hash``) and for
    any memory layout of the same logical tensor.

    :param tensor: a dense tensor on any device
    :return: a hexadecimal string of 32 characters
    """
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(str(tensor.dtype).encode())
    hasher.update(repr(tuple(tensor.shape)).encode())
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel():
        # A uint8 view gives the raw bytes of every dtype numpy does not know (bfloat16,
        # float8, ...), without any conversion that could merge distinct values.
        hasher.update(flat.view(torch.uint8).numpy().tobytes())
    return hasher.hexdigest()


def _is_real_tensor(value: Any) -> bool:
    if not isinstance(value, torch.Tensor):
        return False
    if value.is_meta or value.layout != torch.strided or value.is_quantized:
        return False
    # Fake and functional tensors have no data to read.
    return type(value) in (torch.Tensor, torch.nn.Parameter)


class TensorSummary:
    """What a recorded tensor looked like: dtype, shape, device, statistics and digest.

    :param tensor: the tensor to summarise
    :param keep: keep a detached copy so that :attr:`tensor` returns the full value later
    """

    __slots__ = (
        "_tensor",
        "device",
        "digest",
        "dtype",
        "inf_count",
        "max",
        "mean",
        "min",
        "nan_count",
        "numel",
        "shape",
    )

    def __init__(self, tensor: torch.Tensor, keep: bool = True):
        self.dtype = tensor.dtype
        self.shape = tuple(tensor.shape)
        self.device = str(tensor.device)
        self.numel = tensor.numel()
        self.min: float | int | None = None
        self.max: float | int | None = None
        self.mean: float | None = None
        self.nan_count = 0
        self.inf_count = 0
        self.digest: str | None = None
        self._tensor: torch.Tensor | None = None
        if not _is_real_tensor(tensor):
            return
        detached = tensor.detach()
        self.digest = tensor_digest(detached)
        if keep:
            # A copy, because the model may modify the tensor in place after the call.
            self._tensor = detached.clone()
        self._compute_statistics(detached)

    def _compute_statistics(self, tensor: torch.Tensor) -> None:
        if self.numel == 0:
            return
        if tensor.dtype == torch.bool:
            self.min = int(tensor.min())
            self.max = int(tensor.max())
            self.mean = float(tensor.float().mean())
            return
        if tensor.is_complex():
            tensor = tensor.abs()
        if tensor.is_floating_point():
            # Statistics in float64 so that float16 overflows do not turn into inf.
            values = tensor.double()
            nan_mask = values.isnan()
            inf_mask = values.isinf()
            self.nan_count = int(nan_mask.sum())
            self.inf_count = int(inf_mask.sum())
            finite = values[~(nan_mask | inf_mask)]
            if finite.numel():
                self.min = float(finite.min())
                self.max = float(finite.max())
                self.mean = float(finite.mean())
            return
        self.min = int(tensor.min())
        self.max = int(tensor.max())
        self.mean = float(tensor.double().mean())

    @property
    def tensor(self) -> torch.Tensor:
        """The full recorded tensor (a copy taken at record time).

        :raises ValueError: the tensor was not kept (``keep_tensors=False``, or a fake
            or meta tensor without data)
        """
        if self._tensor is None:
            raise ValueError(
                f"the tensor {self.short()} was not kept; record with keep_tensors=True"
            )
        return self._tensor

    @property
    def value(self) -> torch.Tensor:
        """Same as :attr:`tensor`, so that every summary has a ``value``."""
        return self.tensor

    @property
    def has_tensor(self) -> bool:
        """Whether the full tensor was kept."""
        return self._tensor is not None

    def short(self) -> str:
        """One-line description: dtype, shape and digest."""
        dtype = str(self.dtype).replace("torch.", "")
        shape = "x".join(str(d) for d in self.shape) or "scalar"
        digest = f" #{self.digest[:DIGEST_DISPLAY_LENGTH]}" if self.digest else ""
        return f"{dtype}[{shape}]{digest}"

    def statistics_text(self) -> str:
        """The statistics as ``min=.. max=.. mean=..`` plus NaN/Inf counts when non-zero."""
        parts = []
        for name in ("min", "max", "mean"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={_format_number(value)}")
        if self.nan_count:
            parts.append(f"nan={self.nan_count}")
        if self.inf_count:
            parts.append(f"inf={self.inf_count}")
        return " ".join(parts)

    def __repr__(self) -> str:
        stats = self.statistics_text()
        device = "" if self.device == "cpu" else f" {self.device}"
        return f"{self.short()}{device}" + (f" {stats}" if stats else "")


class ValueSummary:
    """Summary of a non-tensor value (number, string, None, SymInt, unknown object).

    :param value: the value, kept as it is; its ``repr`` is cut to :attr:`MAX_TEXT`
    """

    __slots__ = ("_value", "text", "type_name")

    #: Longest text kept from ``repr(value)``.
    MAX_TEXT = 80

    def __init__(self, value: Any):
        self.type_name = type(value).__name__
        text = repr(value)
        if len(text) > self.MAX_TEXT:
            text = text[: self.MAX_TEXT - 3] + "..."
        self.text = text
        self._value = value

    @property
    def value(self) -> Any:
        """The value itself."""
        return self._value

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ValueSummary) and other.text == self.text

    __hash__ = None  # type: ignore[assignment]


class ObjectSummary:
    """Summary of an object made of tensors known to ``torch.utils._pytree`` (caches...).

    :param type_name: the object's class name
    :param children: the summaries of its flattened leaves
    """

    __slots__ = ("children", "type_name")

    def __init__(self, type_name: str, children: list[Any]):
        self.type_name = type_name
        self.children = children

    def __getitem__(self, index: int) -> Any:
        return self.children[index]

    def __len__(self) -> int:
        return len(self.children)

    def __repr__(self) -> str:
        return f"{self.type_name}({', '.join(repr(c) for c in self.children)})"


class SummaryCache:
    """Reuses the summary of a tensor seen again unchanged during one recording.

    The output of one call is usually the input of the next: the cache avoids hashing and
    copying it twice. A tensor is the same when it is the same object with the same
    version counter (in-place operations bump it).

    :param keep_tensors: keep copies of the tensors in the summaries
    """

    def __init__(self, keep_tensors: bool = True):
        self.keep_tensors = keep_tensors
        # id -> (tensor, version, summary); holding the tensor keeps its id from being reused.
        self._entries: dict[int, tuple[torch.Tensor, int | None, TensorSummary]] = {}

    def summarize_tensor(self, tensor: torch.Tensor) -> TensorSummary:
        """Summary of ``tensor``, computed once per unchanged tensor."""
        try:
            version: int | None = tensor._version
        except RuntimeError:
            # Inference-mode tensors have no version counter: never reuse their summary.
            version = None
        entry = self._entries.get(id(tensor))
        if entry is not None and entry[0] is tensor and version is not None and entry[1] == version:
            return entry[2]
        summary = TensorSummary(tensor, keep=self.keep_tensors)
        if version is not None:
            self._entries[id(tensor)] = (tensor, version, summary)
        return summary

    def clear(self) -> None:
        """Forget every entry (and release the tensors it held)."""
        self._entries.clear()


def summarize(value: Any, cache: SummaryCache | None = None, keep_tensors: bool = True) -> Any:
    """Summarise any value a model call may take or return.

    Tensors become :class:`TensorSummary`, lists, tuples and mappings keep their structure
    with summarised items (named tuples and structseqs become dicts by field name, a
    ``torch.Size`` a tuple), pytree-registered objects become :class:`ObjectSummary`,
    and everything else becomes a :class:`ValueSummary`.

    :param value: the value
    :param cache: a :class:`SummaryCache` to share summaries of unchanged tensors
    :param keep_tensors: keep copies of the tensors (ignored when ``cache`` is given)
    :return: the summary
    """
    if isinstance(value, torch.Tensor):
        if cache is not None:
            return cache.summarize_tensor(value)
        return TensorSummary(value, keep=keep_tensors)
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple, torch.Size):
        items = [summarize(v, cache, keep_tensors) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, tuple):
        # Named tuples and structseqs (torch.return_types.max, ...) keep their field names.
        fields = getattr(value, "_fields", None) or getattr(value, "__match_args__", None)
        if fields and len(fields) == len(value):
            return {f: summarize(v, cache, keep_tensors) for f, v in zip(fields, value)}
    if isinstance(value, Mapping):
        # Covers dict, OrderedDict and transformers' ModelOutput.
        return {k: summarize(v, cache, keep_tensors) for k, v in value.items()}
    if type(value) in pytree.SUPPORTED_NODES:
        children, _ = pytree.tree_flatten(value)
        return ObjectSummary(
            type(value).__name__, [summarize(c, cache, keep_tensors) for c in children]
        )
    return ValueSummary(value)


def flatten_summaries(summary: Any) -> list[Any]:
    """Leaves of a summary in a deterministic order (tensors and plain values)."""
    if isinstance(summary, (list, tuple)):
        return [leaf for item in summary for leaf in flatten_summaries(item)]
    if isinstance(summary, dict):
        return [leaf for item in summary.values() for leaf in flatten_summaries(item)]
    if isinstance(summary, ObjectSummary):
        return flatten_summaries(summary.children)
    return [summary]


def short_text(summary: Any, limit: int = 60) -> str:
    """Compact one-line text for tables: ``float32[2x3] #digest`` or the value's repr."""
    if isinstance(summary, TensorSummary):
        text = summary.short()
    elif isinstance(summary, (list, tuple)):
        inner = ", ".join(short_text(s, limit) for s in summary)
        text = f"({inner})" if isinstance(summary, tuple) else f"[{inner}]"
    elif isinstance(summary, dict):
        text = "{" + ", ".join(f"{k}: {short_text(v, limit)}" for k, v in summary.items()) + "}"
    elif isinstance(summary, ObjectSummary):
        text = f"{summary.type_name}({len(summary.children)} values)"
    else:
        text = repr(summary)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _format_number(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value) and value == int(value) and abs(value) < 1e6:
        return f"{value:.1f}"
    return f"{value:.4g}"
