"""Graph rewrite passes over any ``torch.fx.Graph``.

Each pass mutates the graph in place, leaves it ``graph.lint()``-clean and returns the
number of nodes it changed or removed. None of them depends on the tracer.
"""

from .erase import graph_erase_node
from .remove_batch_dim import BatchDimRemovalError, remove_batch_dim_nodes
from .remove_inplace import MUTATIONS_KEY, InplaceRemovalError, remove_inplace
from .remove_slices import remove_unnecessary_slices

__all__ = [
    "BatchDimRemovalError",
    "InplaceRemovalError",
    "MUTATIONS_KEY",
    "graph_erase_node",
    "remove_batch_dim_nodes",
    "remove_inplace",
    "remove_unnecessary_slices",
]
