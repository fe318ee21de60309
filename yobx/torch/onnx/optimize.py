"""The optimization of an exported model: onnxscript's optimizer, linear in its size.

:func:`optimize_model` runs the passes of ``onnxscript.optimizer.optimize_ir`` with its
default rewrite rules except those whose pattern has several output nodes: onnxscript
matches them by enumerating combinations of graph nodes, for every candidate node,
which is quadratic in the size of the graph (on a 7B Llama, 90% of a 46 s optimization
went to ``SlicesSplit``, which turns two ``Slice`` of a tensor into one ``Split``), and
with the no-op rules matching their constants exactly (:mod:`.exact_rules`: onnxscript's
removed the ``+ 1e-8`` of an RMS normalization).

:func:`fuse_for_onnxruntime` applies onnxscript's fusions for onnxruntime
(``to_onnx(optimize="ort")``): attention (not in a step with a key-value cache, see
:mod:`.ort_fusions`), RMS and skip normalizations, rotary embeddings, GELU,
``Transpose`` + ``MatMul``... become contrib operators that only onnxruntime runs.

The caller keeps weights out of reach (:func:`yobx.torch.onnx.weights.weights_kept_apart`).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnx_ir.passes import common as common_passes

from yobx.torch.onnx.branch_hoisting import hoist_out_of_branches
from yobx.torch.onnx.branch_merging import merge_if_branches
from yobx.torch.onnx.branch_sinking import sink_into_branches
from yobx.torch.onnx.empty_kernels import skip_empty_kernels
from yobx.torch.onnx.empty_reshapes import resolve_empty_reshapes
from yobx.torch.onnx.filler_slots import merge_filler_slots
from yobx.torch.onnx.folding import folding_pass
from yobx.torch.onnx.gqa_fusion import fuse_group_query_attention
from yobx.torch.onnx.if_trees import collapse_if_trees
from yobx.torch.onnx.ort_fusions import fusions_for_ort, takes_a_cache
from yobx.torch.onnx.reshape_rules import repair_zero_reshapes
from yobx.torch.onnx.zero_divisors import replace_zero_divisors


def _linear_rules() -> list:
    from onnxscript import rewriter

    from .exact_rules import exact_no_op_rules, tolerant_no_op_rules
    from .reshape_rules import replaced_reshape_rule

    tolerant = tolerant_no_op_rules()
    rules = []
    for rule in rewriter._DEFAULT_REWRITE_RULES:
        pattern = getattr(rule, "_target_pattern", None)
        if pattern is not None and not getattr(pattern, "has_single_output_node", True):
            continue
        if any(rule is other for other in tolerant):
            continue  # `x + 1e-8` is no `x + 0` (see .exact_rules)
        # no `[-1, 0]` shape under allowzero=1 (see .reshape_rules)
        rules.append(replaced_reshape_rule(rule))
    return [*rules, *exact_no_op_rules()]


def _root_operator(rule) -> tuple[str, str] | None:
    """``(domain, op_type)`` of the node a rule's pattern is anchored on, when fixed."""
    pattern = getattr(rule, "_target_pattern", None)
    if pattern is None or len(pattern.output_nodes) != 1:
        return None
    node = pattern.output_nodes[0]
    op, domain = getattr(node, "op", None), getattr(node, "domain", None)
    if not hasattr(op, "value") or (domain is not None and not hasattr(domain, "value")):
        return None
    return _normalized_domain(domain.value() if domain is not None else ""), op.value()


def _normalized_domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def _operators(model: ir.Model) -> set[tuple[str, str]]:
    """Every ``(domain, op_type)`` of the model, its subgraphs and functions."""
    graphs = [model.graph, *model.functions.values()]
    return {
        (_normalized_domain(node.domain), node.op_type)
        for graph in graphs
        for node in ir.traversal.RecursiveGraphIterator(graph)
    }


class _RulesByOperator:
    """onnxscript's rules, each tried only on the nodes of its root operator, in the
    order of the list: one call per node instead of one per rule and node.

    onnxscript's rewriter tries every rule on every node and applies the first that
    matches; most rules are anchored on one operator (a ``Conv``, a ``Reshape``), and
    the matcher's first check is the node's operator. On tiny-llm, 10 500 tries that
    failed there were four fifths of the rewriter's time; once each rule was checked
    for its operator before the call, the 50 000 calls left still were a tenth of an
    export's optimizer. The rules a node may match are listed once per operator.

    The rewriter reads the attributes of the rule that matched (``remove_nodes``,
    ``as_function``, ``name``) right after it matched: they are that rule's.
    """

    def __init__(self, rules: list[tuple[Any, tuple[str, str] | None]]) -> None:
        self._rules = rules
        self._by_operator: dict[tuple[str, str], list[Any]] = {}
        self._matched: Any = None

    def _rules_of(self, operator: tuple[str, str]) -> list[Any]:
        rules = self._by_operator.get(operator)
        if rules is None:
            rules = [rule for rule, root in self._rules if root is None or root == operator]
            self._by_operator[operator] = rules
        return rules

    def try_rewrite(self, model: ir.Model, graph_or_function: Any, node: ir.Node, **kwargs):
        operator = (_normalized_domain(node.domain), node.op_type)
        for rule in self._rules_of(operator):
            delta = rule.try_rewrite(model, graph_or_function, node, **kwargs)
            if delta is not None:
                self._matched = rule
                return delta
        return None

    def graph_pre_visitor(self) -> None:
        for rule, _ in self._rules:
            if rule.graph_pre_visitor:
                rule.graph_pre_visitor()

    def graph_post_visitor(self) -> None:
        for rule, _ in self._rules:
            if rule.graph_post_visitor:
                rule.graph_post_visitor()

    @property
    def remove_nodes(self) -> bool:
        # before any match, the rule set asks whether every rule removes what it
        # matched (else it removes unused nodes at the end)
        if self._matched is None:
            return all(rule.remove_nodes for rule, _ in self._rules)
        return self._matched.remove_nodes

    @property
    def as_function(self) -> bool:
        return self._matched.as_function

    @property
    def name(self) -> str | None:
        return self._matched.name


class _RewritePresentOperators(ir.passes.InPlacePass):
    """onnxscript's rewrite pass with the rules whose root operator is in the model,
    each tried on the nodes of that operator only (:class:`_RulesByOperator`).

    The rewriter tries every rule on every node; most rules are anchored on one operator
    type (a ``Conv``, a ``Reshape``) that a given model may not have at all. The set is
    computed again at each call, so that a later iteration sees the operators the
    rewrites introduced.
    """

    def __init__(self, rules: list) -> None:
        super().__init__()
        self.rules = [(rule, _root_operator(rule)) for rule in rules]

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        from onnxscript import rewriter

        present = _operators(model)
        rules = [(rule, root) for rule, root in self.rules if root is None or root in present]
        if not rules:
            return ir.passes.PassResult(model, modified=False)
        return rewriter.RewritePass([_RulesByOperator(rules)])(model)


def _identity_for_passed_inputs(model: ir.Model) -> None:
    """Gives each function output that is one of the function's inputs an ``Identity``
    of its own (a version returning a cache tensor it was given, unchanged).

    onnx_ir's ``InlinePass`` (1.1) inlines such a function into an ``If`` branch by
    making the caller's value the branch's output; when that value is already the
    output of another branch (nested versions), it raises "already an output of a
    different graph".
    """
    for function in model.functions.values():
        inputs = {id(value) for value in function.inputs}
        for index, output in enumerate(function.outputs):
            if id(output) in inputs:
                node = ir.node("Identity", inputs=[output])
                function.append(node)
                function.outputs[index] = node.outputs[0]


def optimize_model(model: ir.Model, num_iterations: int = 2) -> None:
    """Optimizes ``model`` in place: inlining, constant folding, rewrite rules, dead
    code, constants lifted to initializers, common subexpressions, names."""
    from onnxscript.optimizer import _constant_folding

    _identity_for_passed_inputs(model)
    _boolean_wheres_as_logic(model)
    passes = [
        common_passes.InlinePass(),
        ir.passes.PassManager(
            [
                folding_pass(
                    shape_inference=True,
                    input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
                    output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
                    should_fold=lambda node: None,
                ),
                _RewritePresentOperators(_linear_rules()),
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
    # a remainder by a constant 0 (a version at size 0) would stop onnxruntime loading it
    replace_zero_divisors(model)
    resolve_empty_reshapes(model)


#: rounds of :func:`merge_branches` (a round merges what the previous one made alike)
_MERGE_ROUNDS = 4


def merge_branches(model: ir.Model) -> int:
    """Merges the branches of every ``If`` (:mod:`.branch_merging`), makes the outputs
    never needed on the same side one (:mod:`.filler_slots`) and merges again while that
    changes something, then removes what became unused and what the enclosing graphs
    now compute twice; returns how many nodes run once instead of once in each branch.

    Run it after the optimizer (branches as simple as they get align best) and after
    onnxruntime's fusions (their patterns span what the merge splits between the
    main graph and smaller ``If`` nodes)."""
    merged = slots = 0
    for _ in range(_MERGE_ROUNDS):
        merged += merge_if_branches(model)
        # outputs never needed on the same side become one: the stretches reading
        # them may now read the same value on both sides and merge in the next round
        removed = merge_filler_slots(model)
        slots += removed
        if not removed:
            break
    if merged or slots:
        shapes = [value.shape for value in model.graph.outputs]
        ir.passes.Sequential(
            common_passes.RemoveUnusedNodesPass(),
            common_passes.CommonSubexpressionEliminationPass(),
            common_passes.OutputFixPass(),
            common_passes.NameFixPass(),
        )(model)
        for value, shape in zip(model.graph.outputs, shapes):
            # a model output the elimination replaced by an equal value (two layers
            # computing the same) keeps its shape: the checker requires one
            if value.shape is None:
                value.shape = shape
    return merged


def collapse_branch_trees(model: ir.Model) -> int:
    """Runs each tree of nested ``If`` nodes as one ``If`` choosing between its distinct
    leaves (:mod:`.if_trees`), after :func:`merge_branches`; returns how many trees."""
    collapsed = collapse_if_trees(model)
    if collapsed:
        ir.passes.Sequential(
            common_passes.RemoveUnusedNodesPass(),
            common_passes.OutputFixPass(),
            common_passes.NameFixPass(),
        )(model)
    return collapsed


def hoist_branch_twins(model: ir.Model) -> int:
    """Computes once, before an ``If``, each node both of its sides compute alike
    (:mod:`.branch_hoisting`), then once for the whole graph what several ``If`` nodes
    computed alike (the same preparation in every layer); returns how many nodes left
    an ``If``."""
    hoisted = hoist_out_of_branches(model)
    if hoisted:
        ir.passes.Sequential(
            common_passes.CommonSubexpressionEliminationPass(),
            common_passes.RemoveUnusedNodesPass(),
            # nodes from two subgraphs may share a name, which a graph may not
            common_passes.NameFixPass(),
        )(model)
    return hoisted


def arrange_branches(model: ir.Model) -> dict[str, int]:
    """What the choices between versions need to run fast: :func:`merge_branches`,
    :func:`collapse_branch_trees`, :func:`hoist_branch_twins`, then each node that only
    one side of an ``If`` reads moved into that side (:mod:`.branch_sinking`), and the
    kernels onnxruntime cannot run on the empty tensors of a version skipped
    (:mod:`.empty_kernels`: after the merges, which pair those nodes with the other
    side's); returns how many nodes or trees each step changed (``nodes_merged``,
    ``if_trees_collapsed``, ``nodes_hoisted``, ``nodes_sunk``, ``empty_kernels_skipped``)."""
    merged = merge_branches(model)
    collapsed = collapse_branch_trees(model)
    hoisted = hoist_branch_twins(model)
    return {
        "nodes_merged": merged,
        "if_trees_collapsed": collapsed,
        "nodes_hoisted": hoisted,
        "nodes_sunk": sink_into_branches(model),
        "empty_kernels_skipped": skip_empty_kernels(model),
    }


def _boolean_wheres_as_logic(model: ir.Model) -> int:
    """Replaces each ``Where`` choosing between booleans (``mask.masked_fill(m, False)``)
    by ``Or(And(c, a), And(Not(c), b))``; returns how many.

    ONNX allows booleans in ``Where``, but onnxruntime's CPU provider has no kernel for
    them ("Could not find an implementation for Where(16)"): the model did not load.
    The logic broadcasts its three inputs as ``Where`` does.
    """
    count = 0
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if node.op_type != "Where" or _normalized_domain(node.domain) != "":
            continue
        condition, a, b = node.inputs
        if ir.DataType.BOOL not in (a.dtype, b.dtype):
            continue
        output = node.outputs[0]
        name = output.name
        # named after the output: in a subgraph no name authority names new values
        chosen = ir.node("And", [condition, a], name=f"{node.name}_then")
        negated = ir.node("Not", [condition], name=f"{node.name}_not")
        other = ir.node("And", [negated.outputs[0], b], name=f"{node.name}_else")
        merged = ir.node("Or", [chosen.outputs[0], other.outputs[0]], name=f"{node.name}_or")
        for suffix, new in (("then", chosen), ("not", negated), ("else", other)):
            new.outputs[0].name = f"{name}_{suffix}"
            new.outputs[0].dtype = ir.DataType.BOOL
        output.name = None
        merged.outputs[0].name, merged.outputs[0].shape = name, output.shape
        merged.outputs[0].dtype = ir.DataType.BOOL
        node.graph.insert_after(node, [chosen, negated, other, merged])
        output.replace_all_uses_with(merged.outputs[0], replace_graph_outputs=True)
        node.graph.remove(node, safe=True)
        count += 1
    return count


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
    A step with a key-value cache gets every fusion but attention, which makes it
    slower in onnxruntime (:mod:`.ort_fusions`).

    The fused model uses onnxruntime's contrib operators (``com.microsoft`` domain, and
    ``SimplifiedLayerNormalization`` in the default domain): only onnxruntime runs it.
    onnxscript runs its whole optimizer again first, including the rules that
    :func:`optimize_model` leaves out for being quadratic in the graph's size. Plain
    ``Gemm`` nodes become ``MatMul`` + ``Add`` before (counted as
    ``gemm_to_matmul_add``), and the shapes of intermediate values are cleared after:
    the fusions may drop a ``Reshape`` and leave stale shapes behind.
    ``SkipLayerNormalization`` nodes become ``Add`` + ``LayerNormalization`` again
    (counted as ``skip_layer_normalization_split``): onnxruntime's CPU kernel is several
    times slower than the two (:func:`_split_skip_layer_normalizations`).
    """
    # before the fusions: they may drop the Reshape feeding a Gemm (GPT2's Conv1D,
    # onnxscript 0.7.2), which onnxruntime then refuses to load (Gemm is 2-d only);
    # MatMul broadcasts, and onnxruntime fuses MatMul + Add into Gemm itself
    unfused = _gemms_to_matmul(model)
    _share_opsets_with_subgraphs(model)
    # a step with a cache gets no attention fusion: it loses there (see .ort_fusions)
    cached = takes_a_cache(model)
    counts = fusions_for_ort(model, attention=not cached)
    if cached:
        # what a step with a cache gets instead, for one new token (see .gqa_fusion)
        counts["group_query_attention"] = fuse_group_query_attention(model)
    split = _split_skip_layer_normalizations(model)
    # onnxscript's optimizer, which the fusions run, writes `[-1, 0]` reshapes
    # onnxruntime refuses to load (see .reshape_rules); mended while shapes are known
    repaired = repair_zero_reshapes(model)
    # the fusions leave stale shapes on values whose producer they changed (a Reshape
    # dropped: 2-d on a 3-d value); onnxruntime infers the intermediate ones itself
    boundary = {*model.graph.inputs, *model.graph.outputs}
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for value in node.outputs:
            if value not in boundary:
                value.shape = None
    fusions = {name: count for name, count in counts.items() if count}
    if unfused:
        fusions["gemm_to_matmul_add"] = unfused
    if split:
        fusions["skip_layer_normalization_split"] = split
    if repaired:
        fusions["zero_reshape_repaired"] = repaired
    return fusions


def _share_opsets_with_subgraphs(model: ir.Model) -> None:
    """Gives the subgraphs (the branches of an ``If`` choosing between versions) the
    model's opset imports.

    onnxscript's fusions write the function of a fused pattern with the opsets of the
    graph they fuse in; a subgraph has none of its own (ONNX keeps them on the model),
    (or the default domain at version 1, which an earlier rewrite wrote there), and
    the function then imports it at version 1, which the inliner refuses ("Opset
    mismatch when inlining function ...RotaryEmbedding"): the fusions failed on every
    model with versions, which then fell back to the example's side.
    """
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for attribute in node.attributes.values():
            graphs = []
            if attribute.type == ir.AttributeType.GRAPH:
                graphs = [attribute.as_graph()]
            elif attribute.type == ir.AttributeType.GRAPHS:
                graphs = list(attribute.as_graphs())
            for graph in graphs:
                # the model's versions, whatever an earlier rewrite wrote there (onnx
                # ignores a subgraph's own: a default domain at 1 is never meant)
                graph.opset_imports.update(model.opset_imports)


def _split_skip_layer_normalizations(model: ir.Model) -> int:
    """Replaces every ``com.microsoft`` ``SkipLayerNormalization`` whose mean and
    inverse standard deviation nothing reads by ``Add`` (``+ bias``) and
    ``LayerNormalization``; returns how many.

    onnxruntime's CPU kernel (1.32, float) is 3 to 7 times slower than ``Add`` +
    ``LayerNormalization`` from ``[2, 128, 512]`` to ``[4, 512, 4096]``
    (``_scripts/bench_skip_layer_norm.py``): onnxscript's ``skip_layer_normalization``
    fusion made GPT2- and ViT-shaped models slower than without ``optimize="ort"``
    (``_scripts/bench_ort_latency.py``). onnxruntime does not fuse the two back when it
    loads the model (the sum is read by the next residual ``Add``).
    ``SkipSimplifiedLayerNormalization`` (RMS, Llama) is left as it is.
    """
    replaced = 0
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if node.op_type != "SkipLayerNormalization" or node.domain != "com.microsoft":
            continue
        outputs = [*node.outputs, None, None, None][:4]
        if any(v is not None and (v.uses() or v.is_graph_output()) for v in outputs[1:3]):
            continue
        x, skip, gamma, beta, bias = [*node.inputs, None, None, None][:5]
        new_nodes = [ir.node("Add", [x, skip])]
        if bias is not None:
            new_nodes.append(ir.node("Add", [new_nodes[-1].outputs[0], bias]))
        total = new_nodes[-1].outputs[0]
        epsilon = _attribute(node, "epsilon", 1e-12)  # onnxruntime's default
        new_nodes.append(
            ir.node(
                "LayerNormalization",
                [total, gamma] + ([beta] if beta is not None else []),
                {"axis": -1, "epsilon": float(epsilon), "stash_type": 1},
            )
        )
        old, new = [outputs[0]], [new_nodes[-1].outputs[0]]
        if outputs[3] is not None:
            old.append(outputs[3])
            new.append(total)
        for before, after in zip(old, new):
            after.shape, after.type = before.shape, before.type
        ir.convenience.replace_nodes_and_values(node.graph, node, [node], new_nodes, old, new)
        replaced += 1
    return replaced


def _attribute(node: ir.Node, name: str, default: Any) -> Any:
    attribute = node.attributes.get(name)
    return default if attribute is None else attribute.value


def _gemms_to_matmul(model: ir.Model) -> int:
    """Replaces every plain ``Gemm`` (``alpha = beta = 1``, ``A`` not transposed) by
    ``MatMul`` (``B`` transposed first when ``transB``) and ``Add``; returns how many."""
    replaced = 0
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if node.op_type != "Gemm" or _normalized_domain(node.domain) != "":
            continue
        alpha, beta = _attribute(node, "alpha", 1.0), _attribute(node, "beta", 1.0)
        if alpha != 1.0 or beta != 1.0 or _attribute(node, "transA", 0):
            continue
        new_nodes = []
        a, b = node.inputs[0], node.inputs[1]
        if _attribute(node, "transB", 0):
            new_nodes.append(ir.node("Transpose", [b], {"perm": [1, 0]}))
            b = new_nodes[-1].outputs[0]
        new_nodes.append(ir.node("MatMul", [a, b]))
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            new_nodes.append(ir.node("Add", [new_nodes[-1].outputs[0], node.inputs[2]]))
        old, new = node.outputs[0], new_nodes[-1].outputs[0]
        new.shape, new.type = old.shape, old.type
        ir.convenience.replace_nodes_and_values(node.graph, node, [node], new_nodes, [old], [new])
        replaced += 1
    return replaced


__all__ = ["OPTIMIZE_LEVELS", "check_optimize_level", "fuse_for_onnxruntime", "optimize_model"]
