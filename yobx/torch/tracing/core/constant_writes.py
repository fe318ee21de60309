"""Tensors the model creates while it runs, written into by the graph.

A tensor the model's code builds from Python values (``acc = torch.zeros(4)``) is a real
tensor during the trace: an operation on it alone runs eagerly, and an operation with a
traced value records a node reading it as a constant of the graph (``get_attr``). A write
into it with a traced value (``acc.add_(x.sum(0))``, ``acc[0] = y``, through a view
``acc[:2]``) cannot run eagerly, so it is recorded. Two things went wrong after that:

* the graph wrote into the constant itself, which every call shares: the second call
  started from the values the first one left;
* the reads that followed without a traced value (``acc * 2``, ``return acc`` after a
  write through ``acc[:2]``) still ran eagerly, on the values of before the write, and
  their results became constants: wrong at the first call already.

torch.export copies such a constant before it is written (``lift_fresh_copy``). Here, at
the first recorded write into the memory of such a tensor, :class:`ConstantWrites`
records a copy of that whole memory (``clone`` of a constant holding it, flat), made
again at each call of the graph, and from then on stands every tensor viewing that
memory (the written one, its base, views made before or after the write) for the same
view of the copy: the writes go into the copy, and every later read is recorded and sees
them, as in eager. The tracer's :class:`~.state_writes.StateWrites` mode sends the calls
on such tensors here.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.fx.proxy import Proxy

from ..errors import TracingError


def _storage_key(tensor: torch.Tensor) -> Any:
    """Identifies the memory of ``tensor``; None for a tensor without storage (a
    ``torch.vmap`` batched tensor, a functional wrapper), which this module leaves alone."""
    from torch.multiprocessing.reductions import StorageWeakRef

    # the trace's StateWrites mode would record the call on a tensor it stands for
    with torch._C.DisableTorchFunction():
        try:
            return StorageWeakRef(tensor.untyped_storage())
        except (RuntimeError, NotImplementedError):
            return None


def _flat_memory(tensor: torch.Tensor) -> torch.Tensor:
    """The whole memory of ``tensor`` as a one-dimensional tensor of its dtype."""
    with torch._C.DisableTorchFunction(), torch.no_grad():
        storage = tensor.untyped_storage()
        whole = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        whole.set_(storage, 0, (storage.nbytes() // tensor.element_size(),), (1,))
    return whole


class ConstantWrites:
    """The copies of the memory of tensors created while tracing that the graph writes
    into, and the views of them standing for those tensors (see the module's
    documentation).

    :param tracer: the :class:`~yobx.torch.tracing.CustomTracer` tracing
    """

    def __init__(self, tracer: Any):
        self.tracer = tracer
        #: storage -> (proxy of the copy of its whole memory, dtype of the copy)
        self.copies: dict[Any, tuple[Proxy, torch.dtype]] = {}
        #: id of a tensor -> (the tensor, kept alive so the id stays its own; its proxy)
        self.views: dict[int, tuple[torch.Tensor, Proxy]] = {}
        #: the storages of created tensors the graph reads as constants
        self.read: set[Any] = set()
        #: the storages the model's code allocated while tracing (results of calls on
        #: real tensors that view none of their arguments): a global or a closure's
        #: tensor written into by the graph stays the one object eager writes into
        self.born: set[Any] = set()
        #: the storages of the module's parameters, buffers and tensor attributes
        #: (computed at the first question): writes into them are the module's
        self._state: set[Any] | None = None

    def __bool__(self) -> bool:
        """Whether the calls on real tensors must be looked at (the graph reads or
        writes memory of tensors created while tracing)."""
        return bool(self.copies or self.read)

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is a real tensor viewing memory the graph writes into."""
        return (
            bool(self.copies)
            and not isinstance(value, Proxy)
            and isinstance(value, torch.Tensor)
            and not isinstance(value, torch._subclasses.FakeTensor)
            and value.layout == torch.strided
            and _storage_key(value) in self.copies  # (None is no key)
        )

    def note_result(self, result: Any, args: tuple, kwargs: dict) -> Any:
        """Returns ``result``, a call's on real tensors (a tensor, or a tuple of them:
        ``torch.sort``), after noting the memory it allocated (:attr:`born`)."""
        if type(result) is torch.Tensor:
            self._note_allocated(result, args, kwargs)
        elif type(result) in (tuple, list) or isinstance(result, tuple):
            for item in result:
                if type(item) is torch.Tensor:
                    self._note_allocated(item, args, kwargs)
        return result

    def _note_allocated(self, tensor: torch.Tensor, args: tuple, kwargs: dict) -> None:
        if tensor.layout != torch.strided:
            return
        key = _storage_key(tensor)
        if key is None or key in self.born:
            return
        for value in (*args, *kwargs.values()):
            values = value if isinstance(value, (list, tuple)) else (value,)
            for item in values:
                if (
                    isinstance(item, torch.Tensor)
                    and not isinstance(item, Proxy)
                    and item.layout == torch.strided
                    and _storage_key(item) == key
                ):
                    return  # a view of an argument (`t.T`, `as_tensor(t)`, `t.unbind()`)
        self.born.add(key)

    def is_created_tensor(self, value: Any) -> bool:
        """Whether ``value`` is a real tensor the model's code created while tracing
        (:attr:`born`), neither a fake value nor a parameter, buffer or tensor attribute
        of a module, or a view of one."""
        return self._created_key(value) is not None

    def _created_key(self, value: Any) -> Any:
        """The storage key of ``value`` when :meth:`is_created_tensor`, else None."""
        if (
            isinstance(value, Proxy)
            or not isinstance(value, torch.Tensor)
            or isinstance(value, (torch._subclasses.FakeTensor, torch.nn.Parameter))
            or value.layout != torch.strided
            or value.device.type == "meta"
        ):
            return None
        key = _storage_key(value)
        if key is None or key not in self.born:
            return None
        if self._state is None:
            root = getattr(self.tracer, "root", None)
            tensors = list(self.tracer.tensor_attrs)
            if isinstance(root, torch.nn.Module):
                tensors.extend(p for _, p in root.named_parameters(remove_duplicate=False))
                tensors.extend(b for _, b in root.named_buffers(remove_duplicate=False))
            self._state = {
                _storage_key(t)
                for t in tensors
                if isinstance(t, torch.Tensor) and t.layout == torch.strided
            }
        return None if key in self._state else key

    def note_read(self, tensor: torch.Tensor) -> None:
        """The graph reads ``tensor`` as a constant: an eager write into its memory
        after that is recorded instead (:meth:`written_later`)."""
        key = self._created_key(tensor)
        if key is not None:
            self.read.add(key)

    def written_later(self, tensor: Any) -> bool:
        """Whether ``tensor`` views memory the graph already reads as a constant: a
        write into it then goes into the graph's copy, so that the earlier reads keep
        the values they had (``y = x + t; t.add_(1)``)."""
        return bool(self.read) and self._created_key(tensor) in self.read

    def proxy_of(self, tensor: torch.Tensor) -> Proxy:
        """The proxy standing for ``tensor`` in the graph: its view of the copy of its
        memory, the copy made at the first call."""
        found = self.views.get(id(tensor))
        if found is not None and found[0] is tensor:
            return found[1]
        key = _storage_key(tensor)
        if key not in self.copies:
            whole = _flat_memory(tensor)
            node = self.tracer.create_node("get_attr", self.tracer.add_constant(whole), (), {})
            node.meta["val"] = self.tracer.trace_dims().from_real(whole)
            self.copies[key] = (self.tracer.proxy(node).clone(), tensor.dtype)
        copy, dtype = self.copies[key]
        if tensor.dtype != dtype:
            raise TracingError.at(
                self.tracer.location(),
                f"a tensor created while tracing is written in place by the graph and "
                f"viewed with two dtypes ({dtype} and {tensor.dtype}, `.view(dtype)`): "
                f"the graph cannot make its copy of that memory; create the tensors "
                f"separately, or with a traced size so that they are values of the graph",
            )
        proxy = _view(copy, tensor)
        self.views[id(tensor)] = (tensor, proxy)
        return proxy


def _view(copy: Any, tensor: torch.Tensor) -> Proxy:
    """``tensor``'s view of its memory, as operations on ``copy`` (that memory, flat)
    which the rewrite passes can invert (slices, ``view``); an ``as_strided`` when the
    geometry has no such form (the passes then keep the writes in place)."""
    offset, sizes = int(tensor.storage_offset()), [int(n) for n in tensor.shape]
    strides = [int(s) for s in tensor.stride()]
    count = tensor.numel()
    if tensor.is_contiguous():
        if offset == 0 and count == copy.node.meta["val"].numel():
            return copy if len(sizes) == 1 else copy.view(sizes)
        return copy[offset : offset + count].view(sizes)
    # a dimension of size 1 has any stride: left out, put back by the last view
    kept = [(n, s) for n, s in zip(sizes, strides) if n != 1]
    view = _slices(copy, offset, [n for n, _ in kept], [s for _, s in kept])
    if view is None:
        return copy.as_strided(sizes, strides, offset)
    return view if len(kept) == len(sizes) else view.view(sizes)


def _slices(copy: Any, offset: int, sizes: list[int], strides: list[int]) -> Any:
    """The view of ``sizes`` and ``strides`` at ``offset`` in ``copy`` (flat) as a slice
    of whole rows of the outer stride, reshaped so that each stride is a dimension,
    then sliced in each (``acc[:, 1:3]`` of a ``4 x 4`` tensor: rows 0 to 4 of 4
    values, ``[:, 1:3]``); None when the strides do not nest so."""
    if not sizes or min(sizes) == 0 or min(strides) <= 0:
        return None
    if len(sizes) == 1:
        return copy[offset : offset + (sizes[0] - 1) * strides[0] + 1 : strides[0]]
    if any(outer % inner for outer, inner in itertools.pairwise(strides)):
        return None
    row = strides[0]
    start, rest = offset - offset % row, offset % row
    if start + sizes[0] * row > copy.node.meta["val"].numel():
        return None
    shape = [sizes[0]] + [outer // inner for outer, inner in itertools.pairwise(strides)]
    shape.append(strides[-1])
    index: list[Any] = [slice(None)]
    for dim in range(1, len(sizes)):
        first = (rest % strides[dim - 1]) // strides[dim]
        if first + sizes[dim] > shape[dim]:
            return None
        index.append(slice(first, first + sizes[dim]))
    index.append(rest % strides[-1])
    return copy[start : start + sizes[0] * row].view(shape)[tuple(index)]


__all__ = ["ConstantWrites"]
