"""The optimization of an exported model: onnxscript's optimizer, linear in its size.

:func:`optimize_model` runs the passes of ``onnxscript.optimizer.optimize_ir`` with its
default rewrite rules except those whose pattern has several output nodes: onnxscript
matches them by enumerating combinations of graph nodes, for every candidate node,
which is quadratic in the size of the graph (on a 7B Llama, 90% of a 46 s optimization
went to ``SlicesSplit``, which turns two ``Slice`` of a tensor into one ``Split``).

:func:`fuse_for_onnxruntime` applies onnxscript's fusions for onnxruntime
(``to_onnx(optimize="ort")``): attention, RMS and skip normalizations, rotary
embeddings, GELU, ``Transpose`` + ``MatMul``... become contrib operators that only
onnxruntime runs.

The caller keeps weights out of reach (:func:`yobx.torch.onnx.weights.weights_kept_apart`).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnx_ir.passes import common as common_passes


def _linear_rules() -> list:
    from onnxscript import rewriter

    rules = []
    for rule in rewriter._DEFAULT_REWRITE_RULES:
        pattern = getattr(rule, "_target_pattern", None)
        if pattern is not None and not getattr(pattern, "has_single_output_node", True):
            continue
        rules.append(rule)
    return rules


def optimize_model(model: ir.Model, num_iterations: int = 2) -> None:
    """Optimizes ``model`` in place: inlining, constant folding, rewrite rules, dead
    code, constants lifted to initializers, common subexpressions, names."""
    from onnxscript import rewriter
    from onnxscript.optimizer import _constant_folding

    passes = [
        common_passes.InlinePass(),
        ir.passes.PassManager(
            [
                _constant_folding.FoldConstantsPass(
                    shape_inference=True,
                    input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
                    output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
                    should_fold=lambda node: None,
                ),
                rewriter.RewritePass(_linear_rules()),
                common_passes.RemoveUnusedNodesPass(),
                common_passes.RemoveUnusedFunctionsPass(),
                common_passes.RemoveUnusedOpsetsPass(),
            ],
            steps=num_iterations,
            early_stop=True,
        ),
        common_passes.RemoveUnusedNodesPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.LiftSubgraphInitializersToMainGraphPass(),
        common_passes.DeduplicateInitializersPass(),
        common_passes.CommonSubexpressionEliminationPass(),
        common_passes.OutputFixPass(),
        common_passes.NameFixPass(),
    ]
    ir.passes.Sequential(*passes)(model)


#: the accepted values of ``to_onnx(optimize=...)``
OPTIMIZE_LEVELS = ("default", "ort")


def check_optimize_level(optimize: Any) -> str:
    """Returns ``optimize`` if it is one of :data:`OPTIMIZE_LEVELS`, raises otherwise."""
    if not isinstance(optimize, str) or optimize not in OPTIMIZE_LEVELS:
        accepted = ", ".join(repr(level) for level in OPTIMIZE_LEVELS)
        raise ValueError(
            f"to_onnx(optimize={optimize!r}): expected one of {accepted} ('default': "
            "onnxscript's optimizer; 'ort': then onnxscript's fusions for onnxruntime)"
        )
    return optimize


def fuse_for_onnxruntime(model: ir.Model) -> dict[str, int]:
    """Applies :func:`onnxscript.rewriter.ort_fusions.optimize_for_ort` to ``model`` in
    place; returns the number of times each fusion applied (only those that did).

    The fused model uses onnxruntime's contrib operators (``com.microsoft`` domain, and
    ``SimplifiedLayerNormalization`` in the default domain): only onnxruntime runs it.
    onnxscript runs its whole optimizer again first, including the rules that
    :func:`optimize_model` leaves out for being quadratic in the graph's size.
    """
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    _, counts = optimize_for_ort(model)
    return {name: count for name, count in counts.items() if count}


__all__ = ["OPTIMIZE_LEVELS", "check_optimize_level", "fuse_for_onnxruntime", "optimize_model"]
