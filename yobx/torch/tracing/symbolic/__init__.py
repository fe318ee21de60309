"""Symbolic dimensions: the ShapeEnv of a trace and what is known of its symbols.

Their user names and text, the proofs and bounds the tracer uses to decide questions
on sizes without looking at the example (ranges, residues, integral conditions), the
memo of decisions, the static fakes of weights, and the symbolic variants of torch
kernels (installed by ``symbolic_kernels.py``).
"""
