"""The private state of one trace, owned by :class:`~yobx.torch.tracing.CustomTracer`.

The tracer replaces it with a fresh :class:`TraceState` before every trace (and when it
is built), so nothing of a previous trace leaks into the next one. The tracer and its
mixins read and write it as ``self.state``; other modules go through the tracer's
public methods (:meth:`~yobx.torch.tracing.CustomTracer.constant`,
:meth:`~yobx.torch.tracing.CustomTracer.tensor_name`, ...).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import torch.fx
    from torch.fx.node import Node

    from ..inputs import FlatInputs


@dataclasses.dataclass
class TraceState:
    """What the tracer accumulates while tracing one model."""

    #: tensors created while tracing, by the name of their ``get_attr`` node; they are
    #: stored on the traced model when the graph is finished
    constants: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    #: the last ``get_attr`` node made for a tensor constant, by ``id`` of the tensor:
    #: the same tensor used twice in one graph becomes one node
    constant_nodes: dict[int, Node] = dataclasses.field(default_factory=dict)
    #: callables registered on the traced model (branches of ``torch.cond``, bodies of
    #: loops, wrapped functions), by their unique attribute name
    subgraphs: dict[str, torch.fx.Graph | torch.nn.Module] = dataclasses.field(default_factory=dict)
    #: ``x.shape`` already computed for a node of the graph being recorded, so that
    #: the ``size`` nodes are made once; emptied for every subgraph
    shape_cache: dict[Node, Any] = dataclasses.field(default_factory=dict)
    #: one entry per subgraph being recorded (innermost last): the values of the
    #: enclosing graph used inside, mapped to the placeholders that replace them
    lift_stack: list[dict[Node, Node]] = dataclasses.field(default_factory=list)
    #: qualified names of the parameters and buffers of the traced module, by ``id``
    tensor_names: dict[int, str] = dataclasses.field(default_factory=dict)
    #: the parameters and buffers written into while tracing (a ``StateWrites`` mode,
    #: None outside a trace)
    state_writes: Any = None
    #: the example inputs, flattened (None before a trace binds them)
    inputs: FlatInputs | None = None
    #: the pytree spec of the traced function's output
    out_spec: Any = None
    #: whether inputs or outputs are nested structures: the graph module then flattens
    #: and rebuilds them (a ``_PyTreeCodeGen``)
    structured: bool = False
    #: the tensors whose layout the traced code read (``stride()``, ``is_contiguous()``...),
    #: with the user's ``file:line``: a read folded into a constant leaves no node
    layout_reads: list[tuple[Node, str]] = dataclasses.field(default_factory=list)
    #: the ``contiguous()`` and reshape calls whose result may be a view of their input
    #: at some sizes and a copy at others (:class:`~.layout_copies.LayoutCall`): a write
    #: into one, or into its input, decides which (see :mod:`.layout_copies`)
    layout_calls: list[Any] = dataclasses.field(default_factory=list)
    #: depth of fake executions in progress (> 0: torch runs an operation on fake
    #: values, module calls and attribute reads are torch's, not the user's)
    in_fake: int = 0
    #: the loop regions of the trace, in order (see :mod:`.loops`)
    loops: list[Any] = dataclasses.field(default_factory=list)
    #: the region whose steps are being recorded
    active_loop: Any = None
    #: the nodes closed regions hand out -> their region
    loop_outputs: dict[Node, Any] = dataclasses.field(default_factory=dict)
    #: > 0 while ``unbind``/``split`` make their pieces for real (see loops)
    pieces_made: int = 0
    #: how many :class:`~.loops.SymbolicPieces` (or :class:`~.loops.SymbolicRepeat`) the
    #: trace handed out
    pieces_out: int = 0
    #: loop-index symbols -> their region
    loop_symbols: dict[Any, Any] = dataclasses.field(default_factory=dict)
    #: depth of assumptions in progress (> 0: the guards torch adds are facts the
    #: tracer chose to assume, not constraints taken from the example)
    allowed_guards: int = 0
