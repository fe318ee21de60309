"""onnxscript's torch_lib imported with each function translated when first used.

Importing ``onnxscript.function_libs.torch_lib.ops`` translates every function it
registers at once: the ~50 written in onnxscript's language are compiled from their
source (AST, analysis, ONNX function), and the signature of each of the ~450 traced
ones is read from its annotations (``typing.get_type_hints``). That is 0.45 s, paid by
the first export in a process (a fifth of a tiny decoder's ``export_for_generation``)
and by anything importing torch_lib, transformers' ``exporter_onnx`` included, though
an export uses a few dozen of those functions.

:func:`import_torch_lib` imports it with both deferred: a scripted function is compiled,
and a traced one's signature read, the first time something asks for it
(``function_ir``, ``op_signature``...). The objects are onnxscript's own classes
(subclasses of them), so torch.onnx, onnxscript and transformers use them unchanged,
whoever imports torch_lib afterwards. ``unittests/torch/onnx/test_lazy_torch_lib.py``
checks that each deferred translation equals onnxscript's.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

import onnxscript
from onnxscript._internal import ast_utils, main, values

from yobx.torch.tracing.isolation.patching import patched_attributes

_TORCH_LIB_OPS = "onnxscript.function_libs.torch_lib.ops"
_TRACED_INIT = values.TracedOnnxFunction.__init__


def import_torch_lib() -> None:
    """Imports torch_lib's functions, their translations deferred to first use.

    Does nothing when torch_lib is imported already (translated then as onnxscript
    does it). Only the functions defined by this import are deferred: onnxscript's
    ``script`` and ``TracedOnnxFunction`` are patched for the import alone (other
    threads keep the originals) and restored after it, also on an error.
    """
    if _TORCH_LIB_OPS in sys.modules:
        return
    with patched_attributes(
        [
            (onnxscript, "script", _deferred_script),
            (values.TracedOnnxFunction, "__init__", _deferred_traced_init),
        ]
    ):
        __import__(_TORCH_LIB_OPS)


def _deferred_script(opset: values.Opset | None = None, default_opset=None, **kwargs):
    """``onnxscript.script`` returning a function compiled when first used."""
    opset = opset or values.Opset("this", 1)
    if not isinstance(opset, values.Opset):
        raise TypeError(
            "Script parameter must be an opset. Did you use @script instead of @script()?"
        )

    def transform(function: Callable) -> values.OnnxFunction:
        if not inspect.isfunction(function):
            raise TypeError("The ONNXScript decorator should be applied to functions only.")
        return DeferredOnnxFunction(opset, function, default_opset, kwargs)

    return transform


class DeferredOnnxFunction(values.OnnxFunction):
    """An ``OnnxFunction`` whose source is compiled the first time its IR, its source
    or its signature is read, as ``onnxscript.script`` compiles it at decoration.

    The names a function reads are looked up in its module when it is compiled, later
    than onnxscript does it; torch_lib binds each name once, so they are the same.
    """

    def __init__(
        self,
        opset: values.Opset,
        function: Callable,
        default_opset: values.Opset | None,
        kwargs: dict[str, Any],
    ):
        # OnnxFunction.__init__ needs the compiled function: its fields are set here
        # and the compiled ones are properties
        values.Op.__init__(self, opset, function.__name__)
        self.function = function
        self.kwargs = kwargs
        self._default_opset = default_opset
        functools.update_wrapper(self, function)
        self.traceable = False

    @functools.cached_property
    def _compiled(self) -> tuple[Any, str]:
        """The function's IR and source, as ``onnxscript.script`` makes them."""
        source, tree = ast_utils.get_src_and_ast(self.function)
        module = inspect.getmodule(self.function)
        names = dict(vars(module)) if module is not None else {}
        names.update(inspect.getclosurevars(self.function).nonlocals)
        ir_function = main.script_check(
            tree, self.opset, names, source, default_opset=self._default_opset
        )
        ir_function.meta["opset_version"] = self.opset.version
        return ir_function, source

    @property
    def function_ir(self):  # type: ignore[override]
        return self._compiled[0]

    @property
    def source(self) -> str:  # type: ignore[override]
        return self._compiled[1]

    @property
    def op_signature(self):  # type: ignore[override]
        # Op.__init__ set it to None
        if self._signature is None:
            self._signature = _signature_of(self.function, self.function_ir.domain, self.name)
        return self._signature

    @op_signature.setter
    def op_signature(self, value) -> None:
        self._signature = value


def _deferred_traced_init(self: values.TracedOnnxFunction, opset: values.Opset, func: Callable):
    """``TracedOnnxFunction.__init__`` without reading the signature: the object
    becomes a :class:`DeferredTracedOnnxFunction`, which reads it when asked (an
    instance of a subclass is made as its class makes it)."""
    if type(self) is not values.TracedOnnxFunction:
        _TRACED_INIT(self, opset, func)
        return
    values.Op.__init__(self, opset, func.__name__)
    self.func = func
    functools.update_wrapper(self, func)
    self.__class__ = DeferredTracedOnnxFunction


class DeferredTracedOnnxFunction(values.TracedOnnxFunction):
    """A ``TracedOnnxFunction`` whose signature is read from its annotations the first
    time it is asked for."""

    @property
    def op_signature(self):  # type: ignore[override]
        # Op.__init__ set it to None
        if self._signature is None:
            self._signature = _signature_of(self.func, "_traced", self.name)
        return self._signature

    @op_signature.setter
    def op_signature(self, value) -> None:
        self._signature = value


def _signature_of(function: Callable, domain: str, name: str):
    """The signature onnxscript reads from a function's annotations."""
    from onnxscript.ir import _schemas

    return _schemas.op_signature_from_function(function, domain=domain, name=name)
