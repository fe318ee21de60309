"""Fake copies of a module's parameters and buffers, made directly.

A trace gives every parameter and buffer the model reads a fake tensor of its static
shape. torch's converter (``FakeTensorMode.from_tensor``) describes the tensor in full
(views, storage shared with other tensors, subclasses, autograd metadata): about
175 µs per tensor, a twentieth of a transformer's capture.

Most tensors of a model are plain: a contiguous ``Tensor`` or ``Parameter`` that owns
its whole storage, which no other tensor of the model shares. Their fake copy is a meta
tensor of the same geometry (what the converter builds for them too), made in a few
microseconds and registered in the converter's memo, so that torch's own conversions
(a leaf module run by the fake mode) find that same fake. Every other tensor goes
through the converter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._mode_utils import no_dispatch


def _plain(tensor: torch.Tensor) -> bool:
    """A leaf, dense, contiguous tensor at the start of a storage of its exact size,
    without gradient, not made in inference mode (the converter copies both)."""
    return (
        type(tensor) in (torch.Tensor, torch.nn.Parameter)
        and tensor.layout == torch.strided
        and not tensor.is_quantized
        and not tensor.is_nested
        and tensor.device.type in ("cpu", "meta")
        and tensor.is_leaf
        and not tensor.is_inference()
        and tensor.grad is None
        and not tensor._is_view()
        and tensor.storage_offset() == 0
        and tensor.is_contiguous()
        and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
        and (not tensor.requires_grad or tensor.grad_dtype == tensor.dtype)
    )


class StaticFakes:
    """The directly made fake copies of one trace (one fake mode)."""

    def __init__(self, fake_mode: FakeTensorMode) -> None:
        self.fake_mode = fake_mode
        #: id -> tensor, for the plain tensors whose storage no other tensor shares
        self._plain: dict[int, torch.Tensor] = {}
        self._fakes: dict[int, FakeTensor] = {}

    def index(self, tensors: Iterable[torch.Tensor]) -> None:
        """Finds the plain tensors among all the tensors of a module (tied ones
        included): a storage shared by two tensor objects keeps them both out."""
        owners: dict[int, dict[int, torch.Tensor | None]] = {}
        for tensor in tensors:
            if _plain(tensor):
                owners.setdefault(tensor.untyped_storage()._cdata, {})[id(tensor)] = tensor
            elif tensor.layout == torch.strided:
                # a view or an offset tensor: its storage is shared with someone else
                owners.setdefault(tensor.untyped_storage()._cdata, {})[id(tensor)] = None
        for same_storage in owners.values():
            if len(same_storage) == 1:
                (key, owner), *_ = same_storage.items()
                if owner is not None:
                    self._plain[key] = owner

    def get(self, tensor: torch.Tensor) -> FakeTensor | None:
        """The fake copy of an indexed plain tensor, ``None`` for any other tensor."""
        key = id(tensor)
        fake = self._fakes.get(key)
        if fake is not None or self._plain.get(key) is not tensor:
            return fake
        converter = self.fake_mode.fake_tensor_converter
        known = converter._get_memo(tensor)
        if known is not None:
            # converted before it was indexed: keep torch's fake
            self._fakes[key] = known
            return known
        # a meta tensor (a model built without weights) computes as on the CPU
        device = torch.device("cpu") if tensor.device.type == "meta" else tensor.device
        fake = meta_fake(self.fake_mode, tensor.shape, tensor.stride(), tensor.dtype, device)
        if tensor.requires_grad:
            with torch.enable_grad():
                fake.requires_grad_(True)
        if type(tensor) is torch.nn.Parameter:
            fake._is_param = True
        converter.set_tensor_memo(tensor, fake)
        self._fakes[key] = fake
        return fake


def meta_fake(
    fake_mode: FakeTensorMode,
    shape: Sequence[int],
    stride: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
) -> FakeTensor:
    """A fake tensor of a static geometry on ``device``, made directly on a meta tensor
    (a few microseconds; an ``empty`` run by the fake mode costs twenty times more)."""
    with no_dispatch():
        meta = torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device="meta")
        return FakeTensor(fake_mode, meta, device)
