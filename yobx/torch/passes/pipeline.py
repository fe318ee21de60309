"""The default passes, in the one order ``CustomTracer.trace`` and ``to_onnx`` share."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Graph

from ._targets import one_recompile, owned_by, recompile_owner
from ._untouched import untouched_by_default_passes
from .remove_batch_dim import BatchDimRemovalError, remove_batch_dim_nodes
from .remove_inplace import remove_inplace
from .remove_slices import remove_unnecessary_slices
from .result import PassResult, Refusal

#: The default passes in their order: vmap regions first (they re-trace code which may
#: contain in-place ops), then in-place removal, then the slices the rewrite made useless.
DEFAULT_PASSES = ("remove_batch_dim_nodes", "remove_inplace", "remove_unnecessary_slices")


def run_default_passes(
    graph: Graph,
    *,
    mutations: str = "write_back",
    exc: bool = False,
    recursive: bool = True,
    verbose: int = 0,
    exported_program: Any = None,
    module: torch.nn.Module | None = None,
) -> dict[str, PassResult]:
    """Runs :data:`DEFAULT_PASSES` on a graph.

    :param graph: the graph (modified in place)
    :param mutations: how mutated inputs and buffers keep their new values,
        ``"write_back"`` (``copy_`` at the end of the graph) or ``"outputs"`` (extra
        outputs, torch.export's convention); see :func:`remove_inplace`
    :param exc: raise when an in-place node has to be left in place
        (:class:`InplaceRemovalError`) or a vmap region cannot be batched
        (:class:`BatchDimRemovalError`); otherwise both are refusals in the results
    :param recursive: also clean the subgraphs of ``torch.cond`` / scan
    :param verbose: verbosity
    :param exported_program: the ``ExportedProgram`` owning the graph, if any
    :param module: the module holding the graph's attributes (parameters, buffers,
        subgraphs) when the graph has no owning module yet, as right after a trace: the
        passes then know which buffers share storage and which attributes are subgraphs
    :return: the result of each pass, by name

    Example::

        >>> import torch
        >>> from yobx.torch.passes import run_default_passes
        >>> class Model(torch.nn.Module):
        ...     def forward(self, x):
        ...         x.mul_(2)
        ...         return x[:, :] + 1
        >>> gm = torch.fx.symbolic_trace(Model())
        >>> results = run_default_passes(gm.graph)
        >>> [n.target for n in gm.graph.nodes if n.op == "call_method"]
        ['mul', 'copy_']
    """
    with owned_by(graph, module), one_recompile():
        if untouched_by_default_passes(graph):
            # nothing any pass matches: each would only classify every node to find out
            recompile_owner(graph)
            return {name: PassResult(name, 0) for name in DEFAULT_PASSES}
        return _run(graph, mutations, exc, recursive, verbose, exported_program)


def _run(
    graph: Graph,
    mutations: str,
    exc: bool,
    recursive: bool,
    verbose: int,
    exported_program: Any,
) -> dict[str, PassResult]:
    results: dict[str, PassResult] = {}
    try:
        results["remove_batch_dim_nodes"] = remove_batch_dim_nodes(graph, verbose=verbose)
    except BatchDimRemovalError as e:
        # a region that cannot be batched is left as it is (it still runs with functorch)
        if exc:
            raise
        refusal = Refusal("vmap", str(e))
        results["remove_batch_dim_nodes"] = PassResult("remove_batch_dim_nodes", 0, (refusal,))
    results["remove_inplace"] = remove_inplace(
        graph,
        exported_program,
        verbose=verbose,
        exc=exc,
        recursive=recursive,
        mutations=mutations,
    )
    results["remove_unnecessary_slices"] = remove_unnecessary_slices(graph, verbose=verbose)
    return results
