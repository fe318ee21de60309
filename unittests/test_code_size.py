"""Modules and functions stay small: no module over 600 lines, no function over 80.

Lines are counted as ``wc -l`` counts them; a function counts from its ``def`` (or its
first decorator) to its last line, docstring included.
"""

from __future__ import annotations

import ast
import pathlib

import yobx

ROOT = pathlib.Path(yobx.__file__).parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _sources() -> list[pathlib.Path]:
    return sorted(ROOT.rglob("*.py"))


def _function_lengths(tree: ast.AST) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, number of lines)`` of every function in ``tree``."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                name = f"{prefix}{child.name}"
                found.append((name, child.lineno, child.end_lineno - first + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def test_function_lengths_are_measured():
    source = "class A:\n    @staticmethod\n    def f():\n        def g():\n            pass\n"
    assert _function_lengths(ast.parse(source)) == [("A.f", 3, 4), ("A.f.g", 4, 2)]


def test_no_module_over_600_lines():
    too_long = []
    for path in _sources():
        n_lines = len(path.read_bytes().splitlines())
        if n_lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(ROOT.parent)}: {n_lines} lines")
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(too_long)


def test_no_function_over_80_lines():
    too_long = []
    for path in _sources():
        for name, line, n_lines in _function_lengths(ast.parse(path.read_text())):
            if n_lines > MAX_FUNCTION_LINES:
                where = f"{path.relative_to(ROOT.parent)}:{line}"
                too_long.append(f"{where} {name}: {n_lines} lines")
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(too_long)
