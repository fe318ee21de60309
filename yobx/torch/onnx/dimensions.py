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

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


class DimensionRenamer:
    """Renders the symbolic dimensions of ONNX shapes with the user's names.

    :param dimension_names: ShapeEnv symbol name -> user dimension name
    :param shape_env: used to replace symbols known equal to others
    """

    def __init__(self, dimension_names: Mapping[str, str], shape_env: Any = None):
        self.dimension_names = dict(dimension_names)
        self.shape_env = shape_env
        self._cache: dict[str, str] = {}
        self._symbols = {
            name: sympy.Symbol(user, integer=True, positive=True)
            for name, user in self.dimension_names.items()
        }

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
        renamed = sympy.simplify(expr.xreplace(substitutions))
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


def _all_values(model: ir.Model) -> Iterator[ir.Value]:
    yield from model.graph.inputs
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        yield from node.outputs
    for function in model.functions.values():
        yield from function.inputs
        for node in ir.traversal.RecursiveGraphIterator(function):
            yield from node.outputs


def rename_dimensions(model: ir.Model, renamer: DimensionRenamer) -> None:
    """Renames the dynamic dimensions of every value of ``model`` in place."""
    for value in _all_values(model):
        shape = renamer.rename_shape(value.shape)
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
