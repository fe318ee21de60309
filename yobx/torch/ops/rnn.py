"""Custom operators shared by capture and export: ``nn.LSTM`` / ``nn.GRU`` as one op.

The forward of ``nn.LSTM`` cannot run on tensors with symbolic sizes (``torch._VF.lstm``
calls ``numel()``) and ``nn.GRU`` fixes batch and sequence to the example's sizes.
``yobx::lstm`` and ``yobx::gru`` compute the same values eagerly and have fake kernels
that keep every size symbolic; :func:`leaf_module_call` routes a module call to them.
The tracer uses them to compute fake values of RNN leaves, the ONNX exporter to keep the
recurrence as one ONNX ``LSTM``/``GRU`` operator (see ``yobx.torch.onnx.custom_ops``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ._lazy import LazyOperators


def _rnn_weights(module: torch.nn.RNNBase) -> list[torch.Tensor]:
    # The layout torch._VF.lstm/gru expect: per layer and direction, w_ih, w_hh, then
    # b_ih, b_hh when bias is True. Read through getattr, not module._flat_weights, so
    # that parameters swapped in while lowering (fake ones) are the ones used.
    return [getattr(module, name) for name in module._flat_weights_names]


def _lstm(
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    weights: list[torch.Tensor],
    has_biases: bool,
    num_layers: int,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``nn.LSTM`` (no dropout, no projection) as one operator."""
    output, h_n, c_n = torch._VF.lstm(
        x, (h0, c0), weights, has_biases, num_layers, 0.0, False, bidirectional, batch_first
    )
    return output, h_n, c_n


def _lstm_fake(x, h0, c0, weights, has_biases, num_layers, bidirectional, batch_first):
    hidden = h0.shape[-1]
    directions = 2 if bidirectional else 1
    out_shape = (*x.shape[:-1], directions * hidden)
    return x.new_empty(out_shape), h0.new_empty(h0.shape), c0.new_empty(c0.shape)


def _gru(
    x: torch.Tensor,
    h0: torch.Tensor,
    weights: list[torch.Tensor],
    has_biases: bool,
    num_layers: int,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``nn.GRU`` (no dropout) as one operator."""
    output, h_n = torch._VF.gru(
        x, h0, weights, has_biases, num_layers, 0.0, False, bidirectional, batch_first
    )
    return output, h_n


def _gru_fake(x, h0, weights, has_biases, num_layers, bidirectional, batch_first):
    hidden = h0.shape[-1]
    directions = 2 if bidirectional else 1
    out_shape = (*x.shape[:-1], directions * hidden)
    return x.new_empty(out_shape), h0.new_empty(h0.shape)


#: the custom operators ``yobx::lstm`` and ``yobx::gru`` by name, defined the first
#: time a module is replaced by one (``operators()``) in a process: see :mod:`._lazy`
operators = LazyOperators(
    {
        "lstm": ("yobx::lstm", _lstm, _lstm_fake),
        "gru": ("yobx::gru", _gru, _gru_fake),
    }
)
#: whether they were defined in this process
defined = operators.defined

#: `lstm` and `gru`, defined when first read
__getattr__ = operators.module_getattr(__name__)


def _initial_state(module: torch.nn.RNNBase, x: torch.Tensor) -> torch.Tensor:
    directions = 2 if module.bidirectional else 1
    batch = x.shape[0] if module.batch_first else x.shape[1]
    return x.new_zeros((module.num_layers * directions, batch, module.hidden_size))


def leaf_module_call(module: torch.nn.Module, args: Sequence[Any], kwargs: dict) -> Any:
    """Replaces the call of a leaf module by a custom operator, or returns None.

    Only unbatched-free, projection-free, dropout-free (or eval) LSTM and GRU modules
    are replaced; any other module runs its own forward.
    """
    if type(module) not in (torch.nn.LSTM, torch.nn.GRU):
        return None
    if getattr(module, "proj_size", 0) or (module.dropout and module.training):
        return None
    x = args[0]
    state = args[1] if len(args) > 1 else kwargs.get("hx")
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        return None
    operators()
    common = (
        _rnn_weights(module),
        module.bias,
        module.num_layers,
        module.bidirectional,
        module.batch_first,
    )
    if isinstance(module, torch.nn.LSTM):
        if state is None:
            h0 = _initial_state(module, x)
            c0 = _initial_state(module, x)
        else:
            h0, c0 = state
        output, h_n, c_n = torch.ops.yobx.lstm(x, h0, c0, *common)
        return output, (h_n, c_n)
    h0 = _initial_state(module, x) if state is None else state
    output, h_n = torch.ops.yobx.gru(x, h0, *common)
    return output, h_n
