"""Which of onnxscript's fusions for onnxruntime ``optimize="ort"`` applies.

:func:`onnxscript.rewriter.ort_fusions.optimize_for_ort` applies all of them. One loses
on the models people export most: the **attention fusions** (``sdpa``, then
``com.microsoft.MultiHeadAttention`` and ``Attention``) of a decoder step that takes a
key-value cache. onnxruntime's ``MultiHeadAttention`` reads keys and values in its own
layout, so the step transposes the whole cache at every token, and for grouped-query
attention (fewer key-value heads than query heads) it receives the cache already
repeated per head. Measured on a Llama-style step (hidden 512, 4 layers, 8 heads, 4
key-value heads, 8 versions, onnxruntime 1.32 on one thread, median of 20 alternating
runs; ``python _scripts/bench_decode_latency.py --layers 4 --variants
yobx,yobx-ort,yobx-ort-attention`` measures it), the fused step took **1.25x the
default's time at batch 4 / past 512** (30.4 against 24.3 ms) and the same step without
the attention fusions 1.005x (24.4 ms), prefill and batch 1 / past 128 at parity
(0.99-1.01x). The other fusions (RMS and skip
normalizations, rotary embeddings, GELU, ``FusedMatMul``...) apply everywhere.
onnxruntime's ``GroupQueryAttention``, which takes the cache in the model's own layout
and unrepeated, is what a cached step needs; onnxscript's rule for it matches only
transformers' older causal-mask graph and derives positions from ``position_ids``
(inexact with a padded mask): :mod:`.gqa_fusion` writes it instead, exact with padded
masks.

:func:`fusions_for_ort` runs onnxscript's own sequence (the same rules in the same
order), leaving out the attention fusions when ``attention`` is False, with the
subgraphs reading their enclosing graphs' values through aliases of their own
(:func:`outer_values_aliased`): a model with versions computes most of its nodes in the
branches of ``If`` nodes, and onnxscript's matcher did not fuse a pattern there that
reads a weight of the main graph (the RMS and skip normalizations of a decoder step:
in a one-layer Llama step with 8 versions, 0 of its 24 RMS normalizations were fused,
all of them are, 16 with their residual ``Add``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import onnx_ir as ir
from onnx_ir.passes import common as common_passes

from yobx.torch.onnx.cache_names import LEGACY_ARGUMENT, PRESENT

#: an output of a key-value cache (``present.0.key``, ``present_1.0.decoder.value``)
_CACHE_OUTPUT = re.compile(rf"^{PRESENT}(_\d+)?\.")


def takes_a_cache(model: ir.Model) -> bool:
    """Whether ``model`` is a step with a key-value cache: inputs named
    ``past_key_values.*`` or outputs ``present.*`` (:mod:`.cache_names`)."""
    return any(value.name.startswith(f"{LEGACY_ARGUMENT}.") for value in model.graph.inputs) or any(
        _CACHE_OUTPUT.match(value.name or "") for value in model.graph.outputs
    )


_ALIAS = "yobx_outer_alias"


def graphs_within(graph: ir.Graph) -> Iterator[ir.Graph]:
    """``graph`` and the subgraphs of its nodes, at any depth, each before its own."""
    yield graph
    for node in graph:
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                yield from graphs_within(attribute.value)
            elif attribute.type == ir.AttributeType.GRAPHS:
                for subgraph in attribute.value:
                    yield from graphs_within(subgraph)


def _read_by_checks(value: ir.Value) -> bool:
    """A scalar constant (an epsilon, an exponent, an axis): the fusions read its
    value, which an alias would hide."""
    return value.const_value is not None and value.const_value.size <= 1


@contextlib.contextmanager
def outer_values_aliased(model: ir.Model) -> Iterator[int]:
    """Inside the block, every subgraph reads the values of its enclosing graphs that
    are not constants (weights, whose data the export keeps apart, and computed
    values) through an ``Identity`` of its own; after it, the subgraph reads them
    directly again. Yields how many aliases were made.

    The versions of a model are the branches of ``If`` nodes, and their weights
    belong to the main graph. onnxscript's pattern matcher refuses to bind a value of
    another graph to any pattern value but a plain variable ("Pattern matches crossing
    graph boundaries are not supported"): every fusion whose pattern reads a weight
    through an alternative (the scale of the RMS normalization, ``Cast(scale)`` or
    ``scale``) failed inside the versions, where most of a decoder step's nodes are.
    An alias is a value of the subgraph, which the matcher binds like any other.
    Scalar constants are left alone: the fusions read their values (an epsilon).
    """
    aliases: list[ir.Node] = []
    for graph in list(graphs_within(model.graph))[1:]:
        local: dict[ir.Value, ir.Value] = {}
        for node in list(graph):
            for index, value in enumerate(node.inputs):
                if value is None or value.graph is graph or _read_by_checks(value):
                    continue
                alias = local.get(value)
                if alias is None:
                    identity = ir.node("Identity", [value], name=f"{_ALIAS}_{len(aliases)}")
                    identity.outputs[0].name = f"{_ALIAS}_{len(aliases)}"
                    identity.outputs[0].dtype = value.dtype
                    identity.outputs[0].shape = value.shape
                    graph.insert_before(graph.node(0), identity)
                    aliases.append(identity)
                    alias = local[value] = identity.outputs[0]
                node.replace_input_with(index, alias)
    try:
        yield len(aliases)
    finally:
        for identity in aliases:
            graph = identity.graph
            if graph is None:
                continue
            identity.outputs[0].replace_all_uses_with(identity.inputs[0])
            graph.remove(identity, safe=True)


def fusions_for_ort(model: ir.Model, attention: bool = True) -> dict[str, int]:
    """Applies onnxscript's fusions for onnxruntime to ``model`` in place, as
    ``optimize_for_ort`` does, the attention fusions only when ``attention``; returns
    how many times each fusion applied (the left-out ones are not counted)."""
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    if attention:
        return optimize_for_ort(model)[1]
    from onnxscript.optimizer import optimize
    from onnxscript.rewriter import rewrite
    from onnxscript.rewriter.ort_fusions import (
        fused_matmul_rule_sets,
        instance_to_group_normalization,
        shape_optimization,
        softmax,
    )
    from onnxscript.rewriter.ort_fusions.bias_gelu import fuse_bias_gelu
    from onnxscript.rewriter.ort_fusions.cos_sin_cache import fuse_cos_sin_cache
    from onnxscript.rewriter.ort_fusions.erfgelu import fuse_erfgelu
    from onnxscript.rewriter.ort_fusions.gelu import fuse_gelu
    from onnxscript.rewriter.ort_fusions.rms_normalization import fuse_rms_normalization
    from onnxscript.rewriter.ort_fusions.rotary_embedding import (
        fuse_partial_rotary_embedding,
        fuse_rotary_embedding,
    )
    from onnxscript.rewriter.ort_fusions.skip_normalization import (
        fuse_skip_layer_normalization,
        fuse_skip_rms_normalization,
    )
    from onnxscript.rewriter.rules.common import _gemm_to_matmul_add

    # optimize_for_ort's steps (onnxscript 0.7), without the attention fusions
    rewrite(model, [_gemm_to_matmul_add.gemm_to_matmul_add_rule])
    common_passes.ShapeInferencePass()(model)
    optimize(model)
    shape_optimization.rules.apply_to_model(model)
    optimize(model)
    with outer_values_aliased(model):
        counts = {
            "erf_gelu": fuse_erfgelu(model),
            "rms_normalization": fuse_rms_normalization(model),
            "skip_layer_normalization": fuse_skip_layer_normalization(model),
            "skip_rms_normalization": fuse_skip_rms_normalization(model),
            "rotary_embedding": fuse_rotary_embedding(model),
            "cos_sin_cache": fuse_cos_sin_cache(model),
        }
        common_passes.CommonSubexpressionEliminationPass()(model)
        counts["partial_rotary_embedding"] = fuse_partial_rotary_embedding(model)
        counts["gelu"] = fuse_gelu(model)
        counts["bias_gelu"] = fuse_bias_gelu(model)
    # the functions of fused patterns nothing else consumed are inlined back
    optimize(model)
    rewrite(
        model,
        [
            *softmax.rules.rules,
            *instance_to_group_normalization.rules.rules,
            *fused_matmul_rule_sets.fused_matmul_rule_sets(),
        ],
    )
    ir.passes.Sequential(
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=False, size_limit=1),
        common_passes.RemoveInitializersFromInputsPass(),
        common_passes.ShapeInferencePass(),
    )(model)
    return counts


__all__ = ["fusions_for_ort", "graphs_within", "outer_values_aliased", "takes_a_cache"]
