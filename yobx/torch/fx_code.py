"""Regenerating a ``torch.fx.GraphModule``'s code after its own graph changed.

``GraphModule.recompile()`` also recompiles every submodule that is a ``GraphModule``
(torch 2.13), each of which recompiles its own in turn. A pass that changes the graphs
of a module and of its submodules, and recompiles each one it changed, then pays for
every graph once per level above it: a graph choosing between versions nests their
branches four deep, and an export of an eight-version decode step spent a third of its
lowering generating the same code again.
"""

from __future__ import annotations

import torch
from torch.fx._lazy_graph_module import _LazyGraphModule


def lazy_graph_module(root: torch.nn.Module, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """``torch.fx.GraphModule(root, graph)`` whose Python code is generated when it is
    first called or asked for (torch's ``_LazyGraphModule``), not at each ``recompile``.

    A capture builds the graph of every version, joins them under one module and runs
    its passes over all, each recompiling what it changed (and ``recompile`` of a
    module recompiles its submodules): a fifth of a capture went to code that an export
    never runs.
    """
    return _LazyGraphModule(root, graph)


def _no_submodules() -> list:
    return []


def recompile_alone(module: torch.fx.GraphModule) -> None:
    """Regenerates the code of ``module`` from its graph, not that of its submodules:
    for a pass that changed this graph only, or that recompiles each graph it changed.

    :param module: the module whose graph changed
    """
    # an attribute of the instance hides the class's method for this call only
    module.__dict__["_recompile_submodules"] = _no_submodules
    try:
        module.recompile()
    finally:
        del module.__dict__["_recompile_submodules"]
