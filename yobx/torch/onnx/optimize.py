"""The optimization of an exported model: onnxscript's optimizer, linear in its size.

:func:`optimize_model` runs the passes of ``onnxscript.optimizer.optimize_ir`` with its
default rewrite rules except those whose pattern has several output nodes: onnxscript
matches them by enumerating combinations of graph nodes, for every candidate node,
which is quadratic in the size of the graph (on a 7B Llama, 90% of a 46 s optimization
went to ``SlicesSplit``, which turns two ``Slice`` of a tensor into one ``Split``).

The caller keeps weights out of reach (:func:`yobx.torch.onnx.weights.weights_kept_apart`).
"""

from __future__ import annotations

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


__all__ = ["optimize_model"]
