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
