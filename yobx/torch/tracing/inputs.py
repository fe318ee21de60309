"""Example inputs of a trace: binding to the signature, flattening, dynamic shapes.

Structured inputs (tuples, lists, dicts, ``None``, ``transformers.DynamicCache``) are
flattened with :mod:`torch.utils._pytree`; every tensor leaf becomes one placeholder
named after its path (``past_key_values_key_cache_0``). Python scalars are baked into
the graph as constants (as torch.export does) and reported as guards.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from .symbolic import DEFAULT_MIN, SymbolicDimensions


@dataclasses.dataclass
class FlatInputs:
    """The example inputs of a trace, bound to the signature and flattened.

    :param arg_names: names of the given parameters, in signature order
    :param keyword_names: those passed by keyword (all but positional-only ones)
    :param in_spec: pytree spec of ``tuple(values of arg_names)``
    :param names: placeholder name of each leaf
    :param leaves: example value of each leaf
    :param sizes: for each tensor leaf, its sizes (ints and SymInts), else None
    """

    arg_names: list[str]
    keyword_names: set[str]
    in_spec: pytree.TreeSpec
    names: list[str]
    leaves: list[Any]
    sizes: list[list[int | torch.SymInt] | None]

    def call(self, fn: Callable, leaves: list[Any], self_arg: Any = None) -> Any:
        """Calls ``fn`` with the structured arguments rebuilt from ``leaves``."""
        values = pytree.tree_unflatten(list(leaves), self.in_spec)
        args = [] if self_arg is None else [self_arg]
        kwargs = {}
        for name, value in zip(self.arg_names, values):
            if name in self.keyword_names:
                kwargs[name] = value
            else:
                args.append(value)
        return fn(*args, **kwargs)


def bind_example_inputs(
    fn: Callable, concrete_args: dict[str, Any] | None, skip_self: bool
) -> tuple[list[str], set[str], list[Any]]:
    """Matches ``concrete_args`` to the signature of ``fn``.

    :return: given parameter names in signature order, the keyword ones, their values
    :raises TypeError: unknown names or missing required parameters
    """
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    if skip_self and params:
        params = params[1:]
    concrete_args = dict(concrete_args or {})
    where = f"{getattr(fn, '__qualname__', fn)}{signature}"
    var_keyword = any(p.kind == p.VAR_KEYWORD for p in params)
    known = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    unknown = [k for k in concrete_args if k not in known]
    if unknown and not var_keyword:
        raise TypeError(
            f"concrete_args names {unknown} which are not parameters of {where}; "
            f"valid names are {sorted(known)}"
        )
    names, keyword, values = [], set(), []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in concrete_args:
            names.append(p.name)
            values.append(concrete_args[p.name])
            if p.kind != p.POSITIONAL_ONLY:
                keyword.add(p.name)
        elif p.default is inspect.Parameter.empty:
            raise TypeError(
                f"concrete_args has no example for parameter {p.name!r} of {where}; "
                f"CustomTracer needs an example value for every parameter without a "
                f"default: pass concrete_args={{{p.name!r}: <example>, ...}}"
            )
    for k in unknown:
        names.append(k)
        keyword.add(k)
        values.append(concrete_args[k])
    return names, keyword, values


def flatten_example_inputs(
    arg_names: list[str],
    keyword_names: set[str],
    values: list[Any],
    dynamic_shapes: Any,
    dims: SymbolicDimensions,
) -> FlatInputs:
    """Flattens example values and gives each tensor leaf its (symbolic) sizes."""
    register_cache_flattening(values)
    leaves_with_path, in_spec = pytree.tree_flatten_with_path(tuple(values))
    specs = _dynamic_specs_per_leaf(arg_names, values, dynamic_shapes)
    names, leaves, sizes = [], [], []
    used: set[str] = set()
    for (path, leaf), spec in zip(leaves_with_path, specs):
        name = _leaf_name(arg_names, path)
        base, i = name, 1
        while name in used:
            name = f"{base}_{i}"
            i += 1
        used.add(name)
        names.append(name)
        leaves.append(leaf)
        if isinstance(leaf, torch.Tensor):
            sizes.append(_sizes(name, leaf, spec, dims))
        else:
            if spec:
                raise ValueError(
                    f"dynamic_shapes gives dynamic dimensions {spec} to input {name!r}, "
                    f"which is a {type(leaf).__name__}, not a tensor"
                )
            sizes.append(None)
    return FlatInputs(arg_names, keyword_names, in_spec, names, leaves, sizes)


def key_path_parts(path: tuple) -> list[str]:
    """Readable parts of a pytree key path: indices, dict keys, attribute names."""
    parts = []
    for key in path:
        if isinstance(key, pytree.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, pytree.MappingKey):
            parts.append(str(key.key))
        elif isinstance(key, pytree.GetAttrKey):
            parts.append(key.name)
        else:
            parts.append(str(key))
    return parts


def _leaf_name(arg_names: list[str], path: tuple) -> str:
    name = "_".join([arg_names[path[0].idx], *key_path_parts(path[1:])])
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


# dynamic shapes

# torch's pytree keeps None as a leaf in some versions and as an empty node in others.
_NONE_IS_LEAF = len(pytree.tree_leaves(None)) == 1


def _dynamic_specs_per_leaf(arg_names: list[str], values: list[Any], dynamic_shapes: Any):
    """Returns, for each pytree leaf of ``values``, a dict ``{axis: Dim or name}``."""
    if dynamic_shapes is None:
        n = len(pytree.tree_leaves(tuple(values)))
        return [{} for _ in range(n)]
    if isinstance(dynamic_shapes, dict):
        unknown = [k for k in dynamic_shapes if k not in arg_names]
        if unknown:
            raise ValueError(
                f"dynamic_shapes names {unknown} which are not among the traced inputs "
                f"{arg_names}; dynamic_shapes must be keyed by parameter name"
            )
        per_arg = [dynamic_shapes.get(name) for name in arg_names]
    elif isinstance(dynamic_shapes, (tuple, list)):
        if len(dynamic_shapes) != len(arg_names):
            raise ValueError(
                f"dynamic_shapes has {len(dynamic_shapes)} entries but the traced inputs "
                f"are {arg_names}; give one entry per input (None for static ones)"
            )
        per_arg = list(dynamic_shapes)
    else:
        raise TypeError(
            f"dynamic_shapes must be a dict keyed by parameter name or a tuple, "
            f"not {type(dynamic_shapes).__name__}"
        )
    result: list[dict] = []
    for name, value, spec in zip(arg_names, values, per_arg):
        _match(value, spec, name, result)
    return result


def _is_tensor_spec(spec: Any) -> bool:
    if isinstance(spec, dict):
        return all(isinstance(k, int) for k in spec)
    return False


def _match(value: Any, spec: Any, path: str, out: list[dict]) -> None:
    """Walks ``value`` and ``spec`` together, appending one axis spec per leaf."""
    if isinstance(value, torch.Tensor):
        if spec is None:
            out.append({})
        elif _is_tensor_spec(spec):
            out.append(dict(spec))
        elif isinstance(spec, (tuple, list)) and all(
            s is None or isinstance(s, (str, torch.export.Dim)) or _is_dim(s) for s in spec
        ):
            if len(spec) != value.dim():
                raise ValueError(
                    f"dynamic_shapes for {path!r} lists {len(spec)} axes but the input has "
                    f"{value.dim()} dimensions (shape {tuple(value.shape)})"
                )
            out.append({i: s for i, s in enumerate(spec) if s is not None})
        else:
            raise ValueError(
                f"dynamic_shapes for tensor input {path!r} must be a dict "
                f"{{axis: Dim or name}} or a list with one entry per axis, got {spec!r}"
            )
        return
    node_type = type(value)
    if value is None or node_type not in pytree.SUPPORTED_NODES:
        if spec not in (None, {}, [], ()):
            raise ValueError(
                f"dynamic_shapes gives {spec!r} for {path!r}, which is a "
                f"{node_type.__name__}, not a tensor or a container of tensors"
            )
        if value is not None or _NONE_IS_LEAF:
            out.append({})
        return
    children, context = pytree.SUPPORTED_NODES[node_type].flatten_fn(value)
    if spec is None:
        for i, child in enumerate(children):
            _match(child, None, f"{path}[{i}]", out)
        return
    if isinstance(value, dict) and isinstance(spec, dict) and not _is_tensor_spec(spec):
        unknown = [k for k in spec if k not in value]
        if unknown:
            raise ValueError(f"dynamic_shapes for {path!r} names unknown keys {unknown}")
        for key, child in zip(context, children):
            _match(child, spec.get(key), f"{path}[{key!r}]", out)
        return
    if isinstance(spec, (tuple, list)) and len(spec) == len(children):
        for i, (child, s) in enumerate(zip(children, spec)):
            _match(child, s, f"{path}[{i}]", out)
        return
    raise ValueError(
        f"dynamic_shapes for {path!r} does not match the structure of the input "
        f"({node_type.__name__} with {len(children)} children): got {spec!r}"
    )


def _is_dim(spec: Any) -> bool:
    return (hasattr(spec, "__name__") and hasattr(spec, "min")) or type(spec).__name__ in (
        "_DimHint",
        "_DerivedDim",
    )


def _sizes(name: str, tensor: torch.Tensor, spec: dict, dims: SymbolicDimensions) -> list:
    sizes: list[int | torch.SymInt] = list(tensor.shape)
    for axis, dim in spec.items():
        if not isinstance(axis, int) or not -tensor.dim() <= axis < tensor.dim():
            raise ValueError(
                f"dynamic_shapes for input {name!r} names axis {axis!r} but the input has "
                f"{tensor.dim()} dimensions (shape {tuple(tensor.shape)})"
            )
        axis = axis % tensor.dim()
        sizes[axis] = _symbol_for(name, axis, int(tensor.shape[axis]), dim, dims)
    return sizes


def _symbol_for(name: str, axis: int, hint: int, dim: Any, dims: SymbolicDimensions):
    if dim is None:
        return hint
    if isinstance(dim, str):
        return dims.dimension(dim, hint)
    kind = type(dim).__name__
    if kind == "_DimHint":
        hint_name = str(dim)
        if "STATIC" in hint_name:
            return hint
        return dims.dimension(f"{name}_dim_{axis}", hint)
    if kind == "_DerivedDim":
        root = dim.root
        # The root's size follows from this size; solve the (linear) derivation.
        root_hint = _solve_root(dim, hint)
        root_sym = dims.dimension(root.__name__, root_hint, *_bounds(root))
        derived = dim.fn(root_sym)
        if dims.hint(derived) != hint:
            raise ValueError(
                f"input {name!r} axis {axis} has size {hint} which does not match the "
                f"derived dimension {dim.__name__}"
            )
        return derived
    if hasattr(dim, "__name__"):
        return dims.dimension(dim.__name__, hint, *_bounds(dim))
    raise ValueError(
        f"dynamic_shapes for input {name!r} axis {axis}: expected torch.export.Dim, "
        f"a name string or None, got {dim!r}"
    )


def _bounds(dim: Any) -> tuple[int | None, Any]:
    low = getattr(dim, "min", None)
    # torch.export.Dim defaults to min=0 although export treats sizes 0 and 1 as
    # static; a dynamic dimension starts at 2 unless min is 1 or more.
    if low is not None and low < 1:
        low = DEFAULT_MIN
    return low, getattr(dim, "max", None)


def _solve_root(dim: Any, size: int) -> int:
    for candidate in range(0, size + 1):
        if dim.fn(candidate) == size:
            return candidate
    raise ValueError(f"no size of {dim.root.__name__} gives {size} for {dim.__name__}")


# transformers caches


def register_cache_flattening(values: Any = None) -> None:
    """Registers ``transformers.DynamicCache`` with torch's pytree if nobody did.

    Tracing flattens inputs with pytree and the traced GraphModule flattens them again
    when called, so the registration has to outlive the trace: it is done once, only
    when a DynamicCache is seen, and only if transformers has not registered one.
    """
    # Values holding a DynamicCache imply its module was imported: tracing does not
    # pay for importing transformers (seconds) when it was not.
    cache_utils = sys.modules.get("transformers.cache_utils")
    if cache_utils is None:
        if values is not None:
            return
        try:
            import transformers.cache_utils as cache_utils
        except ImportError:  # pragma: no cover - transformers is optional
            return
    cls = cache_utils.DynamicCache
    if cls in pytree.SUPPORTED_NODES:
        return
    if values is not None and not any(isinstance(v, cls) for v in _walk(values)):
        return

    def flatten(cache):
        _check_plain_layers(cache)
        return [[lay.keys for lay in cache.layers], [lay.values for lay in cache.layers]], None

    def flatten_with_keys(cache):
        keys, values = flatten(cache)[0]
        return [
            (pytree.MappingKey("key_cache"), keys),
            (pytree.MappingKey("value_cache"), values),
        ], None

    def unflatten(children, context):
        cache = cls()
        for k, v in zip(*children):
            layer = cache_utils.DynamicLayer()
            layer.dtype, layer.device = k.dtype, k.device
            layer.keys, layer.values = k, v
            layer.is_initialized = True
            cache.layers.append(layer)
        return cache

    pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__name__}",
        flatten_with_keys_fn=flatten_with_keys,
    )
    import torch.fx._pytree as fx_pytree

    fx_pytree.register_pytree_flatten_spec(cls, lambda cache, spec: flatten(cache)[0])


def _check_plain_layers(cache: Any) -> None:
    import transformers.cache_utils as cache_utils

    for layer in cache.layers:
        if type(layer) is not cache_utils.DynamicLayer:
            raise TypeError(
                f"only DynamicCache made of DynamicLayer can be flattened, "
                f"found {type(layer).__name__}"
            )


def _walk(values: Any):
    stack = [values]
    while stack:
        v = stack.pop()
        yield v
        if isinstance(v, (tuple, list)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
