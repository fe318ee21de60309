"""Every ``.. code-block:: python`` of README.rst and ``_doc/*.rst`` runs as written,
and prints what its comments say it prints.

The blocks of one page run in order in one namespace (a page is read as a tutorial:
a later block may use the model an earlier one built), in a temporary directory (the
files they write stay there). Each page is a module whose source file holds the blocks
at their own line numbers, so that an error points at the page's line and code that
reads its own source (``inspect.getsource``, ``torch.export(strict=True)``) finds it.

A ``print(value)`` whose comment is a Python repr (``# ['batch', 'seq']``,
``# PassResult('remove_unnecessary_slices', count=4)``, ``# "a message"``) is checked:
the value's ``repr`` (or ``str``, for a quoted comment) must match it, ``...`` standing
for anything. A ``print`` whose comment is printed text, recognised by a source location
(``# batch == 0 -> False (bounds)  [model.py:6]``) or a `` ... `` standing for a part
(``# the inputs break the constraint `seq <= 128` ... seq=200``), is checked the same
way on ``str(value)``, locations comparing equal whatever the file and line; comment
lines aligned under it continue it, one line per call when the print runs in a loop.
Comments that describe (``# every stage, its calls``) are left alone.
A ``.. code-block:: text`` preceded by the comment ``.. the output of the block above``
is compared with what the python block before it printed: its lines, in order, each
matching one printed line (``...`` for anything; runs of spaces and dashes, and
``file.py:line`` locations, compare equal whatever their length or names).
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import sys
import types

import pytest

from unittests.pytree_registrations import pytree_registrations_restored

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
_OUTPUT_MARKER = ".. the output of the block above"
_TEXT_BLOCK = re.compile(r"^\s*\.\. code-block:: text\s*$")
_PRINT = re.compile(r"^(\s*)print\((.+)\)\s+#\s+(.+)$")
#: how a comment showing a repr starts: a literal, a quoted text, ``Name(`` or a
#: constant
_LOCATION = re.compile(r"\[[^\[\]\s]+\.py:\d+\]")
_REPR_START = re.compile(r"""^([\[{('"]|[A-Z]\w*\(|(None|True|False)\b)""")


def printed_repr(comment: str) -> str | None:
    """The repr a ``print`` comment shows (the longest prefix that is a Python
    expression, ``...`` allowed), or None for a comment that describes."""
    if not _REPR_START.match(comment):
        return None
    for end in range(len(comment), 0, -1):
        prefix = comment[:end].rstrip()
        if prefix[-1:] not in ")]}'\"" and prefix not in ("None", "True", "False"):
            continue
        try:
            ast.parse(prefix, mode="eval")
        except SyntaxError:
            continue
        return prefix
    return None


def printed_text(comment: str) -> str | None:
    """The text a ``print`` comment shows when it is printed text (it holds a source
    location ``[file.py:N]`` or a `` ... ``), else None."""
    comment = comment.strip()
    if _LOCATION.search(comment) or " ... " in comment or comment.endswith(" ..."):
        return comment
    return None


def _locations_normalized(text: str) -> str:
    return _LOCATION.sub("[FILE:LINE]", text)


def matches_printed(value: object, expected: str) -> bool:
    """Whether ``value`` prints as ``expected`` (``...`` matches anything, source
    locations compare equal whatever their file and line)."""
    forms = [expected]
    if expected[0] in "'\"" and expected[-1] == expected[0]:
        forms.append(expected[1:-1])  # a text, shown quoted (a KeyError prints quoted)
    texts = [_locations_normalized(text) for text in (repr(value), str(value))]
    for form in forms:
        parts = _locations_normalized(form).split("...")
        pattern = ".*".join(re.escape(part) for part in parts)
        if any(re.fullmatch(pattern, text, re.S) for text in texts):
            return True
    return False


def _continued(lines: list[str], offset: int, column: int) -> list[str]:
    """The comment lines right after ``lines[offset]`` whose ``#`` is at ``column``."""
    following = []
    for line in lines[offset + 1 :]:
        if len(line) <= column or line[column] != "#" or line[:column].strip():
            break
        following.append(line[column + 1 :].strip())
    return following


def _checked_prints(code: str, first: int, page: str) -> str:
    """The code with each ``print`` of a repr or a printed text comment checking its
    value too."""
    lines = code.split("\n")
    for offset, line in enumerate(lines):
        match = _PRINT.match(line)
        if match is None:
            continue
        expected = printed_repr(match.group(3))
        if expected is None and printed_text(match.group(3)) is not None:
            column = line.rindex("#", 0, match.start(3))
            texts = [match.group(3), *_continued(lines, offset, column)]
            expected = [printed_text(text) or text for text in texts]
        if expected is not None:
            indent, value = match.group(1), match.group(2)
            where = f"{page}:{first + offset}"
            lines[offset] = f"{indent}__doc_printed__({value}, {expected!r}, {where!r})"
    return "\n".join(lines)


class _DocPrinted:
    """``print`` checking what it prints: a call with one expected form, or with the
    lines of a comment, one per call in order (later calls may match any of them)."""

    def __init__(self):
        self.calls: dict[str, int] = {}

    def __call__(self, value: object, expected: str | list[str], where: str) -> None:
        print(value)
        if isinstance(expected, list):
            count = self.calls[where] = self.calls.get(where, -1) + 1
            forms = [expected[count]] if count < len(expected) else expected
        else:
            forms = [expected]
        assert any(matches_printed(value, form) for form in forms), (
            f"{where} prints {value!r}, the text says {' or '.join(forms)}"
        )


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


def expected_outputs(text: str) -> dict[int, str]:
    """First line of the python block -> the text block marked as its output."""
    lines = text.splitlines()
    firsts = [first for first, _ in python_blocks(text)]
    outputs = {}
    for index, line in enumerate(lines):
        if not line.strip().startswith(_OUTPUT_MARKER):
            continue
        start = next(i for i in range(index + 1, len(lines)) if lines[i].strip())
        assert _TEXT_BLOCK.match(lines[start]), f"line {index + 1}: no text block after it"
        body = []
        for following in lines[start + 1 :]:
            if following.strip() and not following.startswith((" ", "\t")):
                break
            body.append(following)
        before = [first for first in firsts if first < index + 1]
        outputs[before[-1]] = "\n".join(body).strip("\n")
    return outputs


def _normalized(line: str) -> str:
    line = re.sub(r"\S+\.py:\d+", "FILE:LINE", line.strip())
    return re.sub(r"-{2,}", "--", re.sub(r"\s+", " ", line))


def printed_as_written(printed: str, expected: str) -> str | None:
    """None when every expected line matches a printed line, in order; else the first
    expected line that does not."""
    lines = [_normalized(line) for line in printed.splitlines() if line.strip()]
    position = 0
    for wanted in (line for line in expected.splitlines() if line.strip()):
        parts = _normalized(wanted).split("...")
        pattern = re.compile(".*".join(re.escape(part) for part in parts))
        while position < len(lines) and not pattern.fullmatch(lines[position]):
            position += 1
        if position == len(lines):
            return wanted.strip()
        position += 1
    return None


def test_python_blocks_are_found():
    text = "Intro\n\n.. code-block:: python\n\n    x = 1\n\n    y = x\n\nAfter::\n\n    z\n"
    assert python_blocks(text) == [(5, "x = 1\n\ny = x")]


@pytest.mark.parametrize("page", _PAGES)
def test_page_blocks_run_as_written(page, tmp_path, monkeypatch):
    with open(os.path.join(_ROOT, page), encoding="utf-8") as f:
        text = f.read()
    blocks = python_blocks(text)
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
    module.__dict__["__doc_printed__"] = _DocPrinted()
    outputs = expected_outputs(text)
    # a page exporting through transformers' exporters registers their flattening of
    # caches, which the tests run after it in this process must not see
    with pytree_registrations_restored():
        _run_blocks(page, blocks, filename, module, outputs)


def _run_blocks(page: str, blocks: list, filename, module, outputs: dict) -> None:
    """Runs the python ``blocks`` of ``page`` in ``module``, checking what they print."""
    for first, code in blocks:
        code = _checked_prints(code, first, page)
        compiled = compile("\n" * (first - 1) + code, str(filename), "exec")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            try:
                exec(compiled, module.__dict__)
            except Exception as e:
                pytest.fail(f"{page}, block at line {first}: {type(e).__name__}: {e}")
        if first in outputs:
            missing = printed_as_written(printed.getvalue(), outputs[first])
            assert missing is None, (
                f"{page}, block at line {first} does not print {missing!r}; it prints:\n"
                f"{printed.getvalue()}"
            )


def test_printed_reprs_are_recognised_and_compared():
    assert printed_repr("['batch', 'seq']: exact at every size") == "['batch', 'seq']"
    assert printed_repr("PassResult('x', count=4)") == "PassResult('x', count=4)"
    assert printed_repr("every stage, its calls") is None
    assert printed_repr("[]: exact at every size") == "[]"
    assert printed_repr("None: nothing differs") == "None"
    assert matches_printed(["a", "b", "c"], "['a', ...]")
    assert not matches_printed(["b"], "['a', ...]")
    assert matches_printed(KeyError("no key"), "\"'no key'\"")


def test_marked_outputs_are_compared_line_by_line():
    text = (
        ".. code-block:: python\n\n    print(1)\n\nIt prints:\n\n"
        f"{_OUTPUT_MARKER}\n\n.. code-block:: text\n\n    a   b\n    x at m.py:3 ...\n\nEnd\n"
    )
    assert expected_outputs(text) == {3: "    a   b\n    x at m.py:3 ..."}
    assert (
        printed_as_written("a b\nnoise\nx at /tmp/t.py:12 and more", "a   b\nx at m.py:3 ...")
        is None
    )
    assert printed_as_written("x at t.py:1\na b", "a b\nx at m.py:3") == "x at m.py:3"


def test_printed_texts_are_recognised_and_compared():
    assert printed_text("batch == 0 -> False (bounds)  [model.py:6]") is not None
    assert printed_text("the constraint `seq <= 128` ... seq=200") is not None
    assert printed_text("every stage, its calls") is None
    assert matches_printed(
        "batch >= 1 (range)  [/tmp/x/m.py:12]", "batch >= 1 (range)  [model.py:6]"
    )
    assert not matches_printed("batch >= 2 (range)  [m.py:12]", "batch >= 1 (range)  [model.py:6]")
    code = (
        "for v in values:\n"
        "    print(v)  # version 1: s <= 16  [m.py:3]\n"
        "              # version 2: s > 16  [m.py:3]\n"
    )
    checked = _checked_prints(code, 1, "page.rst")
    assert "'version 2: s > 16  [m.py:3]'" in checked
    printed = _DocPrinted()
    with contextlib.redirect_stdout(io.StringIO()):
        for value in ("version 1: s <= 16  [a.py:4]", "version 2: s > 16  [a.py:4]"):
            printed(value, ["version 1: s <= 16  [m.py:3]", "version 2: s > 16  [m.py:3]"], "p")
        with pytest.raises(AssertionError, match="the text says version 1"):
            printed("version 2: s > 16  [a.py:4]", ["version 1: s <= 16  [m.py:3]"], "q")
