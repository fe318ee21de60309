"""The inputs of a trace at other sizes (a *witness*: a size for each of the user's
dimensions), and eager runs of the model on them.

The tracer captures a model again at other sizes (the other side of a decision, see
:mod:`.versions`, or beside a size the example fixes): the example's tensors rebuilt
at the witness's sizes (:func:`leaves_for`), within what a capture may allocate
(:func:`witness_bytes`), and run eagerly first (:func:`run_eagerly`), which says
whether the model takes them, the model left as it was; a witness much bigger than the
example is not run (:func:`eager_affordable`): its capture, on fake tensors, checks it.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import sympy
import torch

from ..errors import exception_summary
from ..isolation.module_snapshot import preserved_modules
from ..isolation.parameter_writes import (
    preserved_parameters,
    restore_all,
    snapshot,
)
from ..isolation.patch_window import PatchWindow, current_window, finish_window
from .size_search import compile_condition, tensor_like

#: inputs a version's witness may allocate, in bytes, at least (more when the example
#: itself is big: 16 times its inputs); diffusers' upsampling makes a tensor contiguous
#: past 2**31 elements, whose other side needs inputs of 25 GB
WITNESS_BYTES = 256 * 2**20
WITNESS_BYTES_RATIO = 16

#: inputs up to which a witness is also run eagerly, in bytes, at least (more when the
#: example is big: 1024 times its inputs). Beyond, the eager run is skipped and the
#: capture on fake tensors is the check of that side: a model's intermediate tensors
#: grow with its inputs, and diffusers' CogVideoX video decoder, run eagerly on the
#: 141 MB witness of its batch (16384), allocated 22 GB and was killed
EAGER_BYTES = 16 * 2**20
EAGER_BYTES_RATIO = 1024
#: a dimension past which a witness is not run eagerly either, when it is also this many
#: times its size in the example: the inputs may stay small while what the model
#: computes from them does not (OpenAI GPT's attention at seq = 16384, tried for the
#: other side of `seq <= 128`, allocated 8 GB of scores from 0.5 MB of token ids)
EAGER_SIZE = 4096
EAGER_SIZE_RATIO = 64


def size_function(dims: Any, witness: dict[str, int]):
    """Maps a size of the example (an int or a SymInt) to its value at the witness."""
    symbols = [sympy.Symbol(name, integer=True) for name in witness]
    values = [witness[s.name] for s in symbols]

    def size(value: Any) -> int:
        if isinstance(value, int):
            return value
        # the size as declared (`w`), not as the ShapeEnv rewrote it since (`h`)
        expression = dims.user_expression(value.node._expr)
        return int(compile_condition(expression, symbols)(*values))

    return size


def _input_bytes(
    dims: Any, inputs: Any, witness: dict[str, int], reference: Any = None
) -> tuple[int, int]:
    """The bytes of the input tensors at the witness's sizes, and in the example: the
    smaller of ``inputs``' and ``reference``'s (see :func:`witness_bytes`)."""
    size = size_function(dims, witness)
    needed = sum(
        math.prod(max(size(d), 0) for d in sizes) * leaf.element_size()
        for leaf, sizes in _tensors(inputs)
    )
    example = _example_bytes(inputs)
    if reference is not None:
        example = min(example, _example_bytes(reference))
    return needed, example


def _tensors(inputs: Any) -> list[tuple[torch.Tensor, Any]]:
    return [
        (leaf, sizes)
        for leaf, sizes in zip(inputs.leaves, inputs.sizes)
        if isinstance(sizes, (list, tuple)) and isinstance(leaf, torch.Tensor)
    ]


def _example_bytes(inputs: Any) -> int:
    return sum(leaf.numel() * leaf.element_size() for leaf, _ in _tensors(inputs))


def witness_bytes(
    dims: Any, inputs: Any, witness: dict[str, int], reference: Any = None
) -> tuple[int, int]:
    """The bytes the witness's input tensors take, and the most a capture may
    allocate for them (see :data:`WITNESS_BYTES`).

    :param reference: the user's example inputs when ``inputs`` are a version's: the
        budgets are multiples of what the user gave, not of a version's example,
        which may already be a multiple of it (versions nest)
    """
    needed, example = _input_bytes(dims, inputs, witness, reference)
    return needed, max(WITNESS_BYTES, WITNESS_BYTES_RATIO * example)


def eager_affordable(
    dims: Any, inputs: Any, witness: dict[str, int], reference: Any = None
) -> bool:
    """Whether the witness's inputs are small enough to run the model eagerly on them
    (see :data:`EAGER_BYTES`; ``reference`` as for :func:`witness_bytes`), and none of
    its dimensions far larger than in the example (see :data:`EAGER_SIZE`)."""
    needed, example = _input_bytes(dims, inputs, witness, reference)
    if needed > max(EAGER_BYTES, EAGER_BYTES_RATIO * example):
        return False
    for name, size in witness.items():
        symbol = dims.by_name.get(name)
        hint = int(dims.hint(symbol)) if symbol is not None else size
        if size > EAGER_SIZE and size > EAGER_SIZE_RATIO * max(hint, 1):
            return False
    return True


def bytes_text(count: int) -> str:
    return f"{count / 2**30:.3g} GB" if count >= 2**30 else f"{count / 2**20:.3g} MB"


def leaves_for(dims: Any, inputs: Any, witness: dict[str, int]) -> list[Any]:
    """The example's leaves with the dynamic sizes of the witness."""
    size = size_function(dims, witness)
    generator = torch.Generator().manual_seed(0)
    new = []
    for leaf, sizes in zip(inputs.leaves, inputs.sizes):
        if isinstance(sizes, torch.SymInt):
            new.append(size(sizes))
        elif isinstance(sizes, (list, tuple)) and isinstance(leaf, torch.Tensor):
            new.append(tensor_like(leaf, [size(d) for d in sizes], generator))
        else:
            new.append(leaf)
    return new


def run_eagerly(root: Any, inputs: Any, leaves_: list[Any]) -> str | None:
    """Runs the model on the witness's inputs; the error's summary when it raises
    (None, as if it ran, for a model whose parameters are on the meta device).

    The model is left as it was: its buffers keep their values (a model may update
    them), its parameters too (copied when first written into, see
    :mod:`..isolation.parameter_writes`), and its modules their attributes (Swin sets
    its window size in ``forward`` from the input's size).
    """
    module = root if isinstance(root, torch.nn.Module) else None
    if module is not None and any(p.is_meta for p in module.parameters()):
        # a model exported before its weights (the meta device) cannot run: the
        # version's capture, on fake tensors, is the only check of that side
        return None
    if current_window() is not None:
        return _run_eagerly(root, module, inputs, leaves_)
    # a window of its own, closed in this frame: an interrupt landing in an `__exit__`
    # of the blocks preserving the model (torch's mode of the parameter writes) leaves
    # nothing installed, as for a trace (see PatchWindow)
    window = PatchWindow()
    error = None
    try:
        window.open()
        return _run_eagerly(root, module, inputs, leaves_)
    except BaseException as e:
        error = e
        raise
    finally:
        finish_window(window, error)


def _run_eagerly(root: Any, module: Any, inputs: Any, leaves_: list[Any]) -> str | None:
    saved = {n: snapshot(b) for n, b in module.named_buffers()} if module else {}
    try:
        with torch.no_grad(), contextlib.ExitStack() as stack:
            if module is not None:
                stack.enter_context(preserved_modules(module))
                stack.enter_context(preserved_parameters(module))
            inputs.call(root, leaves_)
    except Exception as exc:
        return exception_summary(exc)
    finally:
        if module is not None:
            restore_buffers(module, saved)
    return None


def restore_buffers(module: torch.nn.Module, saved: dict[str, tuple]) -> None:
    """Puts the buffers back as :func:`~..isolation.parameter_writes.snapshot` saved
    them (storage and geometry too: ``self.buf.t_()``), through interrupts
    (:func:`~..isolation.parameter_writes.restore_all`)."""
    restore_all([(b, saved[n]) for n, b in module.named_buffers() if n in saved])
