"""Observe captured models: recorded runs of eager/graph/ONNX stages and Chrome traces.

.. code-block:: python

    from yobx.torch.inspect import record_run, first_divergence

    result = record_run(model, x, onnx_model="model.onnx")
    result.graph["linear_1"][0].retval      # what the node returned
    print(first_divergence(result.graph, result.onnx))
"""

from ..chrome_trace import (
    JSONTraceHandler,
    TraceHandler,
    current_rss_bytes,
    load_trace_events,
    merge_traces,
    write_stage_profile,
)
from ..stages import StageRecorder
from .compare import CallComparison, Comparison, ValueComparison, compare, first_divergence
from .decorators import trace_func, trace_model_func
from .recording import record_run, trace_graph_module
from .results import CallList, Params, TraceCall, TraceStage
from .trace_result import TraceResult
from .values import (
    ObjectSummary,
    SummaryCache,
    TensorSummary,
    ValueSummary,
    summarize,
    tensor_digest,
)

__all__ = [
    "CallComparison",
    "CallList",
    "Comparison",
    "JSONTraceHandler",
    "ObjectSummary",
    "Params",
    "StageRecorder",
    "SummaryCache",
    "TensorSummary",
    "TraceCall",
    "TraceHandler",
    "TraceResult",
    "TraceStage",
    "ValueComparison",
    "ValueSummary",
    "compare",
    "current_rss_bytes",
    "first_divergence",
    "load_trace_events",
    "merge_traces",
    "record_run",
    "summarize",
    "tensor_digest",
    "trace_func",
    "trace_graph_module",
    "trace_model_func",
    "write_stage_profile",
]
