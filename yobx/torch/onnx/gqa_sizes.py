"""The sizes ``GroupQueryAttention`` reads, computed once for all the layers.

The operator takes, besides the attention's values, the length of each row's keys
minus one (``seqlens_k``, int32, one per row), the total length (``past + seq``, an
int32 scalar), and the model's mask expanded to ``(batch, 1, seq, past + seq)``. Read
on each layer's own values (its cache's length, its key's number of tokens), they took
eleven nodes per layer, all computing the same numbers: a decode step of 8 layers ran
88 nodes for them, each costing onnxruntime a microsecond or two whatever its size.
Read once (with :mod:`.branch_hoisting`), the 8-layer Llama decode step of
``_scripts/bench_decode_latency.py`` runs 304 nodes instead of 390, and its 4-bit
version went from 1.29x to 1.23x the time of onnxruntime-genai's builder's graph.
With ``runtime_checks=False``, inputs whose sizes disagree with the dimensions they
were declared with give undefined results, as anywhere else in the model.

:class:`StepSizes` reads each size on the model's input holding that dimension (the
same name in its shape: ``batch`` on ``input_ids``, ``past`` on the first cache
tensor) and writes the computation once, at the start of the main graph, where every
layer's operator (in any branch) reads it. The dimensions named alike in one model are
one size: the export names them from torch's symbolic shapes, and the model's runtime
checks (``runtime_checks=True``, the default) refuse inputs where two of them differ.
A size whose dimension is not found among the inputs is read on the layer's values as
before.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from yobx.torch.onnx.gqa_rotary import NodeList
from yobx.torch.onnx.ir_values import dims_of


class StepSizes:
    """The operator's sizes of one model, written once per set of dimensions."""

    def __init__(self, model: ir.Model) -> None:
        self.graph = model.graph
        self.written: dict[tuple, tuple[ir.Value, ...]] = {}

    def _source(self, dim: object) -> tuple[ir.Value, int] | int | None:
        """The first input of the model with ``dim`` (a name) in its shape, and where;
        ``dim`` itself when it is static (the version for one token has ``seq == 1``)."""
        if isinstance(dim, int):
            return dim
        if not isinstance(dim, str):
            return None
        for value in self.graph.inputs:
            dims = dims_of(value) or []
            if dim in dims:
                return value, dims.index(dim)
        return None

    @staticmethod
    def _read(nodes: NodeList, source: tuple[ir.Value, int] | int) -> ir.Value:
        if isinstance(source, int):
            return nodes.constant(np.array([source], np.int64))
        value, axis = source
        return nodes.add("Shape", [value], start=axis, end=axis + 1)[0]

    def sizes(self, batch: object, seq: object, past: object) -> tuple[ir.Value, ...] | None:
        """``(batch, seq, total, seqlens_k, total_sequence_length, mask_shape)`` for the
        dimensions named ``batch``, ``seq`` and ``past`` (the first three int64 of one
        element, ``seqlens_k`` of ``batch`` int32, the total an int32 scalar, the
        mask's shape ``(batch, 1, seq, total)``), computed in the main graph; None when
        one of them is not the dimension of an input."""
        sources = [self._source(dim) for dim in (batch, seq, past)]
        if None in sources or not len(self.graph):
            return None
        key = tuple(s if isinstance(s, int) else (id(s[0]), s[1]) for s in sources)  # type: ignore[index]
        if key not in self.written:
            nodes = NodeList(f"yobx_gqa_sizes_{len(self.written)}")
            batch_size, seq_size, past_size = (self._read(nodes, s) for s in sources)  # type: ignore[arg-type]
            one = nodes.constant(np.array([1], np.int64))
            total = nodes.add("Add", [past_size, seq_size])[0]
            last = nodes.add("Sub", [total, one])[0]
            seqlens = nodes.add("Cast", [nodes.add("Expand", [last, batch_size])[0]], to=6)[0]
            total32 = nodes.add("Cast", [nodes.add("Squeeze", [total])[0]], to=6)[0]
            shape = nodes.add("Concat", [batch_size, one, seq_size, total], axis=0)[0]
            self.graph.insert_before(self.graph[0], nodes)
            self.written[key] = (batch_size, seq_size, total, seqlens, total32, shape)
        return self.written[key]


__all__ = ["StepSizes"]
