"""Leaf modules kept whole through lowering, and their ONNX translations.

Lowering ``nn.LSTM`` / ``nn.GRU`` to aten unrolls the recurrence over the time steps,
which fixes the sequence length. Instead the leaf module call becomes one opaque
custom operator (``yobx::lstm``, ``yobx::gru``) whose ONNX translation is the ONNX
``LSTM`` / ``GRU`` operator, one per layer, so the sequence length stays dynamic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnxscript
import torch

_op = onnxscript.opset18


def _rnn_weights(module: torch.nn.RNNBase) -> list[torch.Tensor]:
    # The layout torch._VF.lstm/gru expect: per layer and direction, w_ih, w_hh, then
    # b_ih, b_hh when bias is True. Read through getattr, not module._flat_weights, so
    # that parameters swapped in while lowering (fake ones) are the ones used.
    return [getattr(module, name) for name in module._flat_weights_names]


@torch.library.custom_op("yobx::lstm", mutates_args=())
def lstm(
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


@lstm.register_fake
def _lstm_fake(x, h0, c0, weights, has_biases, num_layers, bidirectional, batch_first):
    hidden = h0.shape[-1]
    directions = 2 if bidirectional else 1
    out_shape = (*x.shape[:-1], directions * hidden)
    return x.new_empty(out_shape), h0.new_empty(h0.shape), c0.new_empty(c0.shape)


@torch.library.custom_op("yobx::gru", mutates_args=())
def gru(
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


@gru.register_fake
def _gru_fake(x, h0, weights, has_biases, num_layers, bidirectional, batch_first):
    hidden = h0.shape[-1]
    directions = 2 if bidirectional else 1
    out_shape = (*x.shape[:-1], directions * hidden)
    return x.new_empty(out_shape), h0.new_empty(h0.shape)


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


def _reorder_gates(weight, order: Sequence[int], gates: int):
    """Splits the gate blocks along axis 0 and concatenates them in ``order``."""
    parts = _op.Split(weight, num_outputs=gates, axis=0)
    return _op.Concat(*[parts[i] for i in order], axis=0)


def _rnn_layer_inputs(weights, layer, directions, has_biases, order, gates):
    """Builds ONNX W, R, B for one layer from PyTorch's flat weights."""
    per_direction = 4 if has_biases else 2
    ws, rs, bs = [], [], []
    for d in range(directions):
        base = (layer * directions + d) * per_direction
        w = _reorder_gates(weights[base], order, gates)
        r = _reorder_gates(weights[base + 1], order, gates)
        ws.append(_op.Unsqueeze(w, [0]))
        rs.append(_op.Unsqueeze(r, [0]))
        if has_biases:
            wb = _reorder_gates(weights[base + 2], order, gates)
            rb = _reorder_gates(weights[base + 3], order, gates)
            bs.append(_op.Unsqueeze(_op.Concat(wb, rb, axis=0), [0]))
    w = _op.Concat(*ws, axis=0) if directions > 1 else ws[0]
    r = _op.Concat(*rs, axis=0) if directions > 1 else rs[0]
    b = None
    if has_biases:
        b = _op.Concat(*bs, axis=0) if directions > 1 else bs[0]
    return w, r, b


def _rnn_to_onnx(kind, x, h0, c0, weights, has_biases, num_layers, bidirectional, batch_first):
    directions = 2 if bidirectional else 1
    direction = "bidirectional" if bidirectional else "forward"
    if batch_first:
        x = _op.Transpose(x, perm=[1, 0, 2])
    hidden_states, cell_states = [], []
    for layer in range(num_layers):
        start, end = layer * directions, (layer + 1) * directions
        h_init = _op.Slice(h0, [start], [end], [0])
        if kind == "lstm":
            # PyTorch orders the gates i, f, g, o; ONNX i, o, f, c.
            w, r, b = _rnn_layer_inputs(weights, layer, directions, has_biases, [0, 3, 1, 2], 4)
            c_init = _op.Slice(c0, [start], [end], [0])
            hidden_size = h0.shape[-1] if h0.shape is not None else None
            y, y_h, y_c = _op.LSTM(
                x, w, r, b, None, h_init, c_init, direction=direction, hidden_size=hidden_size
            )
            cell_states.append(y_c)
        else:
            # PyTorch orders the gates r, z, n; ONNX z, r, h. PyTorch applies the
            # reset gate after the recurrent linear transform: linear_before_reset=1.
            w, r, b = _rnn_layer_inputs(weights, layer, directions, has_biases, [1, 0, 2], 3)
            hidden_size = h0.shape[-1] if h0.shape is not None else None
            y, y_h = _op.GRU(
                x,
                w,
                r,
                b,
                None,
                h_init,
                direction=direction,
                hidden_size=hidden_size,
                linear_before_reset=1,
            )
        hidden_states.append(y_h)
        # Y is [seq, directions, batch, hidden]; the next layer wants [seq, batch, d*h].
        y = _op.Transpose(y, perm=[0, 2, 1, 3])
        x = _op.Reshape(y, _op.Constant(value_ints=[0, 0, -1]))
    output = _op.Transpose(x, perm=[1, 0, 2]) if batch_first else x
    h_n = _op.Concat(*hidden_states, axis=0) if num_layers > 1 else hidden_states[0]
    if kind == "gru":
        return output, h_n
    c_n = _op.Concat(*cell_states, axis=0) if num_layers > 1 else cell_states[0]
    return output, h_n, c_n


def _lstm_to_onnx(x, h0, c0, weights, has_biases, num_layers, bidirectional, batch_first):
    return _rnn_to_onnx(
        "lstm", x, h0, c0, weights, has_biases, num_layers, bidirectional, batch_first
    )


def _gru_to_onnx(x, h0, weights, has_biases, num_layers, bidirectional, batch_first):
    return _rnn_to_onnx(
        "gru", x, h0, None, weights, has_biases, num_layers, bidirectional, batch_first
    )


def register_translations(registry: Any) -> None:
    """Adds the ONNX translations of yobx's custom operators to torch_lib's registry."""
    registry.register_op(torch.ops.yobx.lstm.default, _lstm_to_onnx)
    registry.register_op(torch.ops.yobx.gru.default, _gru_to_onnx)
