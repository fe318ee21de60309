"""What a node calls and what it produces: target names, aten schemas, tensor-ness.

Everything here answers questions conservatively: ``None`` means "cannot be proven", and
the passes treat it as such instead of guessing.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import operator
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx import Graph, Node

aten = torch.ops.aten
INT64_MAX = 9223372036854775807

# torch.Tensor methods and functions returning something that is not a tensor.
NON_TENSOR_METHODS = frozenset(
    {
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "item",
        "tolist",
        "stride",
        "storage_offset",
        "element_size",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "data_ptr",
        "get_device",
        "__len__",
        "sym_size",
        "sym_numel",
        "sym_stride",
    }
)
NON_TENSOR_ATTRIBUTES = frozenset(
    {"shape", "dtype", "device", "ndim", "is_cuda", "layout", "requires_grad", "names"}
)
VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH"})

# Functions whose schema claims a fresh result but which may return their input itself
# or a view of it (checked on real tensors by the tests).
ALIASING_DESPITE_SCHEMA = frozenset(
    {
        "dropout",
        "feature_dropout",
        "alpha_dropout",
        "feature_alpha_dropout",
        "dropout1d",
        "dropout2d",
        "dropout3d",
        "type_as",
        "einsum",
        "atleast_1d",
        "atleast_2d",
        "atleast_3d",
        "broadcast_tensors",
        "meshgrid",
        "cartesian_prod",
        "sum_to_size",
        "conj_physical",
        "dequantize",
        "to_dense",
        "data",
        "unsafe_split",
        "unsafe_chunk",
        "unsafe_split_with_sizes",
    }
)

# In-place methods which do not change values but metadata or autograd state.
NON_VALUE_INPLACE = frozenset({"requires_grad_", "share_memory_", "retain_grad_", "detach_"})
# In-place methods changing the tensor's metadata (shape, strides, storage).
METADATA_INPLACE = frozenset(
    {
        "squeeze_",
        "unsqueeze_",
        "transpose_",
        "t_",
        "swapdims_",
        "swapaxes_",
        "as_strided_",
        "resize_",
        "resize_as_",
        "set_",
    }
)
# Functional twins whose result keeps the dtype of ``self`` whatever the other arguments.
DTYPE_PRESERVING = frozenset(
    {
        "copy",
        "fill",
        "zero",
        "index_put",
        "masked_fill",
        "masked_scatter",
        "index_fill",
        "index_copy",
        "scatter",
        "scatter_add",
        "scatter_reduce",
        "index_add",
        "clamp",
        "clip",
        "slice_scatter",
        "select_scatter",
    }
)

INPLACE_OPERATORS = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod,
    operator.ipow: operator.pow,
    operator.iand: operator.and_,
    operator.ior: operator.or_,
    operator.ixor: operator.xor,
    operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
    operator.imatmul: operator.matmul,
}
FUNCTIONAL_OPERATORS = frozenset(
    {
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.floordiv,
        operator.mod,
        operator.pow,
        operator.and_,
        operator.or_,
        operator.xor,
        operator.lshift,
        operator.rshift,
        operator.matmul,
        operator.neg,
        operator.invert,
        operator.pos,
        operator.abs,
        operator.eq,
        operator.ne,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
    }
)

# Activation modules with an ``inplace`` flag and their functional form.
INPLACE_MODULES = {
    torch.nn.ReLU: lambda m: (torch.nn.functional.relu, ()),
    torch.nn.ReLU6: lambda m: (torch.nn.functional.relu6, ()),
    torch.nn.LeakyReLU: lambda m: (torch.nn.functional.leaky_relu, (m.negative_slope,)),
    torch.nn.ELU: lambda m: (torch.nn.functional.elu, (m.alpha,)),
    torch.nn.CELU: lambda m: (torch.nn.functional.celu, (m.alpha,)),
    torch.nn.SELU: lambda m: (torch.nn.functional.selu, ()),
    torch.nn.SiLU: lambda m: (torch.nn.functional.silu, ()),
    torch.nn.Mish: lambda m: (torch.nn.functional.mish, ()),
    torch.nn.Hardswish: lambda m: (torch.nn.functional.hardswish, ()),
    torch.nn.Hardsigmoid: lambda m: (torch.nn.functional.hardsigmoid, ()),
    torch.nn.Hardtanh: lambda m: (torch.nn.functional.hardtanh, (m.min_val, m.max_val)),
    torch.nn.Threshold: lambda m: (torch.nn.functional.threshold, (m.threshold, m.value)),
    # dropout in place: the identity in eval mode (diffusers' UNet1D attention blocks)
    torch.nn.Dropout: lambda m: (torch.nn.functional.dropout, (m.p, m.training)),
    torch.nn.Dropout1d: lambda m: (torch.nn.functional.dropout1d, (m.p, m.training)),
    torch.nn.Dropout2d: lambda m: (torch.nn.functional.dropout2d, (m.p, m.training)),
    torch.nn.Dropout3d: lambda m: (torch.nn.functional.dropout3d, (m.p, m.training)),
    torch.nn.AlphaDropout: lambda m: (torch.nn.functional.alpha_dropout, (m.p, m.training)),
    torch.nn.FeatureAlphaDropout: lambda m: (
        torch.nn.functional.feature_alpha_dropout,
        (m.p, m.training),
    ),
}
# torch.nn.functional functions no aten operator of their name describes, which always
# return new tensors (the upsampling kernels allocate their output, whatever the size)
FRESH_FUNCTIONS = frozenset(
    {
        torch.nn.functional.interpolate,
        torch.nn.functional.upsample,
        torch.nn.functional.upsample_nearest,
        torch.nn.functional.upsample_bilinear,
        torch.nn.functional.grid_sample,
        torch.nn.functional.affine_grid,
    }
)

# Modules always returning a new tensor.
FRESH_MODULES = (
    torch.nn.Linear,
    torch.nn.Bilinear,
    torch.nn.modules.conv._ConvNd,
    torch.nn.modules.batchnorm._NormBase,
    torch.nn.LayerNorm,
    torch.nn.GroupNorm,
    torch.nn.RMSNorm,
    torch.nn.Embedding,
    torch.nn.GELU,
    torch.nn.Tanh,
    torch.nn.Sigmoid,
    torch.nn.Softmax,
    torch.nn.LogSoftmax,
    torch.nn.Softplus,
    torch.nn.modules.pooling._MaxPoolNd,
    torch.nn.modules.pooling._AvgPoolNd,
    # F.pad copies, even with no padding (RWKV's time shift, `ZeroPad2d((0, 0, 1, -1))`,
    # then writes its first position: taken for a view, the write was refused)
    torch.nn.modules.padding._ConstantPadNd,
    torch.nn.modules.padding._ReflectionPadNd,
    torch.nn.modules.padding._ReplicationPadNd,
    torch.nn.modules.padding._CircularPadNd,
)


def tensor_type_kind(schema_type: Any) -> str | None:
    """``"tensor"``, ``"list"`` (a list of tensors) or None for a schema argument type."""
    if isinstance(schema_type, torch.OptionalType):
        schema_type = schema_type.getElementType()
    if isinstance(schema_type, torch.TensorType):
        return "tensor"
    if isinstance(schema_type, torch.ListType):
        element = schema_type.getElementType()
        if isinstance(element, torch.OptionalType):
            element = element.getElementType()
        if isinstance(element, torch.TensorType):
            return "list"
    return None


def example_value(node: Any) -> Any:
    """Returns the value recorded on a node by the tracer (``meta["val"]``) or None."""
    if not isinstance(node, Node):
        return node
    for key in ("val", "example_value"):
        if key in node.meta:
            return node.meta[key]
    return None


def callable_name(node: Node) -> str | None:
    """Name used to look an operation up among aten ops, or None for non-torch callables."""
    target = node.target
    if node.op == "call_method":
        return target
    if node.op != "call_function":
        return None
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.split("::")[-1]
    try:
        if target in _OPERATOR_FUNCTIONS:
            return None
        owner = _TORCH_OWNERS.get(target)
    except TypeError:  # an unhashable callable
        owner = None
    name = getattr(target, "__name__", None)
    if name is None:
        return None
    # the namespace found last time, checked again (it may have been patched since)
    if owner is not None and getattr(owner, name, None) is target:
        return name
    for owner in (torch.Tensor, torch, torch.nn.functional, torch.special, torch.linalg):
        if getattr(owner, name, None) is target:
            with contextlib.suppress(TypeError):
                _TORCH_OWNERS[target] = owner
            return name
    return None


#: the functions of ``operator`` (``x + y`` in a graph): never torch's
_OPERATOR_FUNCTIONS = frozenset(f for f in vars(operator).values() if callable(f))
#: the torch namespace each torch function was found in (the passes ask for every node)
_TORCH_OWNERS: dict[Any, Any] = {}


@functools.cache
def aten_packet(name: str) -> Any:
    try:
        return getattr(aten, name)
    except (AttributeError, RuntimeError):
        return None


def overload_schemas(packet: Any) -> list[Any]:
    """Schemas of the functional overloads taking a tensor (or tensors) first."""
    schemas = []
    for name in packet.overloads():
        schema = getattr(packet, name)._schema
        if schema.is_mutable or not schema.arguments:
            continue
        if tensor_type_kind(schema.arguments[0].type) is not None:
            schemas.append(schema)
    return schemas


@functools.cache
def aten_returns_fresh(name: str) -> bool | None:
    """Tells if every overload of ``aten.<name>`` returns new tensors (None if unknown)."""
    if name in ALIASING_DESPITE_SCHEMA:
        return False
    packet = aten_packet(name)
    if packet is None:
        return None
    schemas = overload_schemas(packet)
    if not schemas:
        return None
    return all(r.alias_info is None for s in schemas for r in s.returns)


@functools.cache
def aten_returns_tensor(name: str) -> bool | None:
    """Tells if every overload of ``aten.<name>`` returns a single tensor (None if unknown)."""
    packet = aten_packet(name)
    if packet is None:
        return None
    schemas = overload_schemas(packet)
    single = [
        len(s.returns) == 1 and isinstance(s.returns[0].type, torch.TensorType) for s in schemas
    ]
    if not single:
        return None
    if all(single):
        return True
    # overloads disagree (torch.max(x) vs torch.max(x, 0)): unknown without meta["val"]
    return False if not any(single) else None


def is_tensor(node: Any) -> bool | None:
    """Tells if a node produces a tensor: True, False, or None when it cannot be proven."""
    if not isinstance(node, Node):
        return isinstance(node, torch.Tensor)
    val = example_value(node)
    if val is not None:
        return isinstance(val, torch.Tensor)
    if node.op == "placeholder" and "val" in node.meta:
        # an input the tracer recorded with the value None (a model's optional mask
        # traced without one): unknown, it would join every input in one aliasing
        # class, and a write into one input would be refused while another is read
        return False
    if "tensor_meta" in node.meta and node.meta["tensor_meta"] is not None:
        return hasattr(node.meta["tensor_meta"], "shape")
    if node.type in ("torch.Tensor", "Tensor"):
        # annotation kept as a string (``from __future__ import annotations``)
        return True
    if isinstance(node.type, type):
        if issubclass(node.type, torch.Tensor):
            return True
        if node.type in (int, float, bool, tuple, list, torch.Size):
            return False
    if node.op == "get_attr":
        owner = node.graph.owning_module
        if owner is not None:
            try:
                attr = owner.get_submodule("") if not node.target else fetch_attr(owner, node)
            except AttributeError:
                return None
            return isinstance(attr, torch.Tensor)
        return None
    if node.op == "call_module":
        module = module_of(node)
        if isinstance(module, (*FRESH_MODULES, torch.nn.Identity, torch.nn.Dropout)):
            return True
        if module is not None and type(module) in INPLACE_MODULES:
            return True
        return None
    if node.op == "call_method":
        if node.target in NON_TENSOR_METHODS:
            return False
        if node.target in ("split", "chunk", "unbind", "tensor_split"):
            return False
        if node.args and is_tensor(node.args[0]) is True:
            ret = aten_returns_tensor(node.target.rstrip("_"))
            if ret is not None:
                return ret
        return None
    if node.op != "call_function":
        return None
    target = node.target
    if target is builtins.getattr:
        attr = node.args[1]
        if attr in NON_TENSOR_ATTRIBUTES:
            return False
        if attr in VIEW_ATTRIBUTES or attr in ("data", "grad", "real", "imag"):
            return is_tensor(node.args[0])
        return None
    if target is operator.getitem:
        base = node.args[0]
        if is_tensor(base) is True or returns_only_tensors(base):
            return True
        return None
    if target in FUNCTIONAL_OPERATORS or target in INPLACE_OPERATORS:
        kinds = [is_tensor(a) for a in node.args]
        if any(k is True for k in kinds):
            return True
        if all(k is False for k in kinds):
            return False
        return None
    if isinstance(target, torch._ops.OpOverload):
        returns = target._schema.returns
        return len(returns) == 1 and isinstance(returns[0].type, torch.TensorType)
    name = callable_name(node)
    if name is not None:
        return aten_returns_tensor(name)
    return None


def returns_only_tensors(node: Any) -> bool:
    """Tells if a node returns a tuple or list made of tensors only (sort, split...)."""
    if not isinstance(node, Node) or node.op not in ("call_function", "call_method"):
        return False
    if isinstance(node.target, torch._ops.OpOverload):
        schemas = [node.target._schema]
    else:
        name = callable_name(node)
        packet = aten_packet(name) if name is not None else None
        if packet is None or (node.op == "call_method" and is_tensor(node.args[0]) is not True):
            return False
        schemas = overload_schemas(packet)
    return bool(schemas) and all(
        r and all(tensor_type_kind(t.type) is not None for t in r)
        for r in (s.returns for s in schemas)
    )


def copy_node(graph: Any, node: Node, transform: Any) -> Node:
    """Copies ``node`` into ``graph`` at the insertion point, ``transform`` mapping its
    node arguments.

    Unlike ``Graph.node_copy``, the copy does not start from the node's name: the
    namespace would walk every used suffix (``sub_3``, ``sub_4``...), quadratic over a
    graph made of many copies.
    """
    from torch.fx.node import map_arg

    copy = graph.create_node(
        node.op, node.target, map_arg(node.args, transform), map_arg(node.kwargs, transform)
    )
    copy.meta = dict(node.meta)
    return copy


#: the owners waiting for their code in this thread's :func:`one_recompile` block
_pending = threading.local()


@contextlib.contextmanager
def one_recompile() -> Iterator[None]:
    """Inside the block, :func:`recompile_owner` notes the owners; each regenerates its
    code once, at the end: a pipeline of passes pays one code generation (a few
    milliseconds on a transformer's graph) instead of one per pass. Nested blocks
    belong to the outermost one; other threads recompile as usual."""
    if getattr(_pending, "owners", None) is not None:
        yield
        return
    owners: dict[int, torch.fx.GraphModule] = {}
    _pending.owners = owners
    try:
        yield
    except BaseException:
        _pending.owners = None
        # best effort: the passes that ended before the error changed the graph
        for owner in owners.values():
            with contextlib.suppress(Exception):
                owner.recompile()
        raise
    _pending.owners = None
    for owner in owners.values():
        owner.recompile()


def recompile_owner(graph: Any) -> None:
    """Regenerates the code of the ``GraphModule`` owning a graph, if any (at the end of
    the enclosing :func:`one_recompile` block, if there is one)."""
    owner = graph.owning_module
    if isinstance(owner, torch.fx.GraphModule):
        owners = getattr(_pending, "owners", None)
        if owners is None:
            owner.recompile()
        else:
            owners[id(owner)] = owner


def fetch_attr(owner: torch.nn.Module, node: Node) -> Any:
    value: Any = owner
    for part in node.target.split("."):
        value = getattr(value, part)
    return value


def module_of(node: Node) -> torch.nn.Module | None:
    owner = node.graph.owning_module
    if owner is None:
        return None
    try:
        return owner.get_submodule(node.target)
    except AttributeError:
        return None


_MISSING = object()


def module_lookup(graph: Graph) -> Callable[[Node], torch.nn.Module | None]:
    """:func:`module_of` for the nodes of one graph, each module along a path looked up
    once (the calls of a model share their prefixes, ``encoder.block.0.layer.0...``).

    The same attribute lookups as ``Module.get_submodule``, made once per prefix: the
    module tree must not change while the returned function is used.
    """
    owner = graph.owning_module
    if owner is None or type(owner).get_submodule is not torch.nn.Module.get_submodule:
        return module_of
    found: dict[str, Any] = {"": owner}

    def lookup(target: str) -> Any:
        module = found.get(target, _MISSING)
        if module is _MISSING:
            parent, dot, item = target.rpartition(".")
            # "" is the root only as the whole target (".x" has an empty first name)
            base = None if dot and not parent else lookup(parent)
            module = None
            if base is not None and hasattr(base, item):
                module = getattr(base, item)
                if not isinstance(module, torch.nn.Module):
                    module = None
            found[target] = module
        return module

    def of(node: Node) -> torch.nn.Module | None:
        target = node.target
        return lookup(target) if type(target) is str else module_of(node)

    return of


@contextlib.contextmanager
def owned_by(graph: Graph, module: torch.nn.Module | None) -> Iterator[None]:
    """Inside the block, ``module`` owns ``graph`` when the graph has no owner yet (right
    after a trace): its attributes and submodules are then found by the passes."""
    if module is None or graph.owning_module is not None:
        yield
        return
    graph.owning_module = module
    try:
        yield
    finally:
        graph.owning_module = None
