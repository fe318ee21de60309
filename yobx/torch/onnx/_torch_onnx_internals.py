"""Every use of torch.onnx's private exporter internals, pinned in one place.

``torch.onnx.export(..., dynamo=True)`` translates an aten-level FX graph with
onnxscript's torch_lib. The pieces doing that (registry, dispatcher, per-graph
translation, opset bookkeeping) work on any aten FX graph whose nodes carry
``meta["val"]``, not only on graphs coming from :func:`torch.export.export`; we reuse
them instead of writing the aten to ONNX translation again.
``unittests/torch/onnx/test_onnx_internals.py`` checks the assumptions made here,
so a torch upgrade breaking them fails there first.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import onnx_ir as ir
import torch
from torch.fx.experimental.sym_node import SymNode
from torch.onnx._internal.exporter import (
    _core,
    _decomp,
    _errors,
    _ir_passes,
    _registration,
)
from torch.onnx._internal.fx.passes import type_promotion

from yobx.torch.fx_code import recompile_alone
from yobx.torch.onnx.opsets import DEFAULT_OPSET
from yobx.torch.quiet_logs import quieted
from yobx.torch.tracing.isolation.patching import patched_attributes

#: ONNX domain of the local functions holding subgraphs (cond, scan bodies).
LOCAL_FUNCTION_DOMAIN = "pkg.torch.__subgraph__"


@functools.cache
def onnx_registry(opset: int = DEFAULT_OPSET) -> _registration.ONNXRegistry:
    """Returns torch_lib's registry of aten -> ONNX functions for ``opset``.

    Building it imports and indexes all of torch_lib (about a second), so it is built
    once per process and opset.
    """
    # torchvision is not required; the registry warns for each of its missing ops.
    with (
        quieted("torch.onnx._internal.exporter._registration"),
        patched_attributes(
            [
                (_registration.onnxscript_apis, "get_torchlib_ops", _torchlib_ops),
                (_registration, "OnnxDecompMeta", _UnsignedDecompMeta),
            ]
        ),
    ):
        registry = _registration.ONNXRegistry.from_torchlib(opset_version=opset)
    from yobx.torch.onnx import custom_ops

    custom_ops.register_translations(registry)
    return registry


class _UnsignedDecompMeta(_registration.OnnxDecompMeta):
    """torch.onnx's entry of a torch_lib function, its ONNX signature left to be
    inferred when the function is first translated.

    The registry infers the signature of each of its ~600 functions when it is built
    (``inspect`` and type annotations: 0.3 s, a tenth of a tiny decoder's first export
    in a process), and nothing reads it there: dispatching picks an entry by its target
    and whether it takes complex numbers, and the graph builder infers a function's
    signature itself when the function has none yet (``_pt_onnx_signature``,
    ``GraphBuilder.eval_function``), once per process.
    """

    def __post_init__(self) -> None:
        pass


def _torchlib_ops() -> list[Any]:
    """onnxscript's ``get_torchlib_ops``, each function's domain read from its opset
    instead of its signature or its compiled IR.

    onnxscript translates the signature of each traced function (``inspect.getsource``
    then its AST) to read the domain of the function it declares, which is its opset's
    (the translator's module): 0.7 s for torch_lib, once per process, which an export
    in a fresh process paid (a fifth of a tiny decoder's). The registry reads the
    function, its name and whether it is complex, not the domain.
    """
    from onnxscript._framework_apis.torch_2_5 import _OnnxFunctionMeta
    from onnxscript.function_libs.torch_lib import registration

    from yobx.torch.onnx.lazy_torch_lib import import_torch_lib

    import_torch_lib()  # for its registrations
    metas = []
    for qualified_name, functions in registration.default_registry.items():
        if qualified_name.startswith("internal::"):
            continue  # torch_lib's own helpers
        for complex_, overloads in ((False, functions.overloads), (True, functions.complex)):
            for function in overloads:
                # a scripted function's IR has its opset's domain: read from the
                # opset, it is not compiled here (lazy_torch_lib)
                domain = function.opset.domain
                metas.append(
                    _OnnxFunctionMeta(qualified_name, function, domain, function.name, complex_)
                )
    return metas


@functools.cache
def decomposition_table(opset: int = DEFAULT_OPSET) -> dict[Any, Callable]:
    """Returns the aten decompositions for the ops torch_lib does not implement."""
    registry = onnx_registry(opset)
    implemented = set(_decomp.get_onnx_implemented_overloads(registry))
    return _decomp.create_onnx_friendly_decomposition_table(implemented)


@functools.cache
def _preserved_composite_ops(opset: int) -> tuple[Any, ...]:
    """The CompositeImplicitAutograd operators torch_lib translates: what torch.onnx
    keeps, ``_collect_all_valid_cia_ops()`` filtered by the registry, found from the
    registry's side. The registry knows an overload by its name (``aten::linear``,
    ``aten::add.Tensor``), so each of its names is looked up and tested as torch
    tests every operator: the same operators, without walking all of them (0.12 s,
    a first export's, against 0.008 s)."""
    from torch._export.utils import _is_preservable_cia_op

    found = []
    for name in onnx_registry(opset).functions:
        if not isinstance(name, str) or "::" not in name:
            continue  # Python builtins (operator.add...)
        namespace, qualified = name.split("::", 1)
        packet, _, overload = qualified.partition(".")
        try:
            op = getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
        except (AttributeError, RuntimeError):
            continue  # an operator this build of torch does not have
        if _is_preservable_cia_op(op):
            found.append(op)
    return tuple(found)


def _sdpa_is_4d(query, key, value, *args, **kwargs) -> bool:
    return query.dim() == 4 and key.dim() == 4 and value.dim() == 4


#: torch_lib's translation of these operators only handles some of their inputs;
#: other calls are decomposed.
_PRESERVE_ONLY_IF: dict[Any, Callable[..., bool]] = {
    torch.ops.aten.scaled_dot_product_attention.default: _sdpa_is_4d,
}


def _conditionally_preserved(op: Any, condition: Callable[..., bool]) -> Callable:
    from torch._export.utils import _get_decomp_for_cia

    decomposition = _get_decomp_for_cia(op)

    def kernel(*args, **kwargs):
        if condition(*args, **kwargs):
            # NotImplemented is the marker keeping the operator whole.
            return NotImplemented
        if op is torch.ops.aten.scaled_dot_product_attention.default:
            lifted = _sdpa_lifted_to_4d(*args, **kwargs)
            if lifted is not None:
                return lifted
        return decomposition(*args, **kwargs)

    return kernel


def _sdpa_lifted_to_4d(query, key, value, attn_mask=None, *args, **kwargs) -> Any:
    """A 2-d or 3-d attention as a 4-d one (leading dimensions of size 1): torch_lib
    translates the 4-d operator whole, scale included (its decomposition multiplies by
    a ``SymFloat`` scale when the last dimension is dynamic, which torch_lib cannot
    take). ``None`` when the ranks differ or are not 2 or 3."""
    rank = query.dim()
    if rank not in (2, 3) or key.dim() != rank or value.dim() != rank:
        return None
    lift = 4 - rank

    def lifted(tensor):
        for _ in range(lift):
            tensor = torch.ops.aten.unsqueeze.default(tensor, 0)
        return tensor

    out = torch.ops.aten.scaled_dot_product_attention.default(
        lifted(query), lifted(key), lifted(value), attn_mask, *args, **kwargs
    )
    for _ in range(lift):
        out = torch.ops.aten.squeeze.dim(out, 0)
    return out


@contextlib.contextmanager
def preserve_translatable_composite_ops(opset: int = DEFAULT_OPSET) -> Iterator[None]:
    """Keeps composite operators torch_lib translates (linear, layer_norm,
    scaled_dot_product_attention, ...) as single aten nodes while lowering.

    Without it, make_fx decomposes every CompositeImplicitAutograd operator into its
    pieces: the ONNX graph gets bigger, weights get transposed (and renamed by the
    constant folding) and the attention loses its shape. This is what
    ``ExportedProgram.run_decompositions`` does for torch.onnx; the patch of the
    operators' Python kernels is undone on exit.
    """
    from torch._dispatch.python import enable_python_dispatcher

    with enable_python_dispatcher(), _composite_kernels_overridden(_preserving_kernels(opset)):
        yield


@functools.cache
def _preserving_kernels(opset: int) -> dict[Any, Callable]:
    """The CompositeImplicitAutograd kernel of each preserved operator: torch.export's
    marker keeping it whole, or a condition choosing between keeping and decomposing."""
    from torch._export.utils import _special_op_to_preserve_cia

    kernels = dict.fromkeys(_preserved_composite_ops(opset), _special_op_to_preserve_cia)
    for op, condition in _PRESERVE_ONLY_IF.items():
        if op in kernels:
            kernels[op] = _conditionally_preserved(op, condition)
    return kernels


def _run_original_composite(fake_mode, op, *args, original_callable, **kwargs):
    # the fake-tensor rule of a preserved operator: its original decomposition
    with fake_mode:
        return original_callable(*args, **kwargs)


@contextlib.contextmanager
def _composite_kernels_overridden(kernels: Mapping[Any, Callable]) -> Iterator[None]:
    """``torch.export.exported_program._override_composite_implicit_decomp``, with the
    same kernels, written straight into each operator's Python kernel table.

    torch's version registers them through ``OpOverload.py_impl``, which evaluates its
    typing annotations at every call: about 20 ms per export for the 870 kernels of the
    80 preserved operators, a tenth of a small model's export. On exit, every table is
    restored as it was, and only the fake-tensor rules added here are removed (torch's
    version also removes rules that existed before).
    """
    from torch._export.utils import _get_decomp_for_cia
    from torch._higher_order_ops.utils import autograd_not_implemented
    from torch._subclasses import fake_impls
    from torch.export.exported_program import (
        _AUTOGRAD_ALIAS_BACKEND_KEYS_TO_OVERRIDE,
        _BACKEND_KEYS_TO_OVERRIDE,
    )

    composite = torch._C.DispatchKey.CompositeImplicitAutograd
    saved: dict[Any, dict] = {}
    faked: list[Any] = []
    try:
        for op, kernel in kernels.items():
            table = op.py_kernels
            saved[op] = table.copy()
            not_implemented = autograd_not_implemented(op, deferred_error=True)
            for key in _AUTOGRAD_ALIAS_BACKEND_KEYS_TO_OVERRIDE:
                table.setdefault(key, not_implemented)
            # read before the override: the decomposition the operator had
            original = _get_decomp_for_cia(op)
            table.pop(composite, None)
            table[composite] = kernel
            if not fake_impls._is_op_registered_to_fake_rule(op):
                # a fake tensor runs the original decomposition, not the marker
                fake_impls.register_op_impl(op)(
                    functools.partial(_run_original_composite, original_callable=original)
                )
                faked.append(op)
            # real (constant) computations and backends still decompose
            for key in _BACKEND_KEYS_TO_OVERRIDE:
                table.setdefault(key, original)
            op._dispatch_cache.clear()
        yield
    finally:
        for op, table in saved.items():
            op.py_kernels.clear()
            op.py_kernels.update(table)
            op._dispatch_cache.clear()
        for op in faked:
            fake_impls._deregister_op_impl(op)


class _MetaReusingTypePromotion(type_promotion._TypePromotionInterpreter):
    """torch.onnx's type promotion, without re-running the nodes it leaves alone.

    The original interpreter recomputes every node on fake tensors to know the
    dtypes of their inputs; make_fx already stored those values in ``meta["val"]``.
    Nodes the pass changes (or creates) are still recomputed by the pass itself.
    """

    def run_node(self, node: torch.fx.Node) -> Any:
        with self._set_current_node(node):
            rule = type_promotion.get_type_promotion_rule(node, self.type_promotion_table)
            if rule is not None:
                self._maybe_promote_node(node, rule)
        value = node.meta.get("val")
        if node.op in ("placeholder", "call_function") and value is not None:
            return value
        return torch.fx.Interpreter.run_node(self, node)


def insert_type_promotion(graph_module: torch.fx.GraphModule) -> None:
    """Makes implicit type promotions explicit (ONNX operators need equal types).

    The nodes it changes run again on fake tensors: as in the lowering, a size that
    is 1 in the example is not specialised (``x[1:] * 2`` on an example of size 2),
    the capture already decided what the dimensions may be.
    """
    with torch.fx.experimental._config.patch(backed_size_oblivious=True):
        for module in graph_module.modules():
            if isinstance(module, torch.fx.GraphModule):
                promotion = type_promotion.InsertTypePromotion(module)
                promotion.interpreter = _MetaReusingTypePromotion(
                    module, type_promotion.TypePromotionTable()
                )
                promotion.run()


#: the run-time assertions make_fx records, as torch.onnx's own pass lists them
_ASSERTIONS = frozenset(
    {
        torch.ops.aten.sym_constrain_range_for_size.default,
        torch.ops.aten._assert_async.default,
        torch.ops.aten._assert_async.msg,
        torch.ops.aten._assert_scalar.default,
        torch.ops.aten._assert_tensor_metadata.default,
    }
)


def remove_assertion_nodes(graph_module: torch.fx.GraphModule) -> None:
    """Removes the run-time assertions make_fx records (``_assert_scalar`` on
    data-dependent sizes, ``sym_constrain_range_for_size``) from every graph: ONNX has
    no assertion; torch.onnx drops them the same way.

    torch.onnx's pass recompiles every module it visits, and
    ``GraphModule.recompile`` recompiles all the module's submodules too: a graph
    choosing between versions nests their branches several deep, and that was quadratic
    in the depth (6 of the 36 s of an 8-version decode step). Here each module that
    changed is recompiled alone (:func:`~yobx.torch.fx_code.recompile_alone`).
    """
    for module in graph_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(module, torch.fx.GraphModule) or graph is None:
            continue
        erased = False
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target in _ASSERTIONS:
                graph.erase_node(node)
                erased = True
        if erased:
            recompile_alone(module)


#: ONNX operator signatures by (domain, name, since_version): a schema never changes
_OP_SIGNATURES: dict[tuple[str, str, int], ir.schemas.OpSignature] = {}


def _memoized_op_signature(cls: type, op_schema: Any) -> ir.schemas.OpSignature:
    key = (op_schema.domain, op_schema.name, op_schema.since_version)
    signature = _OP_SIGNATURES.get(key)
    if signature is None:
        signature = _OP_SIGNATURES[key] = _FROM_OP_SCHEMA(op_schema)
    return signature


_FROM_OP_SCHEMA = ir.schemas.OpSignature.from_op_schema


@contextlib.contextmanager
def _op_signatures_memoized() -> Iterator[None]:
    """Builds each ONNX operator's signature once per process while translating.

    torch.onnx's op recorder converts the operator's ``OpSchema`` into an onnx_ir
    ``OpSignature`` at every ONNX node it builds (80 to 160 µs each, a fifth of a
    small model's translation). The signature is read only, as the one onnxscript
    caches on each of its ``Op``; the original converter is back on exit.
    """
    memoized = classmethod(_memoized_op_signature)
    with patched_attributes([(ir.schemas.OpSignature, "from_op_schema", memoized)]):
        yield


@functools.lru_cache(maxsize=4096)
def _expression_text(expression: Any) -> str:
    return f"{expression}"


def _memoized_sym_text(node: SymNode) -> str:
    """``SymNode.str``: the text of the node's expression (the ShapeEnv's replacements
    applied, which ``SymNode.expr`` caches), printed once per expression."""
    return _expression_text(node.expr)


@contextlib.contextmanager
def _sym_texts_memoized() -> Iterator[None]:
    """Prints each symbolic dimension's expression once while translating.

    torch.onnx names each symbolic dimension of every value it creates
    ``str(dim.node)``: sympy's printer, for the same few expressions (``s0``,
    ``s1 + s2``) thousands of times, a sixth of a small decoder's translation. Equal
    expressions print the same; the original method is back on exit.
    """
    with patched_attributes([(SymNode, "str", _memoized_sym_text)]):
        yield


_SET_SHAPE_TYPE = _core._set_shape_type


def _set_shape_type_floats_in_double(
    value: ir.Value, meta_val: Any, complex_to_float: bool
) -> None:
    if isinstance(meta_val, (float, torch.SymFloat)):
        value.dtype = ir.DataType.DOUBLE
        value.shape = ir.Shape([])
        return
    _SET_SHAPE_TYPE(value, meta_val, complex_to_float)


@contextlib.contextmanager
def _symbolic_floats_in_double() -> Iterator[None]:
    """Declares the ONNX value of a symbolic float (``x.shape[1] * 0.7``) a double.

    A ``SymFloat`` is a Python float: torch computes ``int(x.shape[1] * 0.7)`` in
    double precision, 62 at size 90, where float32 (torch.onnx's type for it) gives
    63, an output one element longer than eager's, silently. yobx's translations of
    ``sym_float``, ``truediv`` and the math functions compute in double; this makes
    the declared type agree (torch.onnx overwrites it with FLOAT after each node).
    """
    with patched_attributes([(_core, "_set_shape_type", _set_shape_type_floats_in_double)]):
        yield


def translate_graph(
    graph: torch.fx.Graph,
    model: ir.Model,
    graph_like: ir.Graph | ir.Function,
    owned_graphs: Mapping[str, ir.Function],
    opset: int,
) -> dict[str, ir.Value | Sequence[ir.Value]]:
    """Translates one aten FX graph into ``graph_like``, returns node name -> values."""
    # torch.onnx warns for every node without nn_module_stack, which our aten graphs
    # never have: silence it for the call.
    with (
        quieted(_core.__name__),
        _op_signatures_memoized(),
        _symbolic_floats_in_double(),
        _sym_texts_memoized(),
    ):
        return _core._translate_fx_graph(
            graph,
            model,
            graph_like=graph_like,
            owned_graphs=owned_graphs,
            lower="at_conversion",
            registry=_registry_with_custom_operators(opset),
        )


def _registry_with_custom_operators(opset: int) -> _registration.ONNXRegistry:
    """:func:`onnx_registry`, with the translations of yobx's custom operators defined
    since it was built (:func:`~yobx.torch.onnx.custom_ops.register_defined_operators`)."""
    from yobx.torch.onnx import custom_ops

    registry = onnx_registry(opset)
    custom_ops.register_defined_operators(registry)
    return registry


def torch_tensor(tensor: torch.Tensor, name: str) -> ir.TensorProtocol:
    """Wraps a torch tensor as an onnx_ir tensor without copying it."""
    return _core.TorchTensor(tensor, name=name)


def add_opset_imports(model: ir.Model) -> None:
    """Declares in the model every opset its nodes and functions use."""
    _ir_passes.add_opset_imports(model)


#: Exceptions the translation raises when a node has no ONNX translation.
ConversionError = _errors.ConversionError
DispatchError = _errors.DispatchError
