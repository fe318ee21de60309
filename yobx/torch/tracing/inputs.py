"""Example inputs of a trace: binding to the signature, flattening, dynamic shapes.

Structured inputs (tuples, lists, dicts, ``None``, ``transformers.DynamicCache``) are
flattened with :mod:`torch.utils._pytree`; every tensor leaf becomes one placeholder
named after its path (``past_key_values_key_cache_0``). Python scalars are baked into
the graph as constants (as torch.export does) and reported as guards.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from .dynamic_shapes import SCALAR, DimSpec, axes_per_leaf, axis_spec
from .symbolic.symbolic import SymbolicDimensions


class _NoExample:
    """The value of a parameter traced without an example (as torch.fx traces)."""

    def __repr__(self) -> str:
        return "NO_EXAMPLE"


#: the leaf of a parameter given no example: a placeholder without metadata
NO_EXAMPLE = _NoExample()


@dataclasses.dataclass
class FlatInputs:
    """The example inputs of a trace, bound to the signature and flattened.

    :param arg_names: names of the given parameters, in signature order
    :param keyword_names: those passed by keyword (all but positional-only ones)
    :param in_spec: pytree spec of ``tuple(values of arg_names)``
    :param names: placeholder name of each leaf
    :param leaves: example value of each leaf
    :param sizes: for each tensor leaf, its sizes (ints and SymInts); for an int
        declared dynamic, its SymInt; else None (a constant baked in)
    :param var_positional: the name of ``*args`` when it is given (a tuple)
    """

    arg_names: list[str]
    keyword_names: set[str]
    in_spec: pytree.TreeSpec
    names: list[str]
    leaves: list[Any]
    sizes: list[list[int | torch.SymInt] | torch.SymInt | None]
    var_positional: str | None = None

    def call(self, fn: Callable, leaves: list[Any], self_arg: Any = None) -> Any:
        """Calls ``fn`` with the structured arguments rebuilt from ``leaves``."""
        values = pytree.tree_unflatten(list(leaves), self.in_spec)
        recount_sliding_layers(values)
        args = [] if self_arg is None else [self_arg]
        kwargs = {}
        for name, value in zip(self.arg_names, values):
            if name == self.var_positional:
                args.extend(value)
            elif name in self.keyword_names:
                kwargs[name] = value
            else:
                args.append(value)
        return fn(*args, **kwargs)


@dataclasses.dataclass
class BoundInputs:
    """Example values bound to the parameters of a function.

    :param names: the parameters given, in signature order
    :param keyword_names: those passed by keyword (all but positional-only ones and
        ``*args``)
    :param values: their values (a tuple for ``*args``)
    :param var_positional: the name of ``*args`` when it is given
    """

    names: list[str]
    keyword_names: set[str]
    values: list[Any]
    var_positional: str | None = None


def bound_parameters(
    fn: Callable, args: tuple = (), kwargs: dict | None = None, defaults: bool = False
) -> list[tuple[inspect.Parameter, Any]]:
    """The parameters of ``fn`` a call with ``args`` and ``kwargs`` binds, each with its
    value, in signature order: the one signature binder of the package, which callers
    read as they need (``*args`` a tuple, ``**kwargs`` a dict).

    :param defaults: the parameters the call leaves out too, with their default values
    :raises TypeError: the arguments do not bind (a missing or unexpected one)
    """
    signature = inspect.signature(fn)
    bound = signature.bind(*args, **(kwargs or {}))
    if defaults:
        bound.apply_defaults()
    return [
        (parameter, bound.arguments[name])
        for name, parameter in signature.parameters.items()
        if name in bound.arguments
    ]


def bind_arguments(fn: Callable, args: tuple = (), kwargs: dict | None = None) -> dict[str, Any]:
    """Binds call arguments to the names of ``fn``'s parameters, in signature order.

    ``*args`` is bound as a tuple under its name, ``**kwargs`` is expanded: the result
    is what :func:`bind_example_inputs` (``concrete_args``) takes.
    """
    result = {}
    for parameter, value in bound_parameters(fn, args, kwargs):
        if parameter.kind == inspect.Parameter.VAR_KEYWORD:
            result.update(value)
        else:
            result[parameter.name] = value
    return result


def call_arguments(fn: Callable, named: dict[str, Any]) -> tuple[tuple, dict]:
    """The inverse of :func:`bind_arguments`: ``(args, kwargs)`` calling ``fn`` with
    the values of ``named`` (parameter name -> value, ``*args`` as a tuple)."""
    bound = bind_example_inputs(fn, named)
    args: list[Any] = []
    kwargs = {}
    for name, value in zip(bound.names, bound.values):
        if name == bound.var_positional:
            args.extend(value)
        elif name in bound.keyword_names:
            kwargs[name] = value
        else:
            args.append(value)
    return tuple(args), kwargs


def bind_example_inputs(
    fn: Callable,
    concrete_args: Mapping[str, Any] | tuple | list | None,
    allow_missing: bool = False,
) -> BoundInputs:
    """Matches ``concrete_args`` (parameter name -> example, or a tuple of positional
    examples) to the signature of ``fn``.

    ``*args`` takes a tuple under its name; names that are not parameters go to
    ``**kwargs`` when there is one.

    :param allow_missing: a parameter without default and without example is bound to
        :data:`NO_EXAMPLE` (traced as torch.fx does) instead of raising
    :raises TypeError: unknown names or missing required parameters
    """
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    where = f"{getattr(fn, '__qualname__', fn)}{signature}"
    if isinstance(concrete_args, (tuple, list)):
        concrete_args = _positional_examples(signature, concrete_args, where)
    elif concrete_args is not None and not isinstance(concrete_args, Mapping):
        raise TypeError(
            f"concrete_args must be a dict (parameter name -> example) or a tuple of "
            f"positional examples for {where}, got {type(concrete_args).__name__}"
        )
    concrete_args = dict(concrete_args or {})
    var_keyword = any(p.kind == p.VAR_KEYWORD for p in params)
    known = {p.name for p in params if p.kind != p.VAR_KEYWORD}
    unknown = [k for k in concrete_args if k not in known]
    if unknown and not var_keyword:
        raise TypeError(
            f"concrete_args names {unknown} which are not parameters of {where}; "
            f"valid names are {sorted(known)}"
        )
    bound = BoundInputs([], set(), [])
    for p in params:
        if p.kind == p.VAR_KEYWORD:
            continue
        if p.name in concrete_args:
            bound.names.append(p.name)
            value = concrete_args[p.name]
            if p.kind == p.VAR_POSITIONAL:
                if not isinstance(value, (tuple, list)):
                    raise TypeError(
                        f"concrete_args[{p.name!r}] is for *{p.name} of {where}: give a "
                        f"tuple of the positional examples, got {type(value).__name__}"
                    )
                value = tuple(value)
                bound.var_positional = p.name
            elif p.kind != p.POSITIONAL_ONLY:
                bound.keyword_names.add(p.name)
            bound.values.append(value)
        elif p.default is inspect.Parameter.empty and p.kind != p.VAR_POSITIONAL:
            if not allow_missing:
                raise TypeError(
                    f"concrete_args has no example for parameter {p.name!r} of {where}; "
                    f"an example value is needed for every parameter without a "
                    f"default: pass concrete_args={{{p.name!r}: <example>, ...}}"
                )
            # traced as torch.fx does: a placeholder whose value is unknown
            bound.names.append(p.name)
            bound.values.append(NO_EXAMPLE)
            if p.kind != p.POSITIONAL_ONLY:
                bound.keyword_names.add(p.name)
    if bound.var_positional is not None:
        # the parameters before *args are given positionally (by keyword, they would
        # collide with the positional values filling *args)
        before = itertools.takewhile(lambda p: p.kind != p.VAR_POSITIONAL, params)
        bound.keyword_names.difference_update(p.name for p in before)
    for k in unknown:
        bound.names.append(k)
        bound.keyword_names.add(k)
        bound.values.append(concrete_args[k])
    return bound


def _positional_examples(
    signature: inspect.Signature, examples: tuple | list, where: str
) -> dict[str, Any]:
    """Positional examples by parameter name (``*args`` gets the tuple of the extra ones)."""
    try:
        return dict(signature.bind_partial(*examples).arguments)
    except TypeError as e:
        raise TypeError(
            f"{len(examples)} positional examples do not fit {where}: {e}; pass "
            f"concrete_args as a dict (parameter name -> example) to be explicit"
        ) from e


def flatten_example_inputs(
    bound: BoundInputs, dynamic_shapes: Any, dims: SymbolicDimensions
) -> FlatInputs:
    """Flattens example values and gives each tensor leaf its (symbolic) sizes."""
    arg_names, values = bound.names, bound.values
    register_cache_flattening(values)
    leaves_with_path, in_spec = pytree.tree_flatten_with_path(tuple(values))
    specs = axes_per_leaf(arg_names, values, dynamic_shapes)
    names = leaf_names(arg_names, [path for path, _ in leaves_with_path])
    leaves: list[Any] = []
    sizes: list[list[int | torch.SymInt] | torch.SymInt | None] = []
    # axes declared by an expression of other dimensions ("past + seq"), computed
    # once every dimension is known, whichever input names it
    expressions: list[tuple[list, int, DimSpec, str]] = []
    for (_, leaf), spec, name in zip(leaves_with_path, specs, names):
        leaves.append(leaf)
        if isinstance(leaf, torch.Tensor):
            sizes.append(_sizes(name, leaf, spec, dims, expressions))
        elif SCALAR in spec and type(leaf) is int:
            sizes.append(_scalar(name, leaf, spec[SCALAR], dims))
        elif leaf is NO_EXAMPLE:
            if spec:
                raise ValueError(
                    f"dynamic_shapes gives dynamic dimensions {spec} to input {name!r}, "
                    f"which has no example in concrete_args: give one"
                )
            sizes.append(None)
        else:
            if spec:
                raise ValueError(
                    f"dynamic_shapes gives dynamic dimensions {spec} to input {name!r}, "
                    f"which is a {type(leaf).__name__}, not a tensor"
                )
            sizes.append(None)
    for leaf_sizes, axis, axis_spec_, name in expressions:
        hint = int(leaf_sizes[axis])
        leaf_sizes[axis] = dims.expression_dimension(axis_spec_, hint, (name, axis))
    return FlatInputs(
        arg_names, bound.keyword_names, in_spec, names, leaves, sizes, bound.var_positional
    )


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


def leaf_names(arg_names: list[str], paths: list[tuple]) -> list[str]:
    """The placeholder name of each flattened input leaf (``past_key_values_key_cache_0``),
    from its pytree key path in ``tuple(values of arg_names)``; unique."""
    names = []
    used: set[str] = set()
    for path in paths:
        name = _leaf_name(arg_names, path)
        base, i = name, 1
        while name in used:
            name = f"{base}_{i}"
            i += 1
        used.add(name)
        names.append(name)
    return names


def placeholder_names(arg_names: list[str], paths: list[tuple]) -> list[str]:
    """The names torch.fx gives the placeholders of :func:`leaf_names` (the capture's
    input names): ``K`` becomes ``k``, ``input`` becomes ``input_1``."""
    graph = torch.fx.Graph()
    return [graph.placeholder(name).name for name in leaf_names(arg_names, paths)]


def _leaf_name(arg_names: list[str], path: tuple) -> str:
    name = "_".join([arg_names[path[0].idx], *key_path_parts(path[1:])])
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _scalar(name: str, value: int, entry: Any, dims: SymbolicDimensions) -> torch.SymInt:
    """The SymInt of an int argument declared dynamic."""
    spec = axis_spec(entry, name, SCALAR)
    # a static entry (None, Dim.STATIC) was left out by axes_per_leaf
    assert spec is not None
    if spec.expression is not None:
        raise ValueError(
            f"dynamic_shapes declares the int argument {name!r} as {spec.name!r}: an int "
            f"argument takes a dimension name or a Dim, not an expression; compute "
            f"{spec.name!r} in the model from the inputs it names"
        )
    if spec.derived is not None:
        return dims.derived_dimension(spec, value, source=(name, SCALAR))
    return dims.dimension(spec.name, value, spec.min, spec.max, spec.policy, source=(name, SCALAR))


def _sizes(
    name: str, tensor: torch.Tensor, axes: dict, dims: SymbolicDimensions, expressions: list
) -> list[int | torch.SymInt]:
    """The sizes of a tensor input, a SymInt for each axis declared dynamic; the axes
    declared by an expression are appended to ``expressions`` (sizes, axis, spec,
    name) and keep their example size until the caller computes them."""
    sizes: list[int | torch.SymInt] = list(tensor.shape)
    for axis, entry in axes.items():
        spec = axis_spec(entry, name, axis)
        if spec is None:
            continue
        hint = int(tensor.shape[axis])
        if spec.expression is not None:
            expressions.append((sizes, axis, spec, name))
        elif spec.derived is not None:
            sizes[axis] = dims.derived_dimension(spec, hint, source=(name, axis))
        else:
            sizes[axis] = dims.dimension(
                spec.name, hint, spec.min, spec.max, spec.policy, source=(name, axis)
            )
    return sizes


# transformers caches


def register_cache_flattening(values: Any = None) -> None:
    """Registers ``transformers.DynamicCache`` (and ``EncoderDecoderCache``, a pair of
    them: the decoder's self-attention cache and the cross-attention cache) with
    torch's pytree if nobody did.

    Tracing flattens inputs with pytree and the traced GraphModule flattens them again
    when called, so the registration has to outlive the trace: it is done once, only
    when such a cache is seen, and only if transformers has not registered one.

    :param values: the inputs about to be flattened: nothing is done unless one of them
        holds a cache; ``None`` registers whenever transformers is importable
    """
    # Values holding a DynamicCache imply its module was imported: tracing does not
    # pay for importing transformers (seconds) when it was not.
    cache_utils = sys.modules.get("transformers.cache_utils")
    if cache_utils is None:
        if values is not None:
            return
        try:
            import transformers.cache_utils as imported
        except ImportError:  # pragma: no cover - transformers is optional
            return
        cache_utils = imported
    classes = (cache_utils.DynamicCache, cache_utils.EncoderDecoderCache)
    if all(cls in pytree.SUPPORTED_NODES for cls in classes):
        return
    if values is not None and not any(isinstance(v, classes) for v in _walk(values)):
        return
    if cache_utils.DynamicCache not in pytree.SUPPORTED_NODES:
        _register_dynamic_cache(cache_utils)
    if cache_utils.EncoderDecoderCache not in pytree.SUPPORTED_NODES:
        _register_encoder_decoder_cache(cache_utils.EncoderDecoderCache)


def _register_dynamic_cache(cache_utils: Any) -> None:
    cls = cache_utils.DynamicCache

    def flatten(cache):
        # the context: None for a cache of plain layers, else each layer's sliding
        # window (None for a plain layer)
        windows = _layer_windows(cache)
        context = None if all(w is None for w in windows) else tuple(windows)
        keys, values = [lay.keys for lay in cache.layers], [lay.values for lay in cache.layers]
        return [keys, values], context

    def flatten_with_keys(cache):
        (keys, values), context = flatten(cache)
        return [
            (pytree.MappingKey("key_cache"), keys),
            (pytree.MappingKey("value_cache"), values),
        ], context

    def unflatten(children, context):
        cache = cls()
        windows = context or [None] * len(children[0])
        for k, v, window in zip(*children, windows):
            if window is None:
                layer = cache_utils.DynamicLayer()
            else:
                layer = _sliding_layer(cache_utils, k, window)
            layer.dtype, layer.device = getattr(k, "dtype", None), getattr(k, "device", None)
            layer.keys, layer.values = k, v
            layer.is_initialized = True
            cache.layers.append(layer)
        return cache

    _register(cls, flatten, unflatten, flatten_with_keys)


def _sliding_layer(cache_utils: Any, keys: torch.Tensor, window: int) -> Any:
    """A sliding-window layer holding ``keys`` (see :func:`count_from_keys`)."""
    layer = cache_utils.DynamicSlidingWindowLayer(window)
    layer.keys = keys
    if isinstance(keys, torch.Tensor) and keys.dim() >= 2:
        count_from_keys(layer)
    # else: a stand-in of the structure (naming the outputs), not a cache
    return layer


def count_from_keys(layer: Any) -> None:
    """Sets the count of positions a sliding-window layer saw (``cumulative_length``,
    which its masks read) from its keys' length.

    The count is no tensor: it is the keys' length until the window is full, after
    which the keys stop growing and the count is lost. While tracing, a check of the
    graph says so (``past < window - 1``): the exported step is exact until the window
    is full, and refuses the step after, naming the check. Rebuilt from real tensors, a
    full layer's count is the best known.
    """
    window = int(layer.sliding_window)
    length = layer.keys.shape[-2]
    if not isinstance(length, int):
        torch._check(
            length < window - 1,
            f"a sliding-window cache layer holds {window - 1} positions at most, and its "
            f"count of positions seen is only known before it is full: the exported step "
            f"takes fewer than {window - 1}",
        )
    layer.cumulative_length = length


def recount_sliding_layers(values: Any) -> None:
    """Makes the sliding-window layers of the caches in ``values`` count from their
    keys (:func:`count_from_keys`) where the keys' length is dynamic and the count is a
    constant.

    yobx's flattening of a ``DynamicCache`` rebuilds each layer's count from its keys.
    transformers' exporters register another one once they have run in the process: it
    keeps every attribute of a layer, so the count comes back as the example's int, and
    a trace with a dynamic ``past`` would fix ``past`` to the example's size (the masks
    read the count). Either flattening may be registered when yobx traces.
    """
    cache_utils = sys.modules.get("transformers.cache_utils")
    if cache_utils is None:
        return
    sliding = cache_utils.DynamicSlidingWindowLayer
    for cache in _caches_in(values):
        for layer in getattr(cache, "layers", None) or ():
            keys = getattr(layer, "keys", None)
            if not isinstance(layer, sliding) or keys is None or getattr(keys, "dim", None) is None:
                continue
            length = keys.shape[-2] if keys.dim() >= 2 else 0
            if not isinstance(length, int) and type(layer.cumulative_length) is int:
                count_from_keys(layer)


def flatten_output(out: Any) -> tuple[list[Any], pytree.TreeSpec]:
    """``pytree.tree_flatten`` of a traced function's output, where a cache's layer
    holds a scalar proxy (a sliding-window layer's count of positions seen).

    transformers' exporters register a flattening of caches that keeps every attribute
    of a layer, a ``torch.SymInt`` as a leaf (as torch.export sees them) and anything
    else as a constant. A scalar proxy is yobx's SymInt: the flattening sees the SymInt
    it stands for, and the leaf is the proxy again. yobx's own flattening reads only
    the keys and values and is not affected.
    """
    held = []
    for cache in _caches_in(out):
        for layer in getattr(cache, "layers", None) or ():
            for name, value in list(vars(layer).items()):
                symbolic = getattr(getattr(value, "node", None), "meta", {}).get("val")
                if isinstance(value, torch.fx.Proxy) and isinstance(symbolic, _SYMBOLIC):
                    held.append((layer, name, value, symbolic))
    if not held:
        return pytree.tree_flatten(out)
    proxy_of = {id(symbolic): proxy for _, _, proxy, symbolic in held}
    try:
        for layer, name, _, symbolic in held:
            setattr(layer, name, symbolic)
        leaves, spec = pytree.tree_flatten(out)
    finally:
        for layer, name, proxy, _ in held:
            setattr(layer, name, proxy)
    return [proxy_of.get(id(leaf), leaf) for leaf in leaves], spec


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _caches_in(values: Any) -> list[Any]:
    """The transformers caches among ``values`` (those an ``EncoderDecoderCache``
    holds in its place); no attribute is read from anything else (proxies among
    them)."""
    cache_utils = sys.modules.get("transformers.cache_utils")
    if cache_utils is None:
        return []
    caches: list[Any] = []
    for value in _walk(values):
        if isinstance(value, cache_utils.EncoderDecoderCache):
            caches.extend(getattr(value, part) for part in _CACHE_PARTS)
        elif isinstance(value, cache_utils.Cache):
            caches.append(value)
    return caches


#: the caches an ``EncoderDecoderCache`` holds
_CACHE_PARTS = ("self_attention_cache", "cross_attention_cache")


def _register_encoder_decoder_cache(cls: type) -> None:
    # rebuilt by its constructor, which decides from the cross-attention cache's length
    # whether the decoder computes the encoder's keys and values (an empty one, the
    # first step) or reads them: a decision on sizes, so one graph serves both steps
    parts = _CACHE_PARTS

    def flatten(cache):
        return [getattr(cache, part) for part in parts], None

    def flatten_with_keys(cache):
        return [(pytree.MappingKey(part), getattr(cache, part)) for part in parts], None

    _register(cls, flatten, lambda children, context: cls(*children), flatten_with_keys)


def _register(cls: type, flatten: Callable, unflatten: Callable, with_keys: Callable) -> None:
    pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__name__}",
        flatten_with_keys_fn=with_keys,
    )
    import torch.fx._pytree as fx_pytree

    fx_pytree.register_pytree_flatten_spec(cls, lambda cache, spec: flatten(cache)[0])


def cache_dynamic_shapes(
    cache: Any,
    axes: dict[int, Any],
    cross_axes: dict[int, Any] | None = None,
    batch: int | None = None,
) -> Any:
    """The ``dynamic_shapes`` entry of a ``transformers`` cache: ``axes`` for each of
    its keys and values (4-d, ``{0: "batch", 2: "past"}``), ``{}`` for its other
    tensors, in the structure its pytree flattening has now: yobx's (``[keys,
    values]``, one list per kind) or transformers' exporters' (one tensor after the
    other, layer by layer), which replaces it once ``transformers.exporters`` exported
    a model in the process. ``cross_axes``: those of the keys and values of an
    ``EncoderDecoderCache``'s cross-attention (over the encoder's tokens, not the
    past ones), ``axes`` when not given. ``batch``: the batch size of the inputs; the
    tensors of a layer holding no keys and values (a linear-attention or state-space
    layer's convolution and recurrent states, ``[batch, ...]``), and any other tensor
    that is not 4-d, have their first axis ``axes[0]`` where it is that long (they
    were static, and a step concatenating them with the new tokens' states refused
    every other batch)."""
    stateful = {id(t) for t in _state_layer_tensors(cache)}
    first = axes.get(0)
    cross_cache = getattr(cache, "cross_attention_cache", None)
    layers = getattr(cross_cache, "layers", ()) if cross_axes is not None else ()
    cross = {
        id(tensor)
        for layer in layers
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None))
        if isinstance(tensor, torch.Tensor)
    }

    def axes_of(tensor: torch.Tensor) -> dict[int, Any]:
        if tensor.dim() != 4 or id(tensor) in stateful:
            by_batch = batch is not None and first is not None and tensor.dim() >= 1
            if not by_batch or tensor.shape[0] != batch:
                return {}
            # its other axes as torch.export's Dim.AUTO: a buffer whose length changes
            # from one step to the next stays dynamic, a width becomes static
            return {0: first, **dict.fromkeys(range(1, tensor.dim()), torch.export.Dim.AUTO)}
        return dict(cross_axes if cross_axes is not None and id(tensor) in cross else axes)

    return structure_dynamic_shapes(cache, axes_of)


def _state_layer_tensors(cache: Any) -> list[torch.Tensor]:
    """The tensors of the cache's layers other than their keys and values (a
    ``LinearAttentionLayer``'s convolution and recurrent states, a compressor's
    buffers), and those the cache holds itself (``MiniMaxCache.linear_cache``, one
    lightning-attention state per layer)."""
    found: list[torch.Tensor] = []
    holders = [*(getattr(cache, "layers", None) or ())]
    if holders and hasattr(cache, "__dict__"):
        holders.append(cache)
    for holder in holders:
        for name, value in vars(holder).items():
            if name in ("keys", "values", "layers"):
                continue
            items = value if isinstance(value, (list, tuple)) else [value]
            if isinstance(value, dict):
                items = list(value.values())
            found.extend(v for v in items if isinstance(v, torch.Tensor))
    return found


def structure_dynamic_shapes(value: Any, axes_of: Callable[[torch.Tensor], Any]) -> Any:
    """The ``dynamic_shapes`` entry of ``value`` in the structure its pytree flattening
    has now (whichever library registered it): ``axes_of(tensor)`` for each tensor,
    ``{}`` for anything else, a list per node."""
    if isinstance(value, torch.Tensor):
        return axes_of(value)
    register_cache_flattening([value])
    node = pytree.SUPPORTED_NODES.get(type(value))
    if node is None:
        return {}
    return [structure_dynamic_shapes(child, axes_of) for child in node.flatten_fn(value)[0]]


def _layer_windows(cache: Any) -> list[int | None]:
    """The sliding window of each layer of a DynamicCache (None for a plain layer)."""
    import transformers.cache_utils as cache_utils

    windows: list[int | None] = []
    for layer in cache.layers:
        if type(layer) is cache_utils.DynamicLayer:
            windows.append(None)
        elif type(layer) is cache_utils.DynamicSlidingWindowLayer and not layer.record_past:
            windows.append(int(layer.sliding_window))
        else:
            raise TypeError(
                f"only DynamicCache made of DynamicLayer and DynamicSlidingWindowLayer can "
                f"be flattened, found {type(layer).__name__}"
            )
    return windows


def _walk(values: Any):
    stack = [values]
    while stack:
        v = stack.pop()
        yield v
        if isinstance(v, (tuple, list)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
