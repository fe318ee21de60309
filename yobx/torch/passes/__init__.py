"""Graph rewrite passes over any ``torch.fx.Graph``.

Each pass mutates the graph in place, leaves a graph it changed ``graph.lint()``-clean
and returns a
:class:`PassResult`: an int (the number of nodes it changed or removed, negative when it
had to leave nodes) carrying what was done and what could not be. What the passes know
about aliasing and side effects comes from :mod:`yobx.torch.passes.aliasing`. None of
them depends on the tracer.
"""

from ._untouched import register_untouched_functions, untouched_by_default_passes
from .aliasing import STORAGE_KEY, has_side_effect, mark_storages, shared_storage_groups
from .erase import graph_erase_node
from .pipeline import DEFAULT_PASSES, run_default_passes
from .remove_batch_dim import BatchDimRemovalError, remove_batch_dim_nodes
from .remove_inplace import (
    MUTATIONS_KEY,
    WRITE_BACK_KEY,
    InplaceRemovalError,
    remove_inplace,
    writes_anything,
)
from .remove_slices import remove_unnecessary_slices
from .result import PassResult, Refusal

__all__ = [
    "BatchDimRemovalError",
    "DEFAULT_PASSES",
    "InplaceRemovalError",
    "MUTATIONS_KEY",
    "PassResult",
    "Refusal",
    "STORAGE_KEY",
    "WRITE_BACK_KEY",
    "graph_erase_node",
    "has_side_effect",
    "mark_storages",
    "register_untouched_functions",
    "remove_batch_dim_nodes",
    "remove_inplace",
    "remove_unnecessary_slices",
    "run_default_passes",
    "shared_storage_groups",
    "untouched_by_default_passes",
    "writes_anything",
]
