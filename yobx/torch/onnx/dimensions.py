"""Names of dynamic dimensions in the ONNX model.

The tracer knows each dynamic dimension as a ShapeEnv symbol (``s26``) and maps the
ones the user named (``batch``) in ``dimension_names``. Dimensions derived from them
(``s26 + s13``) are rendered as sympy-simplified expressions of the user's names
(``past + seq``), identical wherever the same dimension appears.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

import onnx_ir as ir
import sympy

from yobx.torch.tracing.constraints.versions import DIMENSIONS_KEY

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


class DimensionRenamer:
    """Renders the symbolic dimensions of ONNX shapes with the user's names.

    :param dimension_names: ShapeEnv symbol name -> user dimension name, or an
        expression of user dimension names (a divisibility's quotient, see
        :meth:`for_capture`)
    :param shape_env: used to replace symbols known equal to others
    """

    def __init__(self, dimension_names: Mapping[str, str | sympy.Expr], shape_env: Any = None):
        self.dimension_names = dict(dimension_names)
        self.shape_env = shape_env
        #: the names of sizes known only at run time (see
        #: :func:`data_dependent_dimension_names`), kept by :meth:`for_capture`
        self.data_dependent: dict[str, str] = {}
        self._cache: dict[str, str] = {}
        self._symbols = {
            name: _user_expression(user) for name, user in self.dimension_names.items()
        }

    @classmethod
    def for_capture(cls, dims: Any, data_dependent: Mapping[str, str]) -> DimensionRenamer:
        """The renamer of the sizes of one capture (the ShapeEnv of ``dims``, a
        :class:`~yobx.torch.tracing.symbolic.symbolic.SymbolicDimensions`).

        A dimension is written in the user's names (``batch``), and so is a symbol the
        capture introduced for a divisibility (``width == 2*q + 1`` writes ``q`` as
        ``width/2 - 1/2``, and the input's axis as ``width``): a name of its own would
        stand for another size in a version where ``width`` is even, and onnxruntime
        takes equal names for equal sizes.

        :param data_dependent: names of the sizes known only at run time (by ShapeEnv
            symbol: ``u0 -> nonzero_dim0``)
        """
        renamer = cls({**data_dependent, **dims.user_symbols()}, dims.shape_env)
        renamer.data_dependent = dict(data_dependent)
        return renamer

    def expression(self, expr: sympy.Expr) -> str:
        """Renders a sympy expression of ShapeEnv symbols with the user's names."""
        if self.shape_env is not None:
            # Rendering must not fail on an expression the ShapeEnv cannot simplify;
            # the raw expression is still a valid dimension name.
            with contextlib.suppress(Exception):
                expr = self.shape_env.replace(expr)
        substitutions = {
            symbol: self._symbols.get(symbol.name, symbol) for symbol in expr.free_symbols
        }
        renamed = expr.xreplace(substitutions)
        if not renamed.atoms(sympy.Function):
            # common factors taken out (batch*(past + seq)): what sympy.simplify gave
            # these sums and products, without its import of sympy.physics.units (a
            # third of a second, the first time a process names a dimension)
            renamed = sympy.factor_terms(renamed)
        return str(renamed).replace(" ", "")

    def rename(self, text: str) -> str:
        """Renders one dimension string written by torch_lib (``str(sym.node)``)."""
        if text not in self._cache:
            self._cache[text] = self._rename(text)
        return self._cache[text]

    def _rename(self, text: str) -> str:
        names = set(_IDENTIFIER.findall(text))
        if not names:
            return text
        local = {name: sympy.Symbol(name, integer=True, positive=True) for name in names}
        try:
            expr = sympy.sympify(text, locals=local)
        except (sympy.SympifyError, SyntaxError, TypeError):
            return text
        if not isinstance(expr, sympy.Expr) or expr.is_number:
            return text
        return self.expression(expr)

    def rename_shape(self, shape: ir.Shape | None) -> ir.Shape | None:
        """Returns ``shape`` with every symbolic dimension renamed."""
        if shape is None:
            return None
        dims: list[Any] = []
        changed = False
        for dim in shape:
            if isinstance(dim, ir.SymbolicDim) and isinstance(dim.value, str):
                new = self.rename(dim.value)
                changed |= new != dim.value
                # A symbol the ShapeEnv specialised renders as a number: a static dim.
                dims.append(int(new) if new.isdigit() else new)
            else:
                dims.append(dim)
        return ir.Shape(dims) if changed else shape


def _user_expression(user: str | sympy.Expr) -> sympy.Expr:
    """A user's dimension name as a sympy symbol (an expression stays as it is)."""
    if isinstance(user, str):
        return sympy.Symbol(user, integer=True, positive=True)
    return user


def data_dependent_dimension_names(graph_module: Any) -> dict[str, str]:
    """Names for the sizes only known at run time (``x[mask]``, ``nonzero``...).

    The tracer records where each one appears first (``meta["unbacked_bindings"]``,
    symbol -> path in the node's value). The dimension is named after that node and
    the axis: ``getitem_dim0`` for ``x[mask]`` assigned to node ``getitem``,
    ``nonzero_dim0``, ``cond_1_dim0`` for axis 0 of the second output of a
    ``torch.cond``, ``item`` for ``t.item()``.
    """
    import torch.utils._pytree as pytree

    names: dict[str, str] = {}
    for module in graph_module.modules():
        graph = getattr(module, "graph", None)
        if graph is None:
            continue
        for node in graph.nodes:
            for symbol, path in (node.meta.get("unbacked_bindings") or {}).items():
                parts = [node.name]
                for key in path:
                    if isinstance(key, pytree.SequenceKey):
                        parts.append(f"dim{key.idx}" if parts[-1] == "size" else str(key.idx))
                    elif isinstance(key, pytree.MappingKey):
                        parts.append(str(key.key))
                    elif getattr(key, "name", None) == "size":
                        parts.append("size")
                name = "_".join(p for p in parts if p != "size")
                names.setdefault(str(symbol), name)
    return names


def all_values(model: ir.Model) -> Iterator[ir.Value]:
    """Every value of ``model``: of its graph, its functions and their subgraphs."""
    for graph in (model.graph, *model.functions.values()):
        yield from _graph_values(graph)


def _graph_values(graph: ir.Graph | ir.Function) -> Iterator[ir.Value]:
    """The values of a graph or a function, those of its subgraphs too."""
    yield from graph.inputs
    for node in ir.traversal.RecursiveGraphIterator(graph):
        yield from node.outputs
        # the inputs of a subgraph (a loop's body) are nobody's outputs
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                yield from attribute.value.inputs
            elif attribute.type == ir.AttributeType.GRAPHS:
                for subgraph in attribute.value:
                    yield from subgraph.inputs


def rename_dimensions(model: ir.Model, renamer: DimensionRenamer) -> None:
    """Renames the dynamic dimensions of every value of ``model`` in place.

    The graph of a version (a local function marked with its capture's dimensions, see
    :mod:`yobx.torch.onnx.version_lowering`) has the sizes of its own ShapeEnv, whose
    symbol names (``s38``) the other captures reuse for other sizes: it is renamed with
    :meth:`DimensionRenamer.for_capture` of its capture.
    """
    renamers: dict[int, DimensionRenamer] = {}

    def renamer_of(function: ir.Function) -> DimensionRenamer:
        dims = function.meta.get(DIMENSIONS_KEY)
        if dims is None or dims.shape_env is renamer.shape_env:
            return renamer
        if id(dims) not in renamers:
            renamers[id(dims)] = DimensionRenamer.for_capture(dims, renamer.data_dependent)
        return renamers[id(dims)]

    graphs = [(model.graph, renamer)]
    graphs += [(f, renamer_of(f)) for f in model.functions.values()]
    for graph, graph_renamer in graphs:
        for value in _graph_values(graph):
            shape = graph_renamer.rename_shape(value.shape)
            if shape is not value.shape:
                value.shape = shape


def dynamic_dimensions(model: ir.Model) -> list[str]:
    """Returns the distinct names of the dynamic dimensions of the model's inputs
    and outputs, in order of appearance."""
    seen: dict[str, None] = {}
    for value in [*model.graph.inputs, *model.graph.outputs]:
        for dim in value.shape or ():
            if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
                seen.setdefault(dim.value, None)
    return list(seen)
