"""The versions of a capture lowered one by one, then chosen by one ``cond``.

A version (:mod:`yobx.torch.tracing.constraints.versions`) was captured on inputs of its own sizes,
its decisions known: the vision transformer's version for square images adds a position
table of 17 rows to ``(h // 8) * (w // 8) + 1`` patches because ``(h // 8) * (w // 8)
== 16`` holds there. Lowered inside the joined graph's ``cond``, with the inputs of the
first capture (``h=32, w=48``), torch would check that addition against those sizes and
refuse it. Each version is therefore lowered alone, with its own example
(:func:`~yobx.torch.onnx.lowering.lower_to_aten` on its graph), and
:func:`record_cond` writes the ``cond`` choosing between the lowered graphs into the
joined graph's lowering: the operands are the joined graph's inputs and the weights
both versions read (stored once), the outputs' sizes are the versions' sizes written
with the joined graph's dimensions (a fresh size where the versions differ).
"""

from __future__ import annotations

import operator
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch._prims_common import make_contiguous_strides_for
from torch.fx.experimental import proxy_tensor
from torch.fx.experimental.sym_node import SymNode

from yobx.torch.fx_code import recompile_alone
from yobx.torch.tracing.constraints.versions import DIMENSIONS_KEY, in_dimensions
from yobx.torch.tracing.symbolic.static_fakes import meta_fake


def record_cond(
    pred: torch.SymBool,
    branches: tuple[torch.fx.GraphModule, torch.fx.GraphModule],
    lowered: tuple[Any, Any],
    operands: tuple,
    outer_dims: Any,
    condition: sympy.Basic | None = None,
) -> Any:
    """Records ``cond(pred, lowered[0], lowered[1], ...)`` in the active make_fx.

    :param pred: the choice, a symbolic boolean of the joined graph's sizes
    :param branches: the torch-level graphs of the two sides (their weights are read
        from them: the lowering replaced them with its tracked fake tensors)
    :param lowered: their :class:`~yobx.torch.onnx.lowering.LoweredGraph`
    :param operands: the cond's operands (the joined graph's inputs)
    :param outer_dims: the dimensions of the joined graph's capture
    :param condition: the choice's condition as the versions wrote it (see
        :data:`~yobx.torch.tracing.constraints.versions.CONDITION_KEY`), ``pred``'s by default
    :return: the cond's outputs, tracked by make_fx
    """
    mode = proxy_tensor.get_proxy_mode()
    states = [
        [operator.attrgetter(name)(branch) for name in low.state_names]
        for branch, low in zip(branches, lowered)
    ]
    n, n_true = len(operands), len(states[0])
    true_graph = _taking(lowered[0].graph_module, n + n_true, _fakes(states[1], lowered[0]))
    false_graph = _taking(lowered[1].graph_module, n, _fakes(states[0], lowered[1]))
    for graph_module, low, branch in zip((true_graph, false_graph), lowered, branches):
        _tensor_outputs(graph_module, low.fake_mode)
        # its sizes are symbols of its own capture's ShapeEnv: the ONNX translation
        # names them with that capture's names (yobx.torch.onnx.dimensions)
        dims = branch.meta.get(DIMENSIONS_KEY)
        if dims is not None:
            graph_module.meta[DIMENSIONS_KEY] = dims
    all_operands = (*operands, *states[0], *states[1])
    index = 0
    while hasattr(mode.tracer.root, f"true_graph_{index}"):
        index += 1
    mode.tracer.root.register_module(f"true_graph_{index}", true_graph)
    mode.tracer.root.register_module(f"false_graph_{index}", false_graph)
    cond = torch.ops.higher_order.cond
    args = (pred, true_graph, false_graph, all_operands)
    proxy_args = pytree.tree_map(mode.tracer.unwrap_proxy, args)
    out_proxy = mode.tracer.create_proxy("call_function", cond, proxy_args, {})
    shape_env = pred.node.shape_env
    condition = pred.node.expr if condition is None else condition
    # what each side pins: its version's sizes, and the choice's condition itself
    # (the side `past < 1` has an empty cache, whichever versions it holds)
    pinned = [
        {**_pinned_by(condition, outer_dims), **_pinned(branches[0], outer_dims)},
        {**_pinned_by(sympy.Not(condition), outer_dims), **_pinned(branches[1], outer_dims)},
    ]
    with proxy_tensor.disable_proxy_modes_tracing():
        outputs = [
            _merged_output(a, b, branches, outer_dims, shape_env, pinned)
            for a, b in zip(_output_values(true_graph), _output_values(false_graph))
        ]
    return proxy_tensor.track_tensor_tree(
        tuple(outputs), out_proxy, constant=None, tracer=mode.tracer
    )


def _taking(graph_module: torch.fx.GraphModule, at: int, values: list) -> torch.fx.GraphModule:
    """``graph_module`` with unused placeholders for ``values`` inserted at position
    ``at`` among its placeholders: a cond's branches take the same operands, the other
    side's weights too."""
    graph = graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for i, value in enumerate(values):
        if at < len(placeholders):
            with graph.inserting_before(placeholders[at]):
                node = graph.placeholder(f"unused_{i}")
        else:
            with graph.inserting_after(placeholders[-1]):
                node = graph.placeholder(f"unused_{i}")
            placeholders.append(node)
            at += 1
        node.meta["val"] = value
    recompile_alone(graph_module)
    return graph_module


def _tensor_outputs(graph_module: torch.fx.GraphModule, fake_mode: Any) -> None:
    """A size the version returns (``x.shape[1] * 2``) becomes a 0-d tensor, as every
    number an ONNX model returns: a cond's branches return tensors."""
    graph = graph_module.graph
    output = next(n for n in graph.nodes if n.op == "output")
    changed = False

    def as_tensor(arg: Any) -> Any:
        nonlocal changed
        value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if not isinstance(value, (torch.SymInt, torch.SymFloat)):
            return arg
        dtype = torch.int64 if isinstance(value, torch.SymInt) else torch.float32
        with graph.inserting_before(output):
            node = graph.call_function(
                torch.ops.aten.scalar_tensor.default, (arg,), {"dtype": dtype}
            )
        with proxy_tensor.disable_proxy_modes_tracing(), fake_mode:
            node.meta["val"] = torch.scalar_tensor(value, dtype=dtype)
        changed = True
        return node

    output.args = torch.fx.node.map_arg(output.args, as_tensor)
    if changed:
        recompile_alone(graph_module)


def _fakes(tensors: list, lowered: Any) -> list:
    """Fake tensors like ``tensors`` (weights, static sizes, contiguous) in the fake
    mode of the graph ``lowered``: a graph's values all belong to one mode. Made
    directly (:func:`~yobx.torch.tracing.symbolic.static_fakes.meta_fake`), for every
    weight of every version."""
    return [
        meta_fake(lowered.fake_mode, shape, make_contiguous_strides_for(shape), t.dtype, t.device)
        for t in tensors
        for shape in [tuple(map(int, t.shape))]
    ]


def _output_values(graph_module: torch.fx.GraphModule) -> list[Any]:
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    return [
        a.meta.get("val") if isinstance(a, torch.fx.Node) else a
        for a in pytree.tree_leaves(output.args[0])
    ]


def _merged_output(
    a: Any, b: Any, branches: tuple, outer_dims: Any, shape_env: Any, pinned: list[dict]
) -> Any:
    """A fake value of the joined graph for an output the versions give as ``a`` and
    ``b`` (each a fake value of its own capture); ``pinned``: the dimensions each side
    has at one size. A size both sides give alike, once those are put in (``past +
    seq`` and ``seq`` where ``past`` is 0), keeps its expression; any other is a fresh
    size."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise NotImplementedError("a cond between versions returns tensors")
    if a.dim() != b.dim() or a.dtype != b.dtype:
        raise NotImplementedError("the versions return outputs of other ranks or dtypes")
    sizes = []
    for size_a, size_b in zip(a.shape, b.shape):
        outer_a = _in_outer(size_a, branches[0], outer_dims)
        outer_b = _in_outer(size_b, branches[1], outer_dims)
        if outer_a is None or outer_b is None:
            sizes.append(shape_env.create_unbacked_symint())
        elif outer_a == outer_b or outer_a.xreplace(pinned[1]) == outer_b:
            # `past + seq` and, in the version of an empty cache (past = 0), `seq`
            sizes.append(_symint(outer_a, shape_env))
        elif outer_b.xreplace(pinned[0]) == outer_a:
            sizes.append(_symint(outer_b, shape_env))
        else:
            sizes.append(shape_env.create_unbacked_symint())
    fake_mode = outer_dims.fake_mode
    with fake_mode:
        return torch.empty(sizes, dtype=a.dtype, device=a.device)


def _in_outer(size: Any, branch: torch.fx.GraphModule, outer_dims: Any) -> sympy.Expr | None:
    """``size`` (of a version's capture) written with the joined graph's symbols."""
    if isinstance(size, int):
        return sympy.Integer(size)
    dims = branch.meta.get(DIMENSIONS_KEY)
    user = dims.user_expression(size) if dims is not None else None
    if user is None or any(s.name not in outer_dims.by_name for s in user.free_symbols):
        return None
    return in_dimensions(outer_dims, user)


def _pinned(branch: torch.fx.GraphModule, outer_dims: Any) -> dict[sympy.Expr, int]:
    """The joined graph's dimensions a version has at one size (its capture's range
    of it is a single value: ``past`` is 0 in the version of an empty cache), written
    with the joined graph's symbols; the version runs only for inputs of that size."""
    dims = branch.meta.get(DIMENSIONS_KEY)
    if dims is None or dims is outer_dims:
        return {}  # a choice between versions: nothing pinned for all of them
    pinned = {}
    for name, symint in dims.by_name.items():
        if name not in outer_dims.by_name:
            continue
        low, high = dims.range_of(sympy.sympify(symint.node.expr))
        if low == high:
            outer = in_dimensions(outer_dims, sympy.Symbol(name, integer=True))
            pinned[outer] = int(low)
    return pinned


def _pinned_by(condition: sympy.Basic, outer_dims: Any) -> dict[sympy.Expr, int]:
    """The dimension ``condition`` pins to one size, counting from the lowest size the
    graph accepts (0 for a dimension declared without ``min``): ``past < 1`` pins
    ``past`` to 0."""
    if not isinstance(condition, (sympy.Lt, sympy.Le, sympy.Eq)):
        return {}
    symbol, bound = condition.lhs, condition.rhs
    if not symbol.is_Symbol or not bound.is_Integer:
        return {}
    if isinstance(condition, sympy.Eq):
        return {symbol: int(bound)}
    low = 0 if symbol in outer_dims.default_min else outer_dims.range_of(symbol)[0]
    high = int(bound) - (1 if isinstance(condition, sympy.Lt) else 0)
    return {symbol: int(low)} if high == low else {}


def _symint(expr: sympy.Expr, shape_env: Any) -> Any:
    if expr.is_Integer:
        return int(expr)
    hint = int(shape_env.guarding_hint_or_throw(expr))
    return torch.SymInt(SymNode(expr, shape_env, int, hint=hint))
