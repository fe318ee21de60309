"""Tracing that survives what cannot be traced: submodules run as opaque leaves
(:class:`~yobx.torch.tracing.robust.robust.RobustTracer`), recursive tracing of the
submodules, the collection of graphs it gives, and recorded calls (the inputs, outputs
and time of each call)."""
