"""Every ``.. code-block:: python`` of README.rst and ``_doc/*.rst`` runs as written.

The blocks of one page run in order in one namespace (a page is read as a tutorial:
a later block may use the model an earlier one built), in a temporary directory (the
files they write stay there). Each page is a module whose source file holds the blocks
at their own line numbers, so that an error points at the page's line and code that
reads its own source (``inspect.getsource``, ``torch.export(strict=True)``) finds it.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import types

import pytest

_ROOT = os.path.join(os.path.dirname(__file__), "..")
_PAGES = [
    "README.rst",
    *sorted(
        os.path.join("_doc", name)
        for name in os.listdir(os.path.join(_ROOT, "_doc"))
        if name.endswith(".rst")
    ),
]
_BLOCK = re.compile(r"^(\s*)\.\. code-block:: python\s*$")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(first line, code)`` of each python code block of a reStructuredText page, the
    code dedented, its first line numbered from 1."""
    lines = text.splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        match = _BLOCK.match(lines[index])
        index += 1
        if match is None:
            continue
        indent = len(match.group(1))
        body = []
        while index < len(lines) and (
            not lines[index].strip() or len(lines[index]) - len(lines[index].lstrip()) > indent
        ):
            body.append((index + 1, lines[index]))
            index += 1
        while body and not body[-1][1].strip():
            body.pop()
        while body and not body[0][1].strip():
            body.pop(0)
        if body:
            margin = min(len(line) - len(line.lstrip()) for _, line in body if line.strip())
            blocks.append((body[0][0], "\n".join(line[margin:] for _, line in body)))
    return blocks


def test_python_blocks_are_found():
    text = "Intro\n\n.. code-block:: python\n\n    x = 1\n\n    y = x\n\nAfter::\n\n    z\n"
    assert python_blocks(text) == [(5, "x = 1\n\ny = x")]


@pytest.mark.parametrize("page", _PAGES)
def test_page_blocks_run_as_written(page, tmp_path, monkeypatch):
    with open(os.path.join(_ROOT, page), encoding="utf-8") as f:
        blocks = python_blocks(f.read())
    if not blocks:
        pytest.skip(f"{page} has no python block")
    if any("transformers" in code for _, code in blocks):
        pytest.importorskip("transformers")
    # the page as a module: its blocks at their own line numbers, blank lines elsewhere
    source = [""] * max(first + code.count("\n") for first, code in blocks)
    for first, code in blocks:
        for offset, line in enumerate(code.splitlines()):
            source[first - 1 + offset] = line
    stem = re.sub(r"\W", "_", page)
    filename = tmp_path / f"{stem}.py"
    filename.write_text("\n".join(source) + "\n", encoding="utf-8")
    name = f"_doc_page_{stem}"
    module = types.ModuleType(name)
    module.__file__ = str(filename)
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.chdir(tmp_path)
    for first, code in blocks:
        compiled = compile("\n" * (first - 1) + code, str(filename), "exec")
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(compiled, module.__dict__)
            except Exception as e:
                pytest.fail(f"{page}, block at line {first}: {type(e).__name__}: {e}")
