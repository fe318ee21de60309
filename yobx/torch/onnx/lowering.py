"""Lowers a torch-level FX graph (our tracer's output) to an aten FX graph.

The whole graph is lowered in one :func:`make_fx` call on the fake values the tracer
stored in each placeholder's ``meta["val"]``, with torch.onnx's decomposition table
(decompose only what torch_lib does not implement). Nothing of the user's model runs
again: make_fx interprets our graph node by node. Parameters and buffers are lifted
into placeholders so that they become ONNX initializers named after their qualified
names, and every aten node producing the value of one of our nodes is tagged with
that node's name, so the ONNX value can carry it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import operator
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental import proxy_tensor
from torch.fx.experimental.symbolic_shapes import ShapeEnv, rebind_unbacked
from torch.nn.utils import stateless

from yobx.torch.fx_code import recompile_alone
from yobx.torch.onnx import _torch_onnx_internals as internals
from yobx.torch.onnx import custom_ops, direct_lowering, recorded_lowering
from yobx.torch.onnx.adaptive_pooling import adaptive_avg_pool2d, adaptive_max_pool2d
from yobx.torch.onnx.aten_fake_rules import aten_fake_rules
from yobx.torch.onnx.errors import OnnxExportError
from yobx.torch.onnx.inplace_copies import functional_copies
from yobx.torch.onnx.opsets import DEFAULT_OPSET
from yobx.torch.onnx.restrides import drop_restrides
from yobx.torch.onnx.symbolic_scalars import symbolic_scalars_as_tensors
from yobx.torch.onnx.version_lowering import record_cond
from yobx.torch.passes import writes_anything
from yobx.torch.tracing import shape_rules
from yobx.torch.tracing.constraints.decided_layouts import decided_layouts
from yobx.torch.tracing.constraints.versions import CONDITION_KEY, DIMENSIONS_KEY
from yobx.torch.tracing.graph_operators import CondCCOp, ScanCCOp
from yobx.torch.tracing.isolation.patching import patched_attributes
from yobx.torch.tracing.symbolic.static_fakes import StaticFakes
from yobx.torch.tracing.symbolic.symbolic import static_fake
from yobx.torch.tracing.symbolic.symbolic_kernels import symbolic_kernels
from yobx.torch.tracing.symbolic.symbolic_memo import memoized_symbolic_arithmetic
from yobx.torch.tracing.symbolic.symbolic_variants import function_variant

#: Meta key set on aten nodes: the name of the torch-level node whose value they produce.
SOURCE_NODE_KEY = "yobx_source_node"
#: Meta key set on aten nodes: the torch-level node being interpreted when they were made.
ORIGIN_NODE_KEY = "yobx_origin_node"


@dataclasses.dataclass
class LoweredGraph:
    """An aten graph ready to be translated.

    :param graph_module: aten graph module; its placeholders are the user inputs
        (``input_names``) followed by the lifted parameters and buffers
        (``state_names``)
    :param input_names: names of the user inputs, one per user placeholder holding a
        tensor or a symbolic scalar (Python constants are not inputs)
    :param state_names: qualified names of the lifted parameters and buffers
    :param state_values: the real tensors of those parameters and buffers
    :param fake_mode: the fake mode the graph was lowered in
    :param origins: aten node name -> torch-level node it was created for
    :param guards: the guards torch added while lowering (decisions taken from the
        example sizes), each with the torch-level node being lowered
    :param n_direct: how many torch-level nodes were written directly
        (:mod:`yobx.torch.onnx.direct_lowering`) instead of going through make_fx,
        in the versions' graphs too
    :param n_recorded: how many torch-level nodes were recorded outside make_fx
        (:mod:`yobx.torch.onnx.recorded_lowering`), in the versions' graphs too
    :param version_guards: the guards torch added while lowering a version's branch
        alone (in the version's own ShapeEnv, see :mod:`.version_lowering`), with the
        version's dimensions (the branch's ``meta[DIMENSIONS_KEY]``): a branch lists
        its own, the graph choosing between versions every branch's that has some;
        judged by :func:`~yobx.torch.onnx.version_guards.check_version_lowering_guards`
    """

    graph_module: torch.fx.GraphModule
    input_names: list[str]
    state_names: list[str]
    state_values: list[torch.Tensor]
    fake_mode: FakeTensorMode
    origins: dict[str, torch.fx.Node]
    guards: list[tuple[Any, torch.fx.Node]] = dataclasses.field(default_factory=list)
    n_direct: int = 0
    n_recorded: int = 0
    version_guards: list[tuple[Any, list[tuple[Any, torch.fx.Node]]]] = dataclasses.field(
        default_factory=list
    )


def _fake_mode_of(graph_module: torch.fx.GraphModule) -> FakeTensorMode:
    values = [node.meta.get("val") for node in graph_module.graph.nodes if node.op == "placeholder"]
    mode = detect_fake_mode(tuple(v for v in values if isinstance(v, torch.Tensor)))
    if mode is None:
        # A graph without tensor inputs: any fake mode does, shapes are static.
        mode = FakeTensorMode(shape_env=ShapeEnv())
    return mode


def _collect_state(
    graph_module: torch.fx.GraphModule,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Returns parameters, buffers and plain tensor attributes read by ``get_attr``,
    and the aliases (other names of tied weights -> the name lifted)."""
    state: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[int, str] = {}
    for name, tensor in [
        *graph_module.named_parameters(remove_duplicate=False),
        *graph_module.named_buffers(remove_duplicate=False),
    ]:
        # Tied weights are lifted once; the other names point to the same input.
        if id(tensor) in seen:
            aliases[name] = seen[id(tensor)]
            continue
        seen[id(tensor)] = name
        state[name] = tensor
    for node in graph_module.graph.nodes:
        if node.op != "get_attr" or node.target in state:
            continue
        value = operator.attrgetter(node.target)(graph_module)
        if isinstance(value, torch.Tensor) and id(value) not in seen:
            seen[id(value)] = node.target
            state[node.target] = value
    return state, aliases


def _distinct_slots(module: torch.nn.Module, names: list[str]) -> list[str]:
    """The names among ``names`` reaching distinct attributes: the first of several
    paths to the same attribute of the same module (the versions of a capture share
    the model's modules). Reparametrizing one attribute twice restores it wrongly: the
    second swap saves the first one's fake as the original, and puts it back."""
    seen: set[tuple[int, str]] = set()
    kept = []
    for name in names:
        owner, _, attribute = name.rpartition(".")
        slot = (id(module.get_submodule(owner) if owner else module), attribute)
        if slot not in seen:
            seen.add(slot)
            kept.append(name)
    return kept


class _LoweringInterpreter(torch.fx.Interpreter):
    """Interprets a torch-level graph inside make_fx and records provenance."""

    def __init__(
        self,
        module: torch.fx.GraphModule,
        origins: dict[str, torch.fx.Node],
        shape_env: Any,
        guards: list[tuple[Any, torch.fx.Node]],
        direct_mode: FakeTensorMode | None = None,
        branches: dict[int, LoweredGraph] | None = None,
        table: dict | None = None,
    ):
        super().__init__(module, garbage_collect_values=True)
        #: id(branch module) -> the branch lowered alone (versions of a capture)
        self.branches = branches or {}
        self.origins = origins
        self.shape_env = shape_env
        #: guards torch added while lowering, with the node being lowered
        self.guards = guards
        #: the fake mode of the capture's values, when common operators are written
        #: directly (:mod:`.direct_lowering`); None lowers everything through make_fx
        self.direct_mode = direct_mode
        #: how many nodes were written directly
        self.n_direct = 0
        #: the decompositions of make_fx, for the nodes recorded outside it
        #: (:mod:`.recorded_lowering`); None lowers them through make_fx
        self.table = table
        #: how many nodes were recorded outside make_fx
        self.n_recorded = 0
        #: YOBX_CHECK_SHAPE_RULES: each direct value is compared with torch's
        self.check = shape_rules.check_enabled()
        #: ids of the guards torch's kernels added for those comparisons: decisions of
        #: the check, not of the lowering (the graph is written by the rules)
        self._check_guards: set[int] = set()
        self._last: torch.fx.Node | None = None
        self._node: torch.fx.Node | None = None

    def _new_aten_nodes(self, tracer: Any) -> list[torch.fx.Node]:
        # make_fx only appends nodes: walk back from the end to the last node seen,
        # linear in the number of new nodes.
        graph = tracer.graph
        nodes = []
        node = graph._root.prev
        while node is not graph._root and node is not self._last:
            nodes.append(node)
            node = node.prev
        if nodes:
            self._last = nodes[0]
        return nodes[::-1]

    def run_node(self, node: torch.fx.Node) -> Any:
        mode = proxy_tensor.get_proxy_mode()
        tracer = mode.tracer if mode is not None else None
        if tracer is not None:
            self._new_aten_nodes(tracer)
        guards = self.shape_env.guards if self.shape_env is not None else []
        n_guards = len(guards)
        self._node = node
        try:
            result = super().run_node(node)
        except OnnxExportError:
            raise
        except Exception as exc:
            raise OnnxExportError(
                f"cannot lower to aten: {type(exc).__name__}: {str(exc).splitlines()[0]}",
                node,
            ) from exc
        # a decision torch took again from the example while lowering this node
        self.guards.extend(
            (guard, node) for guard in guards[n_guards:] if id(guard) not in self._check_guards
        )
        if node.meta.get("unbacked_bindings"):
            # the op made new symbols for its data-dependent sizes: they are the
            # capture's (``u0`` stays ``u0``, so the ONNX dimension keeps its name)
            rebind_unbacked(self.shape_env, node, result)
        if tracer is None:
            return result
        for aten_node in self._new_aten_nodes(tracer):
            self.origins[aten_node.name] = node
            aten_node.meta[ORIGIN_NODE_KEY] = node.name
        if node.op != "placeholder":
            for value in torch.utils._pytree.tree_leaves(result):
                if isinstance(value, torch.Tensor):
                    slot = proxy_tensor.get_proxy_slot(value, tracer, None)
                    if slot is not None and SOURCE_NODE_KEY not in slot.proxy.node.meta:
                        slot.proxy.node.meta[SOURCE_NODE_KEY] = node.name
                    # Only the first tensor of a multi-output node keeps the node's name.
                    break
        return result

    def _lower_directly(self, args: Any, kwargs: Any, module: Any = None) -> Any:
        """The node's aten call written directly with the capture's value, or
        NotImplemented (make_fx lowers it)."""
        if self.direct_mode is None:
            return NotImplemented
        value = direct_lowering.capture_value(self._node, self.direct_mode)
        if value is None:
            return NotImplemented
        same = direct_lowering.identity_value(self._node, args)
        if same is not None:
            self.n_direct += 1
            return same
        # a rule failing on an argument it did not foresee: make_fx lowers the node
        call = shape_rules.rule_or_torch(
            lambda: direct_lowering.aten_call(self._node, args, kwargs, module),
            lambda: None,
            self.check,
        )
        mode = proxy_tensor.get_proxy_mode()
        if call is None or mode is None or not direct_lowering.emit(mode.tracer, call, value):
            return NotImplemented
        if self.check:
            op, call_args, call_kwargs = call
            guards = self.shape_env.guards if self.shape_env is not None else []
            n_guards = len(guards)
            # outside make_fx's graph: comparing sizes is symbolic arithmetic too
            with proxy_tensor.disable_proxy_modes_tracing():
                expected = op(*call_args, **call_kwargs)
                direct_lowering.check_value(value, expected, str(op))
            self._check_guards.update(map(id, guards[n_guards:]))
        self.n_direct += 1
        return value

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        result = self._lower_directly(args, kwargs)
        if result is not NotImplemented:
            return result
        if isinstance(target, CondCCOp):
            pred, true_fn, false_fn, operands = args
            lowered = (self.branches.get(id(true_fn)), self.branches.get(id(false_fn)))
            if isinstance(pred, torch.SymBool) and None not in lowered:
                # versions of a capture, each lowered on its own example
                outer = self._node.meta[DIMENSIONS_KEY]
                condition = self._node.meta.get(CONDITION_KEY)
                return record_cond(
                    pred, (true_fn, false_fn), lowered, tuple(operands), outer, condition
                )
            return _lower_cond(*args, lowered=self._branch_interpreter)
        if isinstance(target, ScanCCOp):
            return _lower_scan(*args, lowered=self._branch_interpreter)
        # the tracer computed this node's value with the same symbolic variant
        # (math.sqrt of a dimension: torch._sym_sqrt, an ONNX Sqrt of the shape)
        variant = function_variant(target, args)
        result = self._lower_recorded(lambda: variant(*args, **kwargs))
        if result is not NotImplemented:
            return result
        return super().call_function(variant, args, kwargs)

    def _lower_recorded(self, run: Callable[[], Any]) -> Any:
        """The node's aten calls recorded outside make_fx and written into its graph
        (:mod:`.recorded_lowering`), or NotImplemented (make_fx lowers it)."""
        if self.direct_mode is None or self.table is None:
            return NotImplemented
        if direct_lowering.capture_value(self._node, self.direct_mode) is None:
            return NotImplemented
        mode = proxy_tensor.get_proxy_mode()
        if mode is None or not recorded_lowering.recordable(self._node):
            return NotImplemented
        recorded = recorded_lowering.record_calls(run, self.table, self.shape_env)
        if recorded is None:
            return NotImplemented
        result, calls = recorded
        if not recorded_lowering.emit_calls(mode.tracer, calls, result):
            return NotImplemented
        self.n_recorded += 1
        return result

    def _branch_interpreter(self, branch: torch.fx.GraphModule) -> _LoweringInterpreter:
        """The interpreter of a cond's branch: a nested cond in it (versions choosing
        inside a version) is lowered as this one; make_fx lowers every other node."""
        return _LoweringInterpreter(
            branch, self.origins, self.shape_env, self.guards, branches=self.branches
        )

    def call_method(self, target: Any, args: Any, kwargs: Any) -> Any:
        result = self._lower_directly(args, kwargs)
        if result is NotImplemented:
            self_obj, *rest = args
            result = self._lower_recorded(lambda: getattr(self_obj, target)(*rest, **kwargs))
        if result is not NotImplemented:
            return result
        return super().call_method(target, args, kwargs)

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        submodule = self.fetch_attr(target)
        result = self._lower_directly(args, kwargs, submodule)
        if result is not NotImplemented:
            return result
        replacement = custom_ops.leaf_module_call(submodule, args, kwargs)
        if replacement is not None:
            return replacement
        return super().call_module(target, args, kwargs)


def _branch_state(branch: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters, buffers and tensor attributes a cond branch reads."""
    state = dict(branch.named_parameters(remove_duplicate=False))
    state.update(branch.named_buffers(remove_duplicate=False))
    graph = getattr(branch, "graph", None)
    for node in graph.nodes if graph is not None else ():
        if node.op == "get_attr" and node.target not in state:
            value = operator.attrgetter(node.target)(branch)
            if isinstance(value, torch.Tensor):
                state[node.target] = value
    return state


def _with_state(
    branch: torch.nn.Module, n_operands: int, names: list[str], offset: int, lowered: Any
):
    distinct = set(_distinct_slots(branch, names))

    def function(*args):
        values = args[n_operands + offset : n_operands + offset + len(names)]
        state = {name: value for name, value in zip(names, values) if name in distinct}
        with stateless._reparametrize_module(branch, state, strict=False):
            if lowered is None or not isinstance(branch, torch.fx.GraphModule):
                outputs = branch(*args[:n_operands])
            else:
                outputs = lowered(branch).run(*args[:n_operands])
        # a size returned by the model (computed by one version, a constant in another)
        # is a 0-d tensor, as any number the ONNX model returns: cond returns tensors
        return pytree.tree_map_only(_NUMBERS, _number_as_tensor, outputs)

    return function


_NUMBERS = (int, float, torch.SymInt, torch.SymFloat)


def _number_as_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, bool):
        return torch.tensor(value)
    floating = isinstance(value, (float, torch.SymFloat))
    return torch.scalar_tensor(value, dtype=torch.float32 if floating else torch.int64)


def _lower_cond(pred: Any, true_fn: Any, false_fn: Any, operands: Any, lowered: Any = None) -> Any:
    """Lowers a cond with the operator itself, which make_fx records.

    ``torch.cond`` would compile its call with dynamo, whose cache outlives the
    export: a second export of a cond then specialised the shapes the first one saw.
    The branches' parameters and buffers become operands (what dynamo did): make_fx
    would otherwise bake the fake values the lowering gave them into the branches.
    ``lowered(branch)`` gives the interpreter running a branch: a cond nested in it
    must be lowered the same way (called as it is, it would compile with dynamo).
    """
    operands = tuple(operands)
    true_state, false_state = _branch_state(true_fn), _branch_state(false_fn)
    n = len(operands)
    lifted_true = _with_state(true_fn, n, list(true_state), 0, lowered)
    lifted_false = _with_state(false_fn, n, list(false_state), len(true_state), lowered)
    all_operands = operands + tuple(true_state.values()) + tuple(false_state.values())
    return torch.ops.higher_order.cond(pred, lifted_true, lifted_false, all_operands)


def _lower_scan(combine_fn: Any, init: Any, xs: Any, additional: Any, lowered: Any) -> Any:
    """Lowers a scan with the operator itself, the body's parameters and buffers passed
    as additional inputs (a loop's step calling a submodule): make_fx would otherwise
    bake the fake values the lowering gave them into the body, as for a cond."""
    state = _branch_state(combine_fn)
    n = len(init) + len(xs) + len(additional)
    body = _with_state(combine_fn, n, list(state), 0, lowered)
    return torch.ops.higher_order.scan(
        body, list(init), list(xs), list(additional) + list(state.values())
    )


def _detach_constants(graph_module: torch.fx.GraphModule) -> None:
    """Turns constants left in the aten graph into plain tensors, in meta["val"] too.

    A parameter reached in a way the lifting does not see (through a Python
    container, for instance) stays a constant; ONNX serialization needs a plain tensor.
    A tensor made from Python literals while lowering (``x[..., [-2], :]`` builds its
    index tensor) is fake: the fake mode kept its data in ``.constant``.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    for node in graph_module.graph.nodes:
        if node.op != "get_attr":
            continue
        value = operator.attrgetter(node.target)(graph_module)
        if isinstance(value, FakeTensor):
            if value.constant is None:
                raise OnnxExportError(
                    f"constant {node.target!r} of the lowered graph was computed on fake "
                    f"tensors and its values are unknown"
                )
            value = value.constant
        if not isinstance(value, torch.Tensor):
            continue
        plain = value.detach() if isinstance(value, torch.nn.Parameter) else value
        if plain is not operator.attrgetter(node.target)(graph_module):
            module_name, _, attribute = node.target.rpartition(".")
            owner = graph_module.get_submodule(module_name) if module_name else graph_module
            delattr(owner, attribute)
            setattr(owner, attribute, plain)
        # torch.onnx materializes constants from meta["val"]: it must hold the data
        if isinstance(node.meta.get("val"), (torch.nn.Parameter, FakeTensor)):
            node.meta["val"] = plain


def _remove_dead_scalar_nodes(graph_module: torch.fx.GraphModule) -> None:
    """Removes the size computations the removed assertions used, in every graph."""
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        changed = False
        for node in reversed(module.graph.nodes):
            if node.op == "call_function" and not node.users and _is_scalar_node(node):
                module.graph.erase_node(node)
                changed = True
        if changed:
            recompile_alone(module)


def _squeeze_only_unit_dimensions(graph_module: torch.fx.GraphModule) -> None:
    """``x.squeeze(d)`` on a dimension that is not 1 returns ``x`` in PyTorch, ONNX's
    ``Squeeze`` fails on it: such a squeeze becomes an alias. The fake value says
    which happened (torch decided from what the capture knows of the dimension)."""
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        changed = False
        for node in module.graph.nodes:
            if node.op != "call_function" or node.target is not torch.ops.aten.squeeze.dim:
                continue
            source, output = node.args[0].meta.get("val"), node.meta.get("val")
            if (
                isinstance(source, torch.Tensor)
                and isinstance(output, torch.Tensor)
                and source.dim() == output.dim()
            ):
                node.target = torch.ops.aten.alias.default
                node.args = (node.args[0],)
                node.kwargs = {}
                changed = True
        if changed:
            recompile_alone(module)


def _constant_output(value: int | float | bool) -> torch.Tensor:
    """A Python constant returned by the model (``x.shape[0] * 2`` on a static size)
    is an ONNX output too: a 0-d tensor of the matching type."""
    dtype = {bool: torch.bool, int: torch.int64, float: torch.float32}[type(value)]
    return torch.tensor(value, dtype=dtype)


def _is_scalar_node(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def _is_graph_input(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool))


def _state_fakes(fake_mode: FakeTensorMode, tensors: list[torch.Tensor]) -> list[Any]:
    """Static fakes of the lifted parameters and buffers, detached (meta weights compute
    as on the CPU). A plain tensor (contiguous, owning its storage, which no other one
    shares) gets its fake made directly, as the capture does
    (:class:`~yobx.torch.tracing.symbolic.static_fakes.StaticFakes`); the others go through
    torch's converter, which keeps shared storages shared."""
    detached = [t.detach() for t in tensors]
    direct = StaticFakes(fake_mode)
    direct.index(detached)
    fakes = [direct.get(t) for t in detached]
    return [static_fake(fake_mode, t) if f is None else f for t, f in zip(detached, fakes)]


def _enter_lowering_contexts(stack: contextlib.ExitStack, fake_mode: Any, opset: int) -> None:
    """What the lowering runs under, entered on ``stack``."""
    stack.enter_context(torch.no_grad())
    stack.enter_context(fake_mode)
    # Shapes of size 0 or 1 are not specialised while lowering: the tracer already
    # decided what the dimensions may be.
    stack.enter_context(torch.fx.experimental._config.patch(backed_size_oblivious=True))
    stack.enter_context(internals.preserve_translatable_composite_ops(opset))
    # the kernels the tracer used to keep sizes symbolic
    stack.enter_context(symbolic_kernels())
    # With symbolic shapes a cache hit rebuilds the output tensor (symbolic
    # storage, strides...), about the cost of computing it, plus hashing: on the
    # benchmarked models the cache made lowering 1.5 to 2 times slower.
    stack.enter_context(patched_attributes([(fake_mode, "cache_enabled", False)]))
    # ATen's size arithmetic (strides, numel, contiguity) repeats itself
    stack.enter_context(memoized_symbolic_arithmetic())
    stack.enter_context(decided_layouts())
    # fake values from the tracer's exact shape rules where they apply
    stack.enter_context(aten_fake_rules(fake_mode))
    # the aten graphs are read, not run: their Python code is generated when something
    # asks for it (make_fx and each pass after it regenerated it: a fifth of a lowering)
    stack.enter_context(_use_lazy_graph_module(True))


_VERSION_PREFIX = re.compile(r"^((version|choice)_\d+\.)+")


def _model_names(names: list[str]) -> list[str]:
    """The weights of a graph choosing between versions under the model's names
    (``version_1.embeddings.cls_token`` is ``embeddings.cls_token``), where no two
    become one (constants the versions made each keep their own)."""
    stripped = [_VERSION_PREFIX.sub("", name) for name in names]
    if len(set(stripped)) != len(stripped):
        counts = collections.Counter(stripped)
        return [s if counts[s] == 1 else n for n, s in zip(names, stripped)]
    return stripped


def _lower_versions(
    graph_module: torch.fx.GraphModule, opset: int, direct: bool, lowered: dict
) -> None:
    """Lowers alone every branch of the choices between versions in ``graph_module``
    (see :mod:`.version_lowering`), innermost first, into ``lowered`` (by id)."""
    for node in graph_module.graph.nodes:
        if not (node.op == "call_function" and isinstance(node.target, CondCCOp)):
            continue
        if DIMENSIONS_KEY not in node.meta:
            continue  # the model's own torch.cond
        for branch in node.args[1:3]:
            module = operator.attrgetter(branch.target)(graph_module)
            if id(module) not in lowered:
                low = lower_to_aten(module, opset, direct, _branches=lowered)
                # a branch's own decisions are judged with its version's knowledge
                low.version_guards.append((module.meta.get(DIMENSIONS_KEY), low.guards))
                lowered[id(module)] = low


def lower_to_aten(
    graph_module: torch.fx.GraphModule,
    opset: int = DEFAULT_OPSET,
    direct: bool = True,
    _branches: dict | None = None,
) -> LoweredGraph:
    """Lowers ``graph_module`` (torch-level, with ``meta["val"]``) to an aten graph.

    :param graph_module: the torch-level graph; placeholders need ``meta["val"]``
    :param opset: ONNX opset, selects which ops torch_lib implements (and so which
        ones are decomposed)
    :param direct: writes the aten nodes of common operators directly, with the values
        the capture computed (:mod:`yobx.torch.onnx.direct_lowering`), instead of
        running them through make_fx; the aten graph is the same
    :return: the lowered graph
    """
    branches = {} if _branches is None else _branches
    _lower_versions(graph_module, opset, direct, branches)
    fake_mode = _fake_mode_of(graph_module)
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    user_values = []
    for node in placeholders:
        if "val" not in node.meta:
            raise OnnxExportError("placeholder has no meta['val']", node)
        user_values.append(node.meta["val"])
    # Python scalars (alpha=2.0, flag=True) were baked in by the capture (a guard
    # records their value): they are constants of the aten graph, not inputs
    inputs = [i for i, value in enumerate(user_values) if _is_graph_input(value)]
    state, aliases = _collect_state(graph_module)
    state_names = list(state)
    fake_state = _state_fakes(fake_mode, list(state.values()))
    origins: dict[str, torch.fx.Node] = {}
    guards: list[tuple[Any, torch.fx.Node]] = []
    n_inputs = len(inputs)
    # a value shared with the capture must never be written into by the lowering
    direct_mode = fake_mode if direct and not writes_anything(graph_module.graph) else None
    # the versions lowered alone count at the top
    counts = dict.fromkeys(("direct", "recorded"), 0)
    if _branches is None:
        counts["direct"] = sum(low.n_direct for low in branches.values())
        counts["recorded"] = sum(low.n_recorded for low in branches.values())
    distinct = set(_distinct_slots(graph_module, [*state_names, *aliases]))

    def run(*flat: Any) -> Any:
        replacements = dict(zip(state_names, flat[n_inputs:]))
        for alias, name in aliases.items():
            replacements[alias] = replacements[name]
        replacements = {k: v for k, v in replacements.items() if k in distinct}
        values = list(user_values)
        for index, value in zip(inputs, flat[:n_inputs]):
            values[index] = value
        with stateless._reparametrize_module(graph_module, replacements, strict=False):
            interpreter = _LoweringInterpreter(
                graph_module, origins, fake_mode.shape_env, guards, direct_mode, branches, table
            )
            outputs = interpreter.run(*values, enable_io_processing=False)
            counts["direct"] += interpreter.n_direct
            counts["recorded"] += interpreter.n_recorded
        return pytree.tree_map_only((int, float, bool), _constant_output, outputs)

    table = {
        **internals.decomposition_table(opset),
        # torch's ask whether the input size is a multiple of the output's (see there)
        torch.ops.aten._adaptive_avg_pool2d.default: adaptive_avg_pool2d,
        torch.ops.aten.adaptive_max_pool2d.default: adaptive_max_pool2d,
    }
    # fake tensors remember data-dependent sizes (nonzero, item) per epoch: the
    # lowering computes them again and binds the new symbols to the capture's ones
    fake_mode.epoch += 1
    with contextlib.ExitStack() as stack:
        _enter_lowering_contexts(stack, fake_mode, opset)
        aten_gm = proxy_tensor.make_fx(
            run,
            decomposition_table=table,
            tracing_mode="real",
            _allow_non_fake_inputs=False,
        )(*[user_values[i] for i in inputs], *fake_state)
    _detach_constants(aten_gm)
    drop_restrides(aten_gm)
    functional_copies(aten_gm)
    internals.remove_assertion_nodes(aten_gm)
    _remove_dead_scalar_nodes(aten_gm)
    _squeeze_only_unit_dimensions(aten_gm)
    symbolic_scalars_as_tensors(aten_gm)
    return LoweredGraph(
        graph_module=aten_gm,
        input_names=[placeholders[i].name for i in inputs],
        # the model's names at the top (a branch's are paths its cond reads weights by)
        state_names=_model_names(state_names) if branches and _branches is None else state_names,
        state_values=[t.detach() for t in state.values()],
        fake_mode=fake_mode,
        origins=origins,
        guards=guards,
        n_direct=counts["direct"],
        n_recorded=counts["recorded"],
        version_guards=_guards_of_versions(branches) if _branches is None else [],
    )


def _guards_of_versions(branches: dict[int, LoweredGraph]) -> list:
    """The guards of every version's branch lowered alone, with the version's
    dimensions, for the branches that have some (:attr:`LoweredGraph.version_guards`)."""
    return [entry for low in branches.values() for entry in low.version_guards if entry[1]]
