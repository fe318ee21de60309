"""Common mistakes in a call to :func:`~yobx.torch.onnx.to_onnx`, each refused with its
cause and its fix, before they become an error about an operator or a node.

* the positional inputs given as a bare tensor (``to_onnx(model, x)``): pass a tuple;
* a numpy array as an input: convert it with ``torch.from_numpy``;
* a model in training mode whose batch norms would update their statistics, or whose
  dropouts would drop values at random: call ``model.eval()``;
* an output that is not a tensor (a string, a number): ONNX outputs are tensors;
* a model that raises on its own example inputs: the capture fails, and the error
  says that eager PyTorch fails the same way, with eager's own message;
* an in-place write the passes had to keep (into a tensor that may share storage with
  another at some sizes, or through a view no ONNX operator writes through): each
  named with the user's line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from yobx.torch.onnx.errors import OnnxExportError


class ModelRaisesOnExampleError(OnnxExportError):
    """The model raises on its example inputs in eager PyTorch: nothing to export."""


def check_positional_inputs(args: Any) -> tuple:
    """``args`` as a tuple (None: no positional input, as ``kwargs=None`` has no
    keyword input); a bare tensor or array is refused with the fix."""
    if args is None:
        return ()
    if isinstance(args, (torch.Tensor, np.ndarray)):
        raise TypeError(
            f"to_onnx takes the positional inputs as a tuple, not a "
            f"{type(args).__name__}: to_onnx(model, (x,)) for one tensor x"
        )
    return tuple(args)


def refuse_numpy_inputs(args: tuple, kwargs: Mapping[str, Any]) -> None:
    """A numpy array among the inputs is refused: the model receives tensors."""
    named = [(f"positional input {i}", a) for i, a in enumerate(args)]
    named += [(f"input {k!r}", v) for k, v in kwargs.items()]
    for name, value in named:
        if any(isinstance(leaf, np.ndarray) for leaf in pytree.tree_leaves(value)):
            raise TypeError(
                f"{name} holds a numpy array: the model receives tensors; convert it "
                f"with torch.from_numpy(array)"
            )


def refuse_training_mode(model: torch.nn.Module) -> None:
    """A batch norm or a dropout in training mode is refused: its graph would update
    the statistics, or drop values at random, where the user wants inference."""
    found = []
    for name, module in model.named_modules():
        if not module.training:
            continue
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            found.append(f"{type(module).__name__} {name!r} would update its running statistics")
        elif isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            found.append(f"{type(module).__name__} {name!r} would drop values at random")
    if found:
        listed = "; ".join(found[:3]) + ("; ..." if len(found) > 3 else "")
        raise ValueError(
            f"the model is in training mode: {listed}; call model.eval() before exporting"
        )


def refuse_constant_outputs(flat_outputs: Sequence[Any], names: Sequence[str]) -> None:
    """An output that is not computed (a string, a number) has no ONNX output."""
    for value, name in zip(flat_outputs, names):
        if value is None or isinstance(value, torch.fx.Node):
            continue
        raise OnnxExportError(
            f"output {name!r} is a {type(value).__name__} ({value!r:.60}), not a tensor: "
            f"ONNX outputs are tensors computed by the model; return tensors only (leave "
            f"the {type(value).__name__} out of the outputs, or wrap a number with "
            f"torch.tensor)"
        )


def raise_if_eager_fails(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any]):
    """Runs the model eagerly on copies of its example inputs, its buffers restored
    after; raises :class:`ModelRaisesOnExampleError` (from eager's error) when it fails.
    Called after a capture failed, to tell a model that cannot run from a capture that
    cannot follow it."""
    copies = pytree.tree_map(
        lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (args, dict(kwargs))
    )
    saved = {n: b.clone() for n, b in model.named_buffers() if isinstance(b, torch.Tensor)}
    try:
        with torch.no_grad():
            model(*copies[0], **copies[1])
    except Exception as exc:
        lines = f"{type(exc).__name__}: {exc}".strip().splitlines()
        raise ModelRaisesOnExampleError(
            f"the model raises on the example inputs: {lines[0]}; eager PyTorch fails "
            f"the same way, fix the inputs or the model"
        ) from exc
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name in saved and buffer.shape == saved[name].shape:
                    buffer.copy_(saved[name])


__all__ = [
    "ModelRaisesOnExampleError",
    "check_positional_inputs",
    "raise_if_eager_fails",
    "refuse_constant_outputs",
    "refuse_numpy_inputs",
    "refuse_training_mode",
]


def refuse_kept_writes(captured: Any) -> None:
    """An in-place write ``remove_inplace`` had to keep cannot be exported: ONNX has no
    in-place operations, and its translation as a plain operation would lose the write
    into what the written tensor shares storage with (``w = t[:, ::2].contiguous();
    w.mul_(2)`` writes into ``t`` at the sizes where ``contiguous()`` returns ``t``'s
    view itself). The graph module keeps such writes and stays right; the export refuses
    them, naming each one."""
    result = captured.passes.get("remove_inplace")
    refused = list(getattr(result, "refused", ()) or ())
    if not refused:
        return
    reasons = dict.fromkeys(refusal.reason for refusal in refused)  # versions repeat them
    lines = "\n".join(f"  - {reason}" for reason in reasons)
    hints = []
    if any("'as_strided'" in reason for reason in reasons):
        # a block of a transposed tensor the model created: no slice of the tensor is
        # that view, and a clone would not write into the tensor
        hints.append(
            "a view whose strides no slice or reshape gives (a block of a transposed "
            "tensor, `t.t()[:2, :2] += v`) becomes `as_strided`, which no ONNX "
            "operator writes through: index the tensor itself (`t[:2, :2] += v.t()`)"
        )
    if any("'as_strided'" not in reason for reason in reasons):
        hints.append(
            "a reshape or a `contiguous()` of a tensor that is not contiguous is a view "
            "at some sizes, a copy at others: write into a `.clone()` of it (a copy at "
            "every size), or into the tensor itself"
        )
    raise OnnxExportError(
        f"the model writes in place into tensors that may share storage with others, "
        f"and ONNX has no in-place writes ({len(reasons)} found):\n{lines}\n" + "\n".join(hints)
    )
