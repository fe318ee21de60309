"""CustomTracer: a torch.fx tracer whose proxies know real tensor metadata."""

from __future__ import annotations

import builtins
import collections
import contextlib
import math
import operator
from collections.abc import Callable, Iterator
from typing import Any

import sympy
import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.fx.experimental.symbolic_shapes import (
    GuardOnDataDependentSymNode,
    PendingUnbackedSymbolNotFound,
    compute_unbacked_bindings,
)
from torch.fx.graph import _PyTreeInfo
from torch.fx.node import Node, map_arg
from torch.fx.proxy import Proxy, TraceError
from torch.utils._sympy.functions import FloorDiv, Mod

from ..node_text import operation_name
from ..ops.rnn import leaf_module_call
from . import shape_rules
from .codegen import CheckedCodeGen, CheckedPyTreeCodeGen
from .constraints import Constraint
from .decisions import NOT_CONSTANT, DecisionsMixin, constant_value
from .errors import TracingError
from .fx_isolation import fx_tracing_per_thread
from .inputs import (
    NO_EXAMPLE,
    FlatInputs,
    bind_example_inputs,
    flatten_example_inputs,
    register_cache_flattening,
)
from .module_state import assign_traced_buffer, buffer_assignments, preserved_modules
from .patch_window import PatchWindow, close_window, current_window
from .patches import (
    TENSOR_FACTORIES,
    patch_len_in,
    replace_problematic_function_before_tracing,
    symbolic_kernels,
)
from .proxies import (
    CustomParameterProxy,
    CustomProxy,
    CustomProxyShape,
    proxy_class_for,
)
from .refinement import Refinements
from .runtime_checks import RuntimeCheck, declared_checks, insert_runtime_checks
from .symbolic import Guard, SymbolicDimensions
from .symbolic_memo import memoized_symbolic_arithmetic
from .symbolic_variants import function_variant

# Nodes computing shapes and scalars have no side effect: removed when unused.
_PURE_SCALAR_FUNCTIONS = frozenset(
    {
        operator.add,
        operator.sub,
        operator.mul,
        operator.floordiv,
        operator.truediv,
        operator.mod,
        operator.pow,
        operator.neg,
        operator.eq,
        operator.ne,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
        operator.getitem,
        operator.and_,
        operator.or_,
        operator.not_,
        getattr,
        torch.sym_max,
        torch.sym_min,
        torch.sym_not,
        torch.sym_float,
        torch.sym_int,
    }
)
_PURE_METHODS = frozenset({"size", "dim", "numel", "stride"})

#: prefix of the constants the tracer stores on ``traced_model``
CONSTANT_PREFIX = "_yobx_constant"
_CONVOLUTIONS = frozenset(
    getattr(torch.nn.functional, name)
    for name in (
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
    )
)
_PYTHON_TYPES_AS_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool}
_ORIGINAL_ISINSTANCE = builtins.isinstance

# how a scalar node's value is built from its operands' expressions
_SYMPY_OPERATIONS = {
    operator.eq: sympy.Eq,
    operator.ne: sympy.Ne,
    operator.lt: sympy.Lt,
    operator.le: sympy.Le,
    operator.gt: sympy.Gt,
    operator.ge: sympy.Ge,
    operator.add: operator.add,
    operator.sub: operator.sub,
    operator.mul: operator.mul,
    operator.neg: operator.neg,
    operator.floordiv: FloorDiv,
    operator.mod: Mod,
    torch.sym_max: sympy.Max,
    torch.sym_min: sympy.Min,
    builtins.max: sympy.Max,
    builtins.min: sympy.Min,
}

_COMPARISONS = {
    operator.eq: "==",
    operator.ne: "!=",
    operator.lt: "<",
    operator.le: "<=",
    operator.gt: ">",
    operator.ge: ">=",
}


def _has_symbol(args: Any) -> bool:
    return any(
        isinstance(a, Node)
        and isinstance(a.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))
        for a in args
    )


class CustomTracer(DecisionsMixin, torch.fx.Tracer):
    """A symbolic tracer whose proxies carry fake tensors with symbolic dimensions.

    Each traced operation also runs on fake values, so every node gets ``meta["val"]``
    and shape-dependent Python code (``if x.shape[0] == 0``, ``len(x)``, loops over a
    shape, item assignment...) traces as it runs, while dynamic dimensions stay
    symbolic. Comparisons of dynamic dimensions are decided only when provable; the
    assumptions used are listed in :attr:`guards`.

    :param autowrap_modules: modules whose functions are recorded as ``call_function``
        when they receive a proxy (``math`` by default)
    :param autowrap_functions: functions recorded the same way when referenced as
        globals of the traced code (tensor factories by default)
    :param param_shapes_constant: kept for compatibility with ``torch.fx.Tracer``;
        parameter shapes are always static here
    :param module_leaves: maps a module type to ``f(module, qualified_name) -> bool``
        deciding whether an instance stays a leaf (a ``call_module`` node)
    :param specialize_undecidable: adopt facts from the example for every dimension,
        named ``torch.export.Dim`` included, and let any dimension become static (as if
        every dimension were declared ``Dim.AUTO``); by default string names and
        ``Dim.DYNAMIC`` adopt facts as constraints, ``Dim.AUTO`` may also become
        static, and a named ``Dim`` adopts nothing (see :mod:`.refinement`)
    :param runtime_checks: the traced graph checks, when it runs, that its inputs
        satisfy the declared ranges and every adopted constraint
        (:class:`~yobx.torch.tracing.ConstraintViolationError` otherwise)
    """

    #: raise a named Dim's needed constraint where it is needed (see :mod:`.refinement`)
    _strict_at_once = False

    #: the module the traced graph belongs to (``GraphModule(tracer.traced_model, g)``)
    traced_model: torch.nn.Module | None
    #: assumptions the traced graph relies on (last trace)
    guards: list[Guard]

    def __init__(
        self,
        autowrap_modules: tuple = (math,),
        autowrap_functions: tuple[Callable, ...] | None = None,
        param_shapes_constant: bool = False,
        module_leaves: dict[type, Callable[[torch.nn.Module, str], bool]] | None = None,
        specialize_undecidable: bool = False,
        runtime_checks: bool = True,
    ):
        super().__init__(
            autowrap_modules=autowrap_modules,
            autowrap_functions=tuple(
                TENSOR_FACTORIES if autowrap_functions is None else autowrap_functions
            ),
            param_shapes_constant=param_shapes_constant,
        )
        self.module_leaves = dict(module_leaves or {})
        self.specialize_undecidable = specialize_undecidable
        self.runtime_checks = runtime_checks
        self.proxy_buffer_attributes = True
        #: the symbolic dimensions of the last trace (None before any)
        self.dims: SymbolicDimensions | None = None
        self.refinements: Refinements | None = None
        self.shape_rules: shape_rules.ShapeRules | None = None
        self._check_shape_rules = False
        self._clear()

    def _clear(self) -> None:
        """The state of one trace, empty: also what a tracer used by hand (nodes and
        proxies built outside :meth:`trace`) works with."""
        #: the module the traced graph belongs to (``GraphModule(tracer.traced_model, g)``)
        self.traced_model: torch.nn.Module | None = None
        #: assumptions the traced graph relies on
        self.guards: list[Guard] = []
        self._constants: dict[str, torch.Tensor] = {}
        self._constant_nodes: dict[int, Node] = {}
        self._subgraphs: dict[str, torch.fx.Graph | torch.nn.Module] = {}
        self._shape_cache: dict[Node, Any] = {}
        self._lift_stack: list[dict[Node, Node]] = []
        self._tensor_names: dict[int, str] = {}
        self._inputs: FlatInputs | None = None
        self._out_spec = None
        self._structured = False
        self._in_fake = 0
        self._allowed_guards = 0
        # torch.fx's bookkeeping of the modules being traced; a trace that raised
        # leaves entries behind, and a tracer may be used again.
        self.module_stack = collections.OrderedDict()
        self.num_calls = {}

    # public state

    @property
    def fake_mode(self):
        """The FakeTensorMode of the last trace."""
        return None if self.dims is None else self.dims.fake_mode

    @property
    def shape_env(self):
        """The ShapeEnv of the last trace."""
        return None if self.dims is None else self.dims.shape_env

    @property
    def constraints(self) -> list[Constraint]:
        """Facts on dynamic dimensions adopted from the example inputs (last trace)."""
        return [] if self.refinements is None else self.refinements.constraints

    @property
    def range_constraints(self) -> dict[str, tuple[int | float, int | float]]:
        """The range of every named dimension, ``math.inf`` when unbounded (last trace)."""
        if self.dims is None:
            return {}
        return {
            name: self.dims.range_of(symint.node.expr) for name, symint in self.dims.by_name.items()
        }

    @property
    def dimension_names(self) -> dict[str, str]:
        """Maps ShapeEnv symbol names (``s26``) to the user's names (``batch``)."""
        return {} if self.dims is None else dict(self.dims.names)

    # tracing

    def trace(  # type: ignore[override]
        self,
        root: torch.nn.Module | Callable[..., Any],
        concrete_args: dict[str, Any] | None = None,
        remove_inplace: bool = True,
        update_model_with_callable: bool = True,
        dynamic_shapes: Any = None,
        verbose: int = 0,
    ) -> torch.fx.Graph:
        """Traces ``root``, with example inputs when given, and returns the graph.

        :param root: a ``torch.nn.Module`` or a callable
        :param concrete_args: example input per parameter name (optional); tensor
            inputs stay placeholders (they are examples, not constants) whose nodes
            carry fake values with symbolic dimensions; Python constants (None, ints,
            bools, strings, lists of them) are baked in and checked when the graph
            runs; lists, tuples and dicts keep their structure. A parameter without an
            example becomes a placeholder without metadata, as in
            ``torch.fx.symbolic_trace``: everything that needs no decision on its values
            or shapes traces, and the first decision that does raises a
            :class:`~torch.fx.proxy.TraceError` naming the line and the example to pass
        :param remove_inplace: make the graph functional with
            :func:`yobx.torch.passes.remove_inplace` (when available)
        :param update_model_with_callable: when ``root`` is a plain callable, wrap it
            into a module stored in :attr:`traced_model`; with False, :attr:`traced_model`
            stays None for callables
        :param dynamic_shapes: torch.export's format: per parameter (dict by name or
            tuple), ``{axis: torch.export.Dim(...) or "name"}``, nested like the inputs
        :param verbose: verbosity
        :return: the graph; run it with ``torch.fx.GraphModule(tracer.traced_model, graph)``
        :raises TraceError: when the code cannot be traced soundly (the message names
            the user's file and line)

        Traces in several threads run one after the other. While a trace runs, the
        functions it replaces answer as usual in every other thread, and after it (also
        after an error or a ``KeyboardInterrupt``) no patch, fake mode or proxy mode
        is left installed.

        Example (a slice by half the dynamic batch, checked at another size)::

            >>> import torch
            >>> from yobx.torch.tracing import CustomTracer
            >>> class Half(torch.nn.Module):
            ...     def forward(self, x):
            ...         return x[: x.shape[0] // 2] * 2
            >>> tracer = CustomTracer()
            >>> graph = tracer.trace(
            ...     Half(),
            ...     concrete_args={"x": torch.randn(6, 3)},
            ...     dynamic_shapes={"x": {0: "batch"}},
            ... )
            >>> gm = torch.fx.GraphModule(tracer.traced_model, graph)
            >>> gm(torch.ones(4, 3)).shape
            torch.Size([2, 3])
        """
        if not isinstance(root, torch.nn.Module) and not callable(root):
            raise TypeError(
                f"CustomTracer.trace expects a torch.nn.Module or a callable, got "
                f"{type(root).__name__}; wrap the computation in a module or a function"
            )
        # One trace at a time in the process; its patches hold for this thread only, and
        # everything is restored in this frame's `finally`, which no interrupt can skip:
        # an interrupt landing in the restoration makes it run again (see patch_window).
        window = PatchWindow()
        error = None
        try:
            window.open()
            return self._trace(
                root,
                concrete_args,
                dynamic_shapes,
                remove_inplace=remove_inplace,
                update_model_with_callable=update_model_with_callable,
                verbose=verbose,
            )
        except BaseException as e:
            error = e
            raise
        finally:
            interrupt = None
            while window.locked:
                try:
                    close_window(window, error)
                except BaseException as e:
                    interrupt = e
            if interrupt is not None:
                raise interrupt

    def _trace(
        self,
        root,
        concrete_args,
        dynamic_shapes,
        *,
        remove_inplace: bool,
        update_model_with_callable: bool,
        verbose: int,
    ) -> torch.fx.Graph:
        """:meth:`trace` inside its patch window."""
        self._reset()
        fake_mode = self.dims.fake_mode
        current_window().push(lambda: _settle_fake_mode(fake_mode))
        module = root if isinstance(root, torch.nn.Module) else _CallableModule(root)
        forward = root.forward if isinstance(root, torch.nn.Module) else root
        self._inputs = flatten_example_inputs(
            bind_example_inputs(forward, concrete_args, allow_missing=True),
            dynamic_shapes,
            self.dims,
        )
        self._index_tensors(module)
        with (
            fx_tracing_per_thread(),
            preserved_modules(module),
            replace_problematic_function_before_tracing(),
            memoized_symbolic_arithmetic(),
            buffer_assignments(self._assign_buffer),
        ):
            try:
                graph = super().trace(module)
            except TraceError as e:
                strict = self.refinements.strict_error()
                if strict is None:
                    raise
                raise strict from e
        strict = self.refinements.strict_error()
        if strict is not None:
            raise strict
        self._finish(graph, module, root, update_model_with_callable)
        self._mark_storages(graph, module)
        if remove_inplace:
            self._apply_default_passes(graph)
        graph.lint()
        if verbose:
            print(graph)
            for guard in self.guards:
                print(f"guard: {guard}")
        return graph

    def _reset(self) -> None:
        self.dims = SymbolicDimensions()
        self.dims.consult_prover()
        self.shape_rules = shape_rules.ShapeRules(self.dims.fake_mode)
        self._check_shape_rules = shape_rules.check_enabled()
        self.refinements = Refinements(
            self.dims,
            self._assume,
            adopt_all=self.specialize_undecidable,
            strict_at_once=self._strict_at_once,
        )
        self._clear()

    def _index_tensors(self, module: torch.nn.Module) -> None:
        self._tensor_names = {}
        for name, p in module.named_parameters(remove_duplicate=True):
            self._tensor_names.setdefault(id(p), name)
        for name, b in module.named_buffers(remove_duplicate=True):
            self._tensor_names.setdefault(id(b), name)

    def create_args_for_root(self, root_fn, is_module, concrete_args=None):
        """Creates one placeholder per flattened input leaf (see :mod:`.inputs`)."""
        inputs: FlatInputs = self._inputs
        proxies, baked = [], []
        for name, leaf, sizes in zip(inputs.names, inputs.leaves, inputs.sizes):
            node = self.create_node("placeholder", name, (), {})
            if leaf is NO_EXAMPLE:
                # no example: a placeholder without metadata, as torch.fx makes
                baked.append(False)
                proxies.append(CustomProxy(node, self))
                continue
            node.meta["example_value"] = leaf
            if sizes is None:
                # Python scalars and other constants are baked in, as torch.export does.
                node.meta["val"] = leaf
                if isinstance(leaf, (int, float, bool)):
                    self.guards.append(Guard(f"{name} == {leaf!r}", True, "constant argument"))
            elif isinstance(sizes, torch.SymInt):
                # an int declared dynamic
                node.meta["val"] = sizes
            else:
                node.meta["val"] = self.dims.fake_tensor(leaf, sizes)
            baked.append(sizes is None)
            proxies.append(CustomProxy(node, self))

        structured = any(not child.is_leaf() for child in inputs.in_spec.children()) or len(
            inputs.keyword_names
        ) != len(inputs.arg_names)

        def flat_fn(*placeholder_proxies):
            patch_len_in(getattr(root_fn, "__func__", root_fn))
            leaves = [
                leaf if is_baked else p
                for p, leaf, is_baked in zip(placeholder_proxies, inputs.leaves, baked)
            ]
            out = inputs.call(root_fn, leaves, self_arg=self.root if is_module else None)
            register_cache_flattening(out)
            flat_out, out_spec = pytree.tree_flatten(out)
            self._out_spec = out_spec
            self._structured = structured or not _is_simple_output(out_spec)
            return tuple(flat_out) if self._structured else out

        return flat_fn, proxies

    def _finish(self, graph, module, root, update_model_with_callable) -> None:
        constants = self._traced_constants(graph)
        if self._structured:
            graph._codegen = CheckedPyTreeCodeGen(
                _PyTreeInfo(list(self._inputs.arg_names), self._inputs.in_spec, self._out_spec),
                constants,
            )
        elif constants:
            graph._codegen = CheckedCodeGen(constants)
        _remove_unused_scalar_nodes(graph)
        # Pickling or copying a GraphModule traces its code again with this class:
        # torch.fx's own tracer does that job (it needs no example inputs).
        graph._tracer_cls = None
        if self.runtime_checks:
            checks = declared_checks(self.dims)
            checks += [
                RuntimeCheck(condition, f"torch._check({text})", location)
                for condition, text, location in self.refinements.user_checks
            ]
            checks += [
                RuntimeCheck(fact.condition, fact.constraint.expression, fact.constraint.location)
                for fact in self.refinements.adopted
            ]
            insert_runtime_checks(graph, self.dims, checks)
        for n in graph.nodes:
            if n.op == "output":
                n.meta["guards"] = list(self.guards)
                n.meta["constraints"] = list(self.constraints)
        if not isinstance(root, torch.nn.Module) and not update_model_with_callable:
            self.traced_model = None
            return
        self.traced_model = self._build_traced_model(module, graph)

    def _traced_constants(self, graph) -> dict[str, Any]:
        """Placeholder name -> the Python constant it was traced with."""
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        inputs = self._inputs
        if len(placeholders) != len(inputs.leaves):
            return {}
        return {
            node.name: leaf
            for node, leaf, sizes in zip(placeholders, inputs.leaves, inputs.sizes)
            if sizes is None and leaf is not NO_EXAMPLE
        }

    def _build_traced_model(self, module: torch.nn.Module, graph) -> torch.nn.Module:
        """The user's module if the graph only refers to it, else a shallow wrapper.

        The wrapper shares the user's submodules, parameters and buffers (no copy) and
        adds the constants and subgraphs created while tracing, so the user's module
        is never modified.
        """
        if (
            not self._constants
            and not self._subgraphs
            and module is not None
            and not (isinstance(module, _CallableModule))
        ):
            return module
        wrapper = torch.nn.Module()
        wrapper._modules.update(module._modules)
        wrapper._parameters.update(module._parameters)
        wrapper._buffers.update(module._buffers)
        for k, v in module.__dict__.items():
            if isinstance(v, torch.Tensor) and not k.startswith("_"):
                setattr(wrapper, k, v)
        for name, tensor in self._constants.items():
            wrapper.register_buffer(name, tensor, persistent=False)
        for name, subgraph in self._subgraphs.items():
            if isinstance(subgraph, torch.fx.Graph):
                subgraph = torch.fx.GraphModule(wrapper, subgraph)
            setattr(wrapper, name, subgraph)
        return wrapper

    def _mark_storages(self, graph: torch.fx.Graph, module: torch.nn.Module) -> None:
        """Tells the passes which inputs, parameters and buffers share storage.

        Each input gets its own fake tensor, so ``f(a, a[1])`` or a buffer registered
        as a view of another look independent in the graph: the real tensors say which
        alias, and a write into one of them is then rewritten exactly or refused.
        """
        from ..passes import mark_storages

        tensors: dict[str, Any] = dict(zip(self._inputs.names, self._inputs.leaves))
        tensors.update(module.named_parameters(remove_duplicate=False))
        tensors.update(module.named_buffers(remove_duplicate=False))
        mark_storages(graph, tensors)

    def _apply_default_passes(self, graph) -> None:
        # [passes, issue 11] the one default pass order shared with to_onnx. exc=False:
        # what a pass cannot prove exact stays as it is (still correct), tracing must not
        # fail because of it. mutations="write_back": the body becomes functional and
        # ends with copy_ into the mutated inputs and buffers, so the graph returns what
        # the model returns and has the same side effects (to_onnx asks for "outputs").
        from ..passes import run_default_passes

        # the passes compute the fake values of the nodes they create (x[:, n - 1] = v
        # becomes select_scatter...) with the tracer's symbolic kernels: torch's would
        # specialize the dimensions
        with symbolic_kernels():
            run_default_passes(
                graph, mutations="write_back", exc=False, recursive=True, module=self.traced_model
            )

    # graph passes (thin calls into yobx.torch.passes, kept on the tracer's public API)

    @classmethod
    def remove_inplace(cls, graph, exported_program=None, verbose=0, exc=True, recursive=False):
        """See :func:`yobx.torch.passes.remove_inplace`."""
        from ..passes import remove_inplace

        # [passes, issue 11] the seed's classmethods return plain ints
        return int(
            remove_inplace(graph, exported_program, verbose=verbose, exc=exc, recursive=recursive)
        )

    @classmethod
    def remove_unnecessary_slices(cls, graph, verbose=0):
        """See :func:`yobx.torch.passes.remove_unnecessary_slices`."""
        from ..passes import remove_unnecessary_slices

        return int(remove_unnecessary_slices(graph, verbose=verbose))

    @classmethod
    def remove_batch_dim_nodes(cls, graph, verbose=0):
        """See :func:`yobx.torch.passes.remove_batch_dim_nodes`."""
        from ..passes import remove_batch_dim_nodes

        return int(remove_batch_dim_nodes(graph, verbose=verbose))

    @classmethod
    def graph_erase_node(cls, graph, node):
        """See :func:`yobx.torch.passes.graph_erase_node`."""
        from ..passes import graph_erase_node

        return graph_erase_node(graph, node)

    # leaves and attributes

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        """A module is a leaf if ``module_leaves`` says so, else as in torch.fx."""
        for cls in type(m).__mro__:
            decide = self.module_leaves.get(cls)
            if decide is not None:
                return bool(decide(m, module_qualified_name))
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m, forward, args, kwargs):
        """Records leaf modules; runs the module itself while computing fake values."""
        if self._in_fake:
            # nn.LSTM / nn.GRU cannot run on symbolic sizes: their custom operator
            # computes the same values and keeps the sizes symbolic.
            replacement = leaf_module_call(m, args, kwargs)
            return forward(*args, **kwargs) if replacement is None else replacement
        patch_len_in(type(m).forward)
        if m not in self.submodule_paths:
            # A module built inside forward (`nn.Softmax(dim=-1)(x)`) has no path in the
            # model: it cannot be a call_module node, its operations are traced instead.
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def _assign_buffer(self, module: torch.nn.Module, name: str, value: Any) -> bool:
        """``module.name = value`` on a buffer while tracing (see :mod:`.module_state`)."""
        return assign_traced_buffer(self, module, name, value)

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        """Parameters and buffers of the root become ``get_attr`` proxies."""
        if self._in_fake or not isinstance(attr_val, torch.Tensor):
            return attr_val
        name = self._tensor_names.get(id(attr_val))
        if name is None:
            return attr_val
        if name not in parameter_proxy_cache or (
            parameter_proxy_cache[name].node.graph is not self.graph
        ):
            parameter_proxy_cache[name] = self.create_proxy(
                "get_attr",
                name,
                (),
                {},
                proxy_factory_fn=lambda node: CustomParameterProxy(self, node, name, attr_val),
            )
        return parameter_proxy_cache[name]

    def create_arg(self, a: Any) -> Any:
        """Like torch.fx's, but keeps the user's module untouched for tensor constants."""
        if isinstance(a, Proxy):
            node = a.node
            if node.graph is not self.graph:
                return self._lift(node)
            return node
        if isinstance(a, CustomProxyShape):
            return tuple(self.create_arg(x) for x in a)
        if isinstance(a, type) and a in _PYTHON_TYPES_AS_DTYPES:
            # x.to(int): torch maps Python types to dtypes, a graph needs the dtype
            return _PYTHON_TYPES_AS_DTYPES[a]
        if isinstance(a, torch.Tensor) and not isinstance(a, torch._subclasses.FakeTensor):
            return self._tensor_constant(a)
        return super().create_arg(a)

    def _tensor_constant(self, tensor: torch.Tensor) -> Node:
        key = id(tensor)
        name = self._tensor_names.get(key) or self.tensor_attrs.get(tensor)
        if name is None:
            node = self._constant_nodes.get(key)
            if node is not None and node.graph is self.graph:
                return node
            name = self.add_constant(tensor)
        node = self.create_node("get_attr", name, (), {})
        node.meta["val"] = self.dims.from_real(tensor)
        self._constant_nodes[key] = node
        return node

    @property
    def running_fake(self) -> bool:
        """Whether the tracer is running an operation on fake values (module attribute
        assignments inside it are torch's, not the user's)."""
        return bool(self._in_fake)

    def tensor_name(self, tensor: torch.Tensor) -> str | None:
        """The qualified name of a parameter or buffer of the traced module, or None."""
        return self._tensor_names.get(id(tensor))

    def constant(self, name: str) -> torch.Tensor:
        """The tensor stored by :meth:`add_constant` under ``name``."""
        return self._constants[name]

    @property
    def registered_callables(self) -> dict[str, Any]:
        """What :meth:`register_callable` stored, by name (read only)."""
        return dict(self._subgraphs)

    @contextlib.contextmanager
    def subgraph(self, graph: torch.fx.Graph) -> Iterator[list[Node]]:
        """Records into ``graph`` while the block runs (branches of ``torch.cond``, the
        body of a scan). Values of the enclosing graph used inside become placeholders
        of ``graph``; the yielded list receives those outer nodes, in placeholder
        order, when the block ends."""
        outer, saved_cache = self.graph, self._shape_cache
        self.graph, self._shape_cache = graph, {}
        self._lift_stack.append({})
        lifted: list[Node] = []
        try:
            yield lifted
            lifted.extend(self._lift_stack[-1])
        finally:
            self._lift_stack.pop()
            self.graph, self._shape_cache = outer, saved_cache

    def add_constant(self, tensor: torch.Tensor) -> str:
        """Stores a tensor created while tracing on the traced model; returns its name.

        The prefix differs from torch.fx's and make_fx's ``_tensor_constant``: lowering
        the graph again (ONNX export) creates constants of its own with that prefix.
        """
        name = f"{CONSTANT_PREFIX}{len(self._constants)}"
        self._constants[name] = tensor
        return name

    def _lift(self, node: Node) -> Node:
        """Makes a value of an enclosing graph an input of the subgraph being traced."""
        if not self._lift_stack:
            raise TraceError(f"node {node} belongs to another graph")
        lifted = self._lift_stack[-1]
        if node not in lifted:
            if node.op == "get_attr":
                new = self.graph.get_attr(node.target)
            else:
                placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
                anchor = placeholders[-1].next if placeholders else next(iter(self.graph.nodes))
                with self.graph.inserting_before(anchor):
                    new = self.graph.placeholder(f"lifted_{node.name}")
            new.meta.update({k: v for k, v in node.meta.items() if k in ("val", "example_value")})
            lifted[node] = new
        return lifted[node]

    # proxies and fake values

    def proxy(self, node: Node, cls: type | None = None, **kwargs: Any) -> CustomProxy:
        """Wraps a node in a proxy.

        :param node: the node (of this tracer's graph)
        :param cls: the proxy class; by default the one matching the node's value
            (:class:`CustomProxyInt` for a SymInt...)
        :param kwargs: given to the class (``concrete_val=...`` for
            :class:`CustomProxyInt`)
        """
        if cls is None:
            cls = proxy_class_for(node.meta.get("val"))
        return cls(node, self, **kwargs)

    def register_callable(self, name: str, fn: Callable[..., Any]) -> Node:
        """Stores ``fn`` on the traced model and returns a ``get_attr`` node to it.

        A module (a ``GraphModule`` branch of ``torch.cond``, any ``nn.Module``) is
        stored as it is, a ``torch.fx.Graph`` becomes a ``GraphModule`` of the traced
        model, any other callable is wrapped in a module; the name is made unique
        (``name``, ``name_1``...). The graph can then call it (``call_module`` on the
        returned node's target, or pass the node to a higher-order operator).
        """
        if not isinstance(fn, (torch.nn.Module, torch.fx.Graph)):
            fn = _CallableModule(fn)
        base, index = _identifier_of(name), 0
        unique = base
        root = getattr(self, "root", None)
        while unique in self._subgraphs or (root is not None and hasattr(root, unique)):
            index += 1
            unique = f"{base}_{index}"
        self._subgraphs[unique] = fn
        return self.graph.get_attr(unique)

    def create_proxy(
        self,
        kind,
        target,
        args,
        kwargs,
        name=None,
        type_expr=None,
        proxy_factory_fn=None,
    ):
        """Creates the node, computes its fake value, returns a proxy or a constant."""
        args_ = self.create_arg(args)
        kwargs_ = self.create_arg(kwargs)
        node = self.create_node(kind, target, args_, kwargs_, name, type_expr)
        if self.dims is None or not _known_inputs(node):
            # outside a trace, or from an input traced without example: torch.fx's
            # proxies, which know nothing of their values
            node.meta["stack_trace"] = self.stack_trace()
        elif kind == "get_attr":
            value = self._attribute(target)
            node.meta["val"] = (
                self.dims.from_real(value) if isinstance(value, torch.Tensor) else None
            )
        elif kind != "placeholder":
            if kind == "call_method" and isinstance(target, str) and target.endswith("_"):
                self._shape_cache.pop(args_[0], None)
            val = self._run_fake(node)
            node.meta["val"] = val
            self.bind_unbacked(node, val)
            constant = constant_value(val)
            if constant is not NOT_CONSTANT:
                if _has_symbol(node.args):
                    # torch already simplified the value from the known ranges: still a
                    # decision the graph relies on, so it is reported and checked.
                    self._record_folded_value(node, constant)
                self.graph.erase_node(node)
                return constant
            # only for nodes that stay (a folded constant is erased above)
            node.meta["stack_trace"] = self.stack_trace()
        if proxy_factory_fn is not None:
            return proxy_factory_fn(node)
        return self.proxy(node)

    def bind_unbacked(self, node: Node, val: Any) -> None:
        """Records where the sizes only known at run time (``x[mask]``, ``nonzero``)
        appear in the node's value, as torch.export does (``meta["unbacked_bindings"]``):
        a later re-run of the graph (the ONNX lowering) creates new symbols for them
        and binds them to these ones."""
        pending = self.shape_env.pending_fresh_unbacked_symbols
        if not pending:
            return
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

        # with YOBX_CHECK_SHAPE_RULES, torch's kernel ran too and made its own symbols
        present = free_unbacked_symbols(val)
        self.shape_env.ignorable_fresh_unbacked_symbols.extend(
            s for s in pending if s not in present
        )
        try:
            bindings = compute_unbacked_bindings(self.shape_env, val)
        except PendingUnbackedSymbolNotFound:
            # a size written with the symbol (u0 + 1), not the symbol: nothing to bind
            return
        if bindings:
            node.meta["unbacked_bindings"] = bindings

    def _record_folded_value(self, node: Node, value: Any) -> None:
        operands = [_fake_value(a) if isinstance(a, Node) else a for a in node.args]
        location = self.location()
        if node.target in _COMPARISONS:
            lhs, rhs = (self.dims.render(o) for o in operands)
            expression = f"{lhs} {_COMPARISONS[node.target]} {rhs}"
            self.guards.append(Guard(expression, value, "bounds", location))
        build = _SYMPY_OPERATIONS.get(node.target) if node.op == "call_function" else None
        self.refinements.rely_on_default_bounds(build, operands, value, location)

    def _attribute(self, target: str) -> Any:
        if target in self._constants:
            return self._constants[target]
        # Module.__getattr__ is patched while tracing: walk the dictionaries instead.
        obj = self.root
        for atom in target.split("."):
            for table in ("_parameters", "_buffers", "_modules"):
                entries = obj.__dict__.get(table)
                if entries is not None and atom in entries:
                    obj = entries[atom]
                    break
            else:
                obj = object.__getattribute__(obj, atom)
        return obj

    def _run_fake(self, node: Node) -> Any:
        """Runs the node's operation on the fake values of its arguments."""
        args, kwargs = map_arg((node.args, node.kwargs), _fake_value)
        if _is_squeeze(node):
            self._decide_squeezed(args, kwargs)
        guards_before = len(self.shape_env.guards)
        known = self.dims.snapshot()
        self._in_fake += 1
        # torch's own Python code runs here: it must see the real isinstance (faster,
        # and no proxy reaches fake kernels anyway).
        patched_isinstance = builtins.isinstance
        grad_mode = torch.is_grad_enabled()
        try:
            builtins.isinstance = _ORIGINAL_ISINSTANCE
            # Fake values carry no autograd history: recording it costs time, and a
            # rule's output must not be a leaf that requires grad (in-place ops on it
            # would then fail where eager succeeds).
            torch._C._set_grad_enabled(False)
            module = self.root.get_submodule(node.target) if node.op == "call_module" else None
            val = self.shape_rules.run(node, args, kwargs, module)
            if val is NotImplemented or self._check_shape_rules:
                # The fake convolution picks a memory format (strides only) by asking
                # the example's batch size (`batch < 16`): decided without recording
                # anything, so that this choice never narrows what is known about the
                # dimensions.
                quiet = (
                    self.shape_env.suppress_guards()
                    if _is_convolution(node, module)
                    else contextlib.nullcontext()
                )
                with self.fake_mode, quiet:
                    expected = self._dispatch_fake(node, args, kwargs)
                if val is NotImplemented:
                    val = expected
                else:
                    shape_rules.compare(
                        val,
                        expected,
                        pytree.tree_leaves((args, kwargs)),
                        operation_name(node),
                        self.dims.prove,
                    )
        except (TraceError, shape_rules.ShapeRuleMismatch):
            raise
        except GuardOnDataDependentSymNode as e:
            # an operation whose result depends on tensor values (x[mask].view(n, ...))
            raise self.refinements.data_dependent_error(
                e.cond if hasattr(e, "cond") else sympy.true,
                self.location(),
                f"{operation_name(node)} needs a decision on",
            ) from e
        except Exception as e:
            raise TracingError.at(
                self.location(),
                f"{operation_name(node)} failed on fake tensors "
                f"with {type(e).__name__}: {_first_line(e)}",
            ) from e
        finally:
            torch._C._set_grad_enabled(grad_mode)
            builtins.isinstance = patched_isinstance
            self._in_fake -= 1
        if len(self.shape_env.guards) > guards_before:
            self._new_guards(guards_before, node, known)
        return val

    def _decide_squeezed(self, args: tuple, kwargs: dict) -> None:
        """``squeeze`` removes the dimensions of size 1: which ones decides the rank of
        its output, so each dynamic one is a decision the graph relies on (torch's fake
        kernel answers "not 1" without recording anything: a graph running with such a
        dimension of size 1 would compute with the wrong rank)."""
        x = args[0] if args else kwargs.get("input", kwargs.get("self"))
        if not isinstance(x, torch.Tensor):
            return
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        if dims is None:
            dims = range(x.dim())
        elif isinstance(dims, int):
            dims = [dims]
        for d in dims:
            size = x.shape[d]
            if isinstance(size, torch.SymInt) and size.node.maybe_as_int() is None:
                self.decide(size == 1, "squeeze: the dimension's size is 1")

    def _dispatch_fake(self, node: Node, args: tuple, kwargs: dict) -> Any:
        """Runs the node's operation through torch (the fake mode must be active)."""
        if node.op == "call_function":
            return function_variant(node.target, args)(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        return self._run_leaf_module(node.target, args, kwargs)

    def _run_leaf_module(self, target: str, args, kwargs) -> Any:
        """Runs a leaf module on fake inputs with fake parameters and buffers.

        The module's own tensors are swapped for fake copies so that in-place updates
        in its forward (BatchNorm's running statistics) never touch the real ones.
        A module without buffers runs as it is (faster): the fake mode converts its
        parameters (the same static fake copies as :meth:`SymbolicDimensions.from_real`)
        and never writes into them, except one-element tensors, which it may compute
        for real (constant propagation): modules holding one keep the fake swap.
        """
        module = self.root.get_submodule(target)
        # Parameters on the meta device take the swap too: their fake copies are CPU
        # tensors (see SymbolicDimensions.from_real).
        if next(module.buffers(), None) is None and all(
            p.numel() > 1 and p.device.type != "meta" for p in module.parameters()
        ):
            return module(*args, **kwargs)
        state = {
            name: self.dims.from_real(t)
            for name, t in (*module.named_parameters(), *module.named_buffers())
        }
        return torch.func.functional_call(module, state, tuple(args), kwargs, strict=False)

    def _new_guards(self, start: int, node: Node, known: tuple[dict, dict]) -> None:
        """Guards added by an operation are facts taken from the example: adopted as
        constraints when not provable from what was known before the operation."""
        adopted = set()
        for guard in self.shape_env.guards[start:]:
            if self._allowed_guards or self.dims.prove(guard.expr, known) is True:
                continue
            location = self.location()
            constraint = self.refinements.adopt(
                guard.expr, location, operation_name(node), known=True
            )
            # a kernel may check the same fact twice (reshape: a remainder, then a product)
            if constraint.expression not in adopted:
                adopted.add(constraint.expression)
                self.guards.append(Guard(constraint.expression, True, "adopted", location))

    def shape_of(self, proxy: CustomProxy) -> Any:
        """``x.shape``: ``torch.Size`` when static, else :class:`CustomProxyShape`."""
        node = proxy.node
        cached = self._shape_cache.get(node)
        if cached is not None:
            return cached
        items: list[Any] = []
        for i, d in enumerate(proxy.val.shape):
            constant = d if isinstance(d, int) else d.node.maybe_as_int()
            if constant is not None:
                items.append(int(constant))
            else:
                items.append(self.create_proxy("call_method", "size", (proxy, i), {}))
        if all(isinstance(i, int) for i in items):
            shape = torch.Size(items)
        else:
            shape = CustomProxyShape(items, self)
        self._shape_cache[node] = shape
        return shape

    def iter(self, obj: Proxy):
        """Iteration over a proxy: tuples and tensors with a static first dimension.

        torch.fx's own proxies (``Attribute``) land here; iterating over the proxy of
        their node gives them the behaviour of :class:`CustomProxy`.
        """
        return iter(self.proxy(obj.node))


def _identifier_of(name: str) -> str:
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return text if text and not text[0].isdigit() else f"_{text}"


def _known_inputs(node: Node) -> bool:
    """Whether every node the node reads has a value (``meta["val"]``)."""
    return all("val" in n.meta for n in node.all_input_nodes)


def _is_squeeze(node: Node) -> bool:
    if node.op == "call_method":
        return node.target in ("squeeze", "squeeze_")
    return node.op == "call_function" and node.target in (torch.squeeze, torch.Tensor.squeeze)


def _settle_fake_mode(fake_mode) -> None:
    """Forgets what an interrupted ``with fake_mode`` left in the trace's fake mode, which
    is not active any more when the trace ends (the window restores the thread's
    dispatch modes themselves)."""
    fake_mode.in_kernel_invocation = False
    fake_mode.enter_stack.clear()


def _is_convolution(node: Node, module: torch.nn.Module | None) -> bool:
    if node.op == "call_function":
        return node.target in _CONVOLUTIONS
    return isinstance(module, torch.nn.modules.conv._ConvNd)


def graph_fingerprint(graph: torch.fx.Graph) -> str:
    """A digest of a graph's node names, kinds and targets.

    Two captures with the same fingerprint name the same computations the same way;
    tools matching values by node name (ONNX value names, recorded runs) check it first.
    """
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    for node in graph.nodes:
        target = node.target if isinstance(node.target, str) else operation_name(node)
        digest.update(f"{node.op}|{node.name}|{target}\n".encode())
    return digest.hexdigest()


def _fake_value(node: Node) -> Any:
    if "val" not in node.meta:
        raise TraceError(f"node {node.format_node()} has no fake value")
    return node.meta["val"]


def _is_simple_output(spec) -> bool:
    if spec.is_leaf():
        return True
    return spec.type is tuple and all(c.is_leaf() for c in spec.children())


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else repr(e)


def _remove_unused_scalar_nodes(graph: torch.fx.Graph) -> None:
    """Removes shape/scalar computations nobody uses (created by ``x.shape`` & co)."""
    for node in reversed(list(graph.nodes)):
        if node.users:
            continue
        if node.op == "call_method" and node.target in _PURE_METHODS:
            graph.erase_node(node)
        elif node.op == "call_function" and node.target in _PURE_SCALAR_FUNCTIONS:
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor) or node.target is getattr:
                graph.erase_node(node)
        elif node.op == "get_attr":
            graph.erase_node(node)


class _CallableModule(torch.nn.Module):
    """Wraps a callable so that it can be traced and run as a GraphModule."""

    def __init__(self, fn: Callable):
        super().__init__()
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, torch.nn.Module):
            self.owner = owner
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


__all__ = ["CustomTracer", "graph_fingerprint"]
