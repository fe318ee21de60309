"""What the tracer decides from symbolic values, and where in the user's code.

Python turns a proxy into a bool, an int or a float (``if``, ``range``, ``int()``):
:class:`DecisionsMixin` answers only what is provable from the dimensions' ranges and
facts (or specializes when the user allowed it), records each decision as a
:class:`~yobx.torch.tracing.symbolic.symbolic.Guard`, and names the user's ``file:line`` in
every message. ``torch._check`` adds facts the same way.
"""

from __future__ import annotations

import linecache
import os
import sys
from types import FrameType
from typing import Any, cast

import sympy
import torch
from torch.fx.proxy import Proxy

from ..constraints.value_checks import asserting, check_value
from ..errors import TracingError
from ..symbolic.symbolic import Guard
from .tracer_contract import MixinBase

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
#: the ``yobx`` package's directory (this file is yobx/torch/tracing/core/decisions.py)
_YOBX_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3)) + os.sep
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
_INTERNAL_DIRS = (_TORCH_DIR, _YOBX_DIR + "torch" + os.sep)

#: marks a value that is not a plain Python constant
NOT_CONSTANT = object()

#: file name -> whether it is torch's, yobx's or the standard library's (a node's
#: location walks a few such frames up to the user's), and (code, line) -> the text of
#: a node's stack trace: every layer of a model records the same lines. A user's file
#: edited between two traces is a new code object when reloaded. Bounded: code made by
#: exec in a loop would otherwise keep them growing.
_INTERNAL_FILES: dict = {}
_STACK_TRACES: dict = {}
_MAX_REMEMBERED = 20_000


def _remember(cache: dict, key: Any, value: Any) -> Any:
    if len(cache) >= _MAX_REMEMBERED:
        cache.clear()
    cache[key] = value
    return value


def _itself(expression: Any) -> Any:
    """The decided expression, built from itself (see ``rely_on_default_bounds``)."""
    return expression


def is_internal(filename: str) -> bool:
    """Frames of torch, yobx's tracer and the standard library are not user code."""
    if filename.startswith(_INTERNAL_DIRS) or filename.startswith("<"):
        return True
    return filename.startswith(_STDLIB_DIR) and "site-packages" not in filename


def user_location() -> str:
    """``file:line`` of the first frame outside torch and yobx's torch package (the
    user's call of ``trace`` or ``to_onnx``), ``""`` when there is none."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if not is_internal(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def constant_value(val: Any) -> Any:
    """Returns ``val`` if it is a plain Python constant (no tensor, no symbol)."""
    if val is None:
        return NOT_CONSTANT
    if isinstance(val, (bool, int, float, str, torch.dtype, torch.device, torch.layout)):
        return val
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        constant = val.node.maybe_as_int() if isinstance(val, torch.SymInt) else None
        if constant is not None:
            return constant
        if isinstance(val, torch.SymBool):
            constant = val.node.maybe_as_bool()
            if constant is not None:
                return constant
        return NOT_CONSTANT
    if isinstance(val, (tuple, list)):
        items = [constant_value(v) for v in val]
        if any(i is NOT_CONSTANT for i in items):
            return NOT_CONSTANT
        return type(val)(items) if not hasattr(val, "_fields") else type(val)(*items)
    return NOT_CONSTANT


class DecisionsMixin(MixinBase):
    """Conversions of proxies to Python values, source locations, ``torch._check``.

    Mixed into :class:`~yobx.torch.tracing.CustomTracer`, which provides ``dims``,
    ``guards``, ``refinements``, ``state``, ``create_proxy`` (torch.fx's) and, from
    :class:`~yobx.torch.tracing.core.loop_tracing.LoopsMixin`, ``loop_symbols`` and
    ``loop_refuse`` (all declared in :class:`~.tracer_contract.TracerContract`).
    """

    # Python conversions

    def missing_example_error(self, obj: Proxy, what: str) -> TracingError:
        """The error for a decision on a value computed from inputs given no example.

        Names the parameters to give examples for: the placeholders without value
        ``obj`` is computed from.
        """
        missing: list[str] = []
        stack, seen = [obj.node], set()
        while stack:
            node = stack.pop()
            if node in seen or "val" in node.meta:
                continue
            seen.add(node)
            if node.op == "placeholder":
                missing.append(str(node.target))
            stack.extend(node.all_input_nodes)
        names = ", ".join(repr(n) for n in sorted(missing)) or "an input"
        example = ", ".join(f"{n!r}: <example>" for n in sorted(missing)) or "..."
        location = self.location()
        return TracingError.at(
            location,
            f"{what} needs the value of `{obj.node.name}`, computed from "
            f"{names} traced without an example (only what needs no decision on "
            f"values or shapes traces then, as with torch.fx); pass an example: "
            f"concrete_args={{{example}}}",
        )

    def to_bool(self, obj: Proxy) -> bool:
        """``bool(proxy)``: decided only when provable (see :class:`SymbolicDimensions`)."""
        if "val" not in obj.node.meta:
            raise self.missing_example_error(obj, "a Python bool (if, assert, and/or)")
        val = obj.node.meta.get("val")
        on_values = isinstance(val, torch.Tensor) or (
            isinstance(val, torch.SymBool) and self.trace_dims().is_data_dependent(val)
        )
        if on_values and asserting(self._user_frame()):
            # `assert lengths.max() <= n`: checked when the graph runs, as torch.export
            return self.value_check(obj)
        if isinstance(val, torch.SymBool):
            return self.decide(val)
        if isinstance(val, (torch.SymInt, torch.SymFloat)):
            # `if n:` is `n != 0` compared in the graph: torch folds `s != 0` to True on
            # its positive symbols, and the comparison's node has that decision judged
            # for the sizes below the default range (a version for `s == 0`)
            return bool(obj != 0)
        if isinstance(val, torch.Tensor):
            raise TracingError.at(
                self.location(),
                "the truth value of a traced tensor is data-dependent "
                "(`if tensor:`, `assert tensor`, `and`/`or` on tensors); use torch.where, "
                "torch.cond, or compare shapes instead of values",
            )
        return bool(val)

    def value_check(self, condition: Proxy, text: str | None = None) -> bool:
        """Records a check on tensor values (see :mod:`.value_checks`): the graph raises
        where it is false, the trace goes on where it holds (True)."""
        frame = self._user_frame()
        location = self.location()
        if text is None and frame is not None:
            text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        self.create_proxy("call_function", check_value, (condition, text or "", location), {})
        val = condition.node.meta.get("val")
        if isinstance(val, torch.SymBool):
            # as torch._check tells torch: later decisions may rely on it
            self._assume(val)
        return True

    def decide(self, val: torch.SymBool, what: str = "") -> bool:
        """Decides a condition: proved, or adopted from the example as a constraint."""
        dims = self.trace_dims()
        decided = dims.decide(val)
        location = self.location()
        # rendered before adopting: adopting may replace the symbols it names
        expression = dims.render(val)
        indices = self.loop_symbols(val.node.expr) if decided is None else ()
        if indices:
            # on a loop's index: its steps differ, the loop cannot be a scan and is
            # unrolled at the example's length, where the index is the example's
            decided = bool(dims.hint(val))
            self.loop_refuse(indices, f"a decision on `{expression}`")
            reason = "loop"
        elif decided is None:
            what = what or "the condition"
            if dims.is_data_dependent(val):
                raise self.trace_refinements().data_dependent_error(val, location, what)
            decided = bool(dims.hint(val))
            fact = val if decided else torch.sym_not(val)
            self.trace_refinements().adopt(fact.node.expr, location, what, origin="branch")
            reason = "adopted"
        else:
            self.trace_refinements().rely_on_default_bounds(
                _itself, [val.node.expr], decided, location
            )
            reason = "bounds"
        self.guards.append(Guard(expression, decided, reason, location))
        return decided

    def _rely_on_default_bounds(self, condition: sympy.Basic, value: bool) -> None:
        """A condition torch decided inside an operator from the ranges alone (see
        :attr:`SymbolicDimensions.on_default_bound_division`), judged as a decision."""
        self.trace_refinements().rely_on_default_bounds(
            _itself, [condition], value, self.location()
        )

    def _assume(self, fact: torch.SymBool | sympy.Basic) -> None:
        """Makes ``fact`` known to the ShapeEnv (its guard is not judged again)."""
        dims = self.trace_dims()
        if isinstance(fact, sympy.Basic):
            fact = dims.shape_env.create_symboolnode(fact)
        self.state.allowed_guards += 1
        try:
            dims.assume(fact)
        finally:
            self.state.allowed_guards -= 1

    def to_int(self, obj: Proxy) -> int:
        """``int(proxy)`` / ``operator.index``: a Python int is needed here."""
        return int(self.python_number(obj, "a Python int (range(), int(), list indexing)"))

    def to_float(self, obj: Proxy) -> float:
        """``float(proxy)``: a Python float is needed here."""
        return float(self.python_number(obj, "a Python float (float(), a math function)"))

    def python_number(self, obj: Proxy, what: str, location: str | None = None) -> int | float:
        """A Python number for a symbolic value: the value becomes a constant.

        One dimension involved: it is fixed to its example size (an error for a
        dimension declared dynamic, see :mod:`.refinement`). Several: their expression
        is fixed to its example value, a constraint checked when the graph runs. A
        loop's index: the loop is unrolled (see :mod:`.loops`).

        :param location: where it is needed (default: the user's current line)
        """
        if "val" not in obj.node.meta:
            raise self.missing_example_error(obj, what)
        val = obj.node.meta.get("val")
        constant = constant_value(val)
        if isinstance(constant, (int, float)):
            return constant
        if not isinstance(val, (torch.SymInt, torch.SymFloat)):
            raise TracingError.at(
                self.location(), f"{what} is needed here but the value is a {type(val).__name__}"
            )
        location = location or self.location()
        dims, refinements = self.trace_dims(), self.trace_refinements()
        if dims.is_data_dependent(val):
            raise refinements.data_dependent_error(val, location, what)
        hint = dims.hint(val)
        expression = dims.render(val)
        indices = self.loop_symbols(val.node.expr)
        if indices:
            self.loop_refuse(indices, f"{what} for `{expression}`")
            return hint
        symbols = val.node.expr.free_symbols
        if len(symbols) == 1 and isinstance(val, torch.SymFloat):
            # float(sqrt(seq)) fixes seq itself: an equality of floats is no range
            (symbol,) = symbols
            fact = cast(torch.SymBool, dims.symint(symbol) == dims.hint_of(symbol))
        else:
            # range((seq + 255) // 256) needs the expression's value, a range of seq
            # (seq <= 256), not seq itself, as torch.export adopts (a comparison of
            # symbolic numbers is a SymBool: torch's stubs say bool)
            fact = cast(torch.SymBool, val == hint)
        refinements.adopt(fact.node.expr, location, f"{what} for `{expression}`", origin="number")
        self.guards.append(Guard(f"{expression} == {hint!r}", True, "adopted", location))
        return hint

    # source locations

    @staticmethod
    def _user_frame():
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            internal = _INTERNAL_FILES.get(filename)
            if internal is None:
                internal = _remember(_INTERNAL_FILES, filename, is_internal(filename))
            if not internal:
                return frame
            frame = frame.f_back
        return None

    def location(self) -> str:
        """``file:line`` of the user's code being traced."""
        frame = self._user_frame()
        if frame is None:
            return "<unknown location>"
        return f"{frame.f_code.co_filename}:{frame.f_lineno}"

    def stack_trace(self) -> str:
        """Traceback-like text of the user's line (stored in ``meta["stack_trace"]``)."""
        frame = self._user_frame()
        if frame is None:
            return ""
        code = frame.f_code
        # keyed by the code's id (hashing a code object hashes its bytecode), checked
        # against the code itself, which the entry keeps alive (so is its id)
        key = (id(code), frame.f_lineno)
        entry = _STACK_TRACES.get(key)
        if entry is None or entry[0] is not code:
            import linecache

            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
            where = f'File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}'
            entry = _remember(_STACK_TRACES, key, (code, f"  {where}\n    {line}\n"))
        return entry[1]

    # torch._check

    def check(self, condition: Any, message: Any = None) -> None:
        """``torch._check(condition)`` on a symbolic condition: records it as a fact."""
        val = condition.node.meta.get("val") if isinstance(condition, Proxy) else condition
        if isinstance(condition, Proxy) and (
            isinstance(val, torch.Tensor)
            or (isinstance(val, torch.SymBool) and self.trace_dims().is_data_dependent(val))
        ):
            # torch._check(n.item() >= 0): on values, checked when the graph runs
            self.value_check(condition)
            return
        if not isinstance(val, torch.SymBool):
            raise TracingError.at(
                self.location(),
                f"torch._check expects a condition on dimensions, got "
                f"{type(val).__name__}; data-dependent checks on tensor values cannot be traced",
            )
        location = self.location()
        dims = self.trace_dims()
        # read before assuming it: the ShapeEnv then rewrites it to True
        condition, text = val.node.expr, dims.render(val)
        known = dims.decide(val)
        if known is False:
            raise TracingError.at(
                location,
                f"torch._check(`{dims.render(val)}`) is false for every "
                f"allowed size ({dims.describe_ranges(val)})",
            )
        if known is None:
            if not dims.hint(val):
                raise TracingError.at(
                    location,
                    f"torch._check(`{dims.render(val)}`) does not hold for the example inputs",
                )
            self._assume(val)
        # eager raises where the fact does not hold: so does the graph
        self.trace_refinements().user_checks.append((condition, text, location))
        self.guards.append(Guard(text, True, "torch._check", location))
