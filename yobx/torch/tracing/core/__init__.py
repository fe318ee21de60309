"""The tracer itself: what a trace records and how.

:class:`~yobx.torch.tracing.core.tracer.CustomTracer` and its mixins (decisions on
proxies, fake execution, traced attributes, graph finish), the per-trace state, the
proxies and their dispatch, control flow (``torch.cond``, ``scan``, loops rolled into
``scan`` or unrolled) and the code generation of the traced graph. Which module
overrides which torch.fx hook: see the table in :mod:`yobx.torch.tracing`.
"""
