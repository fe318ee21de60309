"""What a trace assumes of its inputs' sizes, and how a graph checks it.

Constraints adopted from the example (refinement), the versions kept instead of a
narrowing, the runtime checks a graph runs, the layouts of inputs, checks on tensor
values, and the search of sizes and witness inputs that validate them.
"""
