"""Reading ``dynamic_shapes`` in every form torch.export accepts.

One place turns the user's ``dynamic_shapes`` into one ``{axis: DimSpec}`` per flattened
input leaf, for the tracer, the ONNX exporter, robust tracing and validation alike.

Accepted forms (as :func:`torch.export.export`):

* a dict keyed by parameter name, or a tuple/list with one entry per parameter;
* per tensor, a dict ``{axis: spec}`` or a list with one spec per axis;
* nested like the inputs (tuples, lists, dicts, ``transformers.DynamicCache``...);
* an axis spec is a string (a dimension name), ``torch.export.Dim("name", min=, max=)``,
  a derived dim (``2 * seq``, ``cache + 1``), ``Dim.DYNAMIC``, ``Dim.AUTO``, or
  ``None`` / ``Dim.STATIC`` for a static axis;
* beyond torch.export, a string may be an expression of dimensions other axes name
  (``"past + seq"``, ``"2 * n - 1"``: names, integers, ``+``, ``-``, ``*``): the axis
  is that size, not a dimension of its own (a decode step's attention mask spans the
  cache and the new tokens), and the graph checks it on its inputs;
* an ``int`` argument takes one such spec (``{"k": Dim.DYNAMIC}``): it becomes an
  input of the graph instead of a constant baked in (its "axis" is :data:`SCALAR`).

How a dimension may be refined when tracing needs a fact that is not provable (its
:attr:`DimSpec.policy`) follows torch.export: a string or ``Dim.DYNAMIC`` adopts the
example's answer as a constraint (``"dynamic"``), ``Dim.AUTO`` also lets it become
static (``"auto"``), a named ``Dim`` adopts nothing (``"strict"``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree

#: adopt facts from the example as constraints, never become static
DYNAMIC = "dynamic"
#: adopt facts, and become static (with a warning) when the code needs a constant
AUTO = "auto"
#: adopt nothing: every needed fact is reported as a fix to paste
STRICT = "strict"


@dataclasses.dataclass(frozen=True)
class DimSpec:
    """One dynamic axis as the user declared it.

    :param name: the user's name of the dimension (generated for ``Dim.DYNAMIC`` and
        ``Dim.AUTO``: ``<input>_dim_<axis>``)
    :param policy: :data:`DYNAMIC`, :data:`AUTO` or :data:`STRICT`
    :param min: declared lower bound, if any
    :param max: declared upper bound, if any
    :param derived: for a derived dim (``2 * seq``), the function of its root
    :param root: for a derived dim, the spec of its root
    :param expression: for an axis declared by an expression of other dimensions
        (``"past + seq"``), that expression, in sympy with a symbol per name
    """

    name: str
    policy: str
    min: int | None = None
    max: int | None = None
    derived: Callable[[Any], Any] | None = None
    root: DimSpec | None = None
    expression: sympy.Expr | None = None


#: the "axis" of an int argument declared dynamic (``{"k": Dim.DYNAMIC}``): the value
SCALAR = None


def axis_spec(entry: Any, leaf_name: str, axis: int | None) -> DimSpec | None:
    """Normalizes one axis entry of ``dynamic_shapes``; None means static.
    ``axis`` is :data:`SCALAR` for an int argument."""
    if entry is None:
        return None
    if isinstance(entry, str):
        if _EXPRESSION_OPERATORS.search(entry):
            where = f"dynamic_shapes for input {leaf_name!r} axis {axis}"
            expression = parse_dimension_expression(entry, where)
            return DimSpec(str(expression), DYNAMIC, expression=expression)
        return DimSpec(entry, DYNAMIC)
    kind = type(entry).__name__
    if kind == "_DimHint":
        hint = str(getattr(entry, "type", entry)).rsplit(".", 1)[-1]
        if hint == "STATIC":
            return None
        policy = AUTO if hint == "AUTO" else DYNAMIC
        name = leaf_name if axis is SCALAR else f"{leaf_name}_dim_{axis}"
        return DimSpec(name, policy, *_bounds(entry))
    if kind == "_DerivedDim":
        root = entry.root
        root_spec = DimSpec(root.__name__, STRICT, *_bounds(root))
        return DimSpec(entry.__name__, STRICT, derived=entry.fn, root=root_spec)
    if hasattr(entry, "__name__") and hasattr(entry, "min"):
        return DimSpec(entry.__name__, STRICT, *_bounds(entry))
    raise ValueError(
        f"dynamic_shapes for input {leaf_name!r} axis {axis}: expected a dimension name, "
        f"torch.export.Dim(...), Dim.DYNAMIC, Dim.AUTO, Dim.STATIC or None, got {entry!r}"
    )


#: what makes a string axis spec an expression instead of a name
_EXPRESSION_OPERATORS = re.compile(r"[+\-*/]")
_EXPRESSION_TEXT = re.compile(r"^[\sA-Za-z0-9_+\-*()]+$")


def parse_dimension_expression(text: str, where: str) -> sympy.Expr:
    """The sympy expression of an axis spec like ``"past + seq"``: integer symbols for
    the names, integers, ``+``, ``-``, ``*`` and parentheses, nothing else (a quotient
    has no single size for every input, and nothing is evaluated but arithmetic)."""
    problem = ""
    if not _EXPRESSION_TEXT.match(text):
        problem = "only names, integers, +, -, * and parentheses are allowed"
    else:
        names = set(re.findall(r"[A-Za-z_]\w*", text))
        symbols = {name: sympy.Symbol(name, integer=True) for name in names}
        try:
            expression = sympy.sympify(text, locals=symbols, rational=False)
        except (sympy.SympifyError, SyntaxError, TypeError) as e:
            problem = f"it does not parse ({e})"
        else:
            if not isinstance(expression, sympy.Expr) or not expression.free_symbols:
                problem = "it names no dimension"
            elif not expression.is_polynomial() or any(
                not c.is_integer for c in sympy.Poly(expression).coeffs()
            ):
                problem = "it is not a sum of products of dimensions and integers"
            else:
                return expression
    raise ValueError(
        f"{where}: {text!r} is no dimension expression: {problem}; write a sum of "
        f"dimensions other axes name, like 'past + seq' or '2 * n - 1'"
    )


#: a maximum from which a dimension counts as unbounded: torch.export.Dim's default
#: maximum (``int_oo``, or ``2**63 - 1`` in older versions) and anything near it
UNBOUNDED = 2**62


def _bounds(dim: Any) -> tuple[int | None, int | None]:
    low, high = getattr(dim, "min", None), getattr(dim, "max", None)
    # torch.export.Dim defaults to min=0 although export treats sizes 0 and 1 as
    # static; a dynamic dimension starts at 2 unless min says 1 or more.
    if low is not None and low < 1:
        low = None
    if high is not None and high >= UNBOUNDED:
        high = None
    return low, high


def axes_per_leaf(arg_names: list[str], values: list[Any], dynamic_shapes: Any) -> list[dict]:
    """Returns, for each pytree leaf of ``values``, the raw ``{axis: entry}`` declared.

    :param arg_names: the parameter names the values are bound to
    :param values: the values, in the same order
    :param dynamic_shapes: the user's ``dynamic_shapes``
    :raises ValueError: when ``dynamic_shapes`` does not match the inputs
    """
    if dynamic_shapes is None:
        return [{} for _ in pytree.tree_leaves(tuple(values))]
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
                f"dynamic_shapes has {len(dynamic_shapes)} entries but the inputs are "
                f"{arg_names}; give one entry per input (None for static ones)"
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


# torch's pytree keeps None as a leaf in some versions and as an empty node in others.
_NONE_IS_LEAF = len(pytree.tree_leaves(None)) == 1


def _is_axis_entry(spec: Any) -> bool:
    return spec is None or isinstance(spec, str) or _is_dim(spec)


def _is_dim(spec: Any) -> bool:
    return (hasattr(spec, "__name__") and hasattr(spec, "min")) or type(spec).__name__ in (
        "_DimHint",
        "_DerivedDim",
    )


def _is_tensor_spec(spec: Any) -> bool:
    return isinstance(spec, dict) and all(isinstance(k, int) for k in spec)


def _match(value: Any, spec: Any, path: str, out: list[dict]) -> None:
    """Walks ``value`` and ``spec`` together, appending one axis dict per leaf."""
    if isinstance(value, torch.Tensor):
        out.append(_tensor_axes(value, spec, path))
        return
    node_type = type(value)
    if node_type is int and spec is not None and _is_axis_entry(spec):
        # an int argument declared dynamic: an input of the graph (a SymInt)
        out.append({} if _is_static_hint(spec) else {SCALAR: spec})
        return
    if value is None or node_type not in pytree.SUPPORTED_NODES:
        if spec not in (None, {}, [], ()) and not _is_static_hint(spec):
            scalars = (
                "; only int arguments can be dynamic (one spec, e.g. Dim.DYNAMIC), floats "
                "and bools are constants baked into the graph, as torch.export does"
                if node_type in (float, bool, int)
                else ""
            )
            raise ValueError(
                f"dynamic_shapes gives {spec!r} for {path!r}, which is a "
                f"{node_type.__name__}, not a tensor or a container of tensors{scalars}"
            )
        if value is not None or _NONE_IS_LEAF:
            out.append({})
        return
    children, context = pytree.SUPPORTED_NODES[node_type].flatten_fn(value)
    if spec is None or _is_static_hint(spec):
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


def _is_static_hint(spec: Any) -> bool:
    return type(spec).__name__ == "_DimHint" and "STATIC" in str(getattr(spec, "type", spec))


def _tensor_axes(value: torch.Tensor, spec: Any, path: str) -> dict:
    if spec is None or _is_static_hint(spec):
        return {}
    if isinstance(spec, dict) and all(isinstance(k, int) for k in spec):
        axes = dict(spec)
    elif isinstance(spec, (tuple, list)) and all(_is_axis_entry(s) for s in spec):
        if len(spec) != value.dim():
            raise ValueError(
                f"dynamic_shapes for {path!r} lists {len(spec)} axes but the input has "
                f"{value.dim()} dimensions (shape {tuple(value.shape)})"
            )
        axes = dict(enumerate(spec))
    else:
        raise ValueError(
            f"dynamic_shapes for tensor input {path!r} must be a dict "
            f"{{axis: Dim or name}} or a list with one entry per axis, got {spec!r}"
        )
    result = {}
    for axis, entry in axes.items():
        if not -value.dim() <= axis < value.dim():
            raise ValueError(
                f"dynamic_shapes for input {path!r} names axis {axis} but the input has "
                f"{value.dim()} dimensions (shape {tuple(value.shape)})"
            )
        if entry is not None and not _is_static_hint(entry):
            result[axis % value.dim()] = entry
    return result


def solve_root(spec: DimSpec, size: int) -> int:
    """The size of a derived dim's root that gives ``size``."""
    # a derived dim: axis_spec sets its function and its root together
    assert spec.derived is not None and spec.root is not None
    for candidate in range(0, size + 1):
        if spec.derived(candidate) == size:
            return candidate
    raise ValueError(f"no size of {spec.root.name} gives {size} for {spec.name}")
