"""Modules and functions stay small: no module over 600 lines of code, no function over
80.

Only code counts: blank lines, comments and docstrings (of modules, classes and
functions) are left out, since the limits are about code and must never be met by
cutting prose. A function counts from its ``def`` (or its first decorator) to its last
line.
"""

from __future__ import annotations

import ast
import io
import pathlib
import tokenize

import yobx

ROOT = pathlib.Path(yobx.__file__).parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
    tokenize.ENCODING,
}


def _sources() -> list[pathlib.Path]:
    return sorted(ROOT.rglob("*.py"))


def _docstring_lines(tree: ast.AST) -> set[int]:
    """The lines of every module, class and function docstring."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def code_lines(source: str) -> set[int]:
    """The lines of ``source`` holding code: neither blank, nor only a comment, nor part
    of a docstring."""
    tree = ast.parse(source)
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - _docstring_lines(tree)


def _function_lengths(source: str) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, lines of code)`` of every function in ``source``."""
    code = code_lines(source)
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                name = f"{prefix}{child.name}"
                n_code = len([n for n in range(first, child.end_lineno + 1) if n in code])
                found.append((name, child.lineno, n_code))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_function_lengths_are_measured():
    source = "class A:\n    @staticmethod\n    def f():\n        def g():\n            pass\n"
    assert _function_lengths(source) == [("A.f", 3, 4), ("A.f.g", 4, 2)]


def test_prose_does_not_count():
    source = (
        '"""Module\n\ndocstring."""\n\n'
        "def f(x):\n"
        '    """A docstring\n    of three\n    lines."""\n'
        "    # a comment\n\n"
        "    return (x +  # trailing comment\n"
        "            1)\n"
    )
    assert _function_lengths(source) == [("f", 5, 3)]
    assert code_lines(source) == {5, 11, 12}


def test_no_module_over_600_lines():
    too_long = []
    for path in _sources():
        n_lines = len(code_lines(path.read_text()))
        if n_lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(ROOT.parent)}: {n_lines} lines of code")
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(too_long)


def test_no_function_over_80_lines():
    too_long = []
    for path in _sources():
        for name, line, n_lines in _function_lengths(path.read_text()):
            if n_lines > MAX_FUNCTION_LINES:
                where = f"{path.relative_to(ROOT.parent)}:{line}"
                too_long.append(f"{where} {name}: {n_lines} lines of code")
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(too_long)
