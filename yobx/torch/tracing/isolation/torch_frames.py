"""The files torch skips when it looks for the user's frame, without importing them.

Creating a symbol or recording a guard makes the ShapeEnv find the user's frame, for
its log messages and the locations in its errors: it skips the frames of the files
``torch.fx.experimental.symbolic_shapes.uninteresting_files()`` lists. The first call
of that function imports the modules whose files it lists (``torch.export._trace``,
``torch._inductor.sizevars``, dynamo's guards...): a third of a second, paid by the
first trace of every process.

:func:`uninteresting_files` gives the same set of file names from the paths of those
modules inside torch's package, importing nothing; :func:`cheap_uninteresting_files`
installs it in the trace's patch window (once torch's own set is built, torch's
function is as cheap and is left alone).
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
from collections.abc import Iterator
from typing import cast

import torch
import torch.fx.experimental.symbolic_shapes as symbolic_shapes

from .patching import patched_attributes

#: the modules torch's ``uninteresting_files`` lists (torch 2.13)
_MODULES = (
    "torch.fx.experimental.symbolic_shapes",
    "torch.export._trace",
    "torch.fx.experimental.recording",
    "torch.fx.experimental.sym_node",
    "torch.fx.interpreter",
    "torch.fx._symbolic_trace",
    "torch",
    "torch._compile",
    "torch._dynamo.eval_frame",
    "torch._inductor.sizevars",
    "torch._library.custom_ops",
    "torch._library.fake_impl",
    "torch._subclasses.meta_utils",
    "torch._subclasses.fake_tensor",
    "torch._logging._internal",
    "torch._logging.structured",
    # torch._dynamo.guards.uninteresting_files()
    "torch._dynamo.external_utils",
    "torch._dynamo.polyfills",
)


def _module_file(name: str) -> str | None:
    """The file of a module of torch, from its loaded module or from torch's folder."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    root = os.path.dirname(torch.__file__)
    path = os.path.join(root, *name.split(".")[1:])
    for candidate in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.exists(candidate):
            return candidate
    return None


def uninteresting_files() -> frozenset[str] | None:
    """torch's set of uninteresting files, or ``None`` when one of them cannot be
    located without importing it (torch's own function is used then; asked again next
    time, when dynamo's polyfills may be loaded)."""
    global _FILES
    if _FILES is None:
        _FILES = _located_files()
    return _FILES


_FILES: frozenset[str] | None = None


def _located_files() -> frozenset[str] | None:
    files = {_module_file(name) for name in _MODULES}
    loader = sys.modules.get("torch._dynamo.polyfills.loader")
    if None in files or loader is None:
        return None
    files.update(getattr(m, "__file__", None) for m in loader.POLYFILLED_MODULES)
    if None in files:
        return None
    higher_order_ops = os.path.join(os.path.dirname(torch.__file__), "_higher_order_ops")
    files.update(glob.glob(os.path.join(higher_order_ops, "*.py")))
    files.add("<string>")
    # None was ruled out above
    return frozenset(cast("set[str]", files))


@contextlib.contextmanager
def cheap_uninteresting_files() -> Iterator[None]:
    """Inside the block (in the patch window's thread), torch finds the user's frame
    without importing the modules it skips."""
    cache_info = getattr(symbolic_shapes.uninteresting_files, "cache_info", None)
    # already replaced (a nested trace), or torch's set is built (as cheap as this one)
    if cache_info is None or cache_info().currsize or uninteresting_files() is None:
        yield
        return
    with patched_attributes([(symbolic_shapes, "uninteresting_files", _cheap)]):
        yield


def _cheap() -> frozenset[str]:
    files = uninteresting_files()
    # installed once the set was located, and a located set is kept for the process
    assert files is not None
    return files
