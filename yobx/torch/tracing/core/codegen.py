"""Generated ``forward`` of a traced graph: checks that a call matches the trace.

A traced graph holds one input structure (the lengths of the lists and tuples given as
examples, the keys of dicts) and the values of the Python constants it was traced with
(``flag=True``, ``shape=(6, 2)``): the graph computes with those only. torch.fx's
generated code indexes lists by position, so a shorter list raises an ``IndexError``
deep in the flattening and a longer one is silently truncated; a different constant is
silently ignored. The code generators here add a check at the top of ``forward`` for
each of those facts, with a message that says what was traced and what to do.
"""

from __future__ import annotations

from typing import Any

import torch.utils._pytree as pytree
from torch.fx.graph import CodeGen, _PyTreeCodeGen, _PyTreeInfo

#: constants compared in the generated code (their ``repr`` is valid Python)
_CHECKED_CONSTANTS = (bool, int, float, str, type(None))


def structure_checks(arg_names: list[str], in_spec: pytree.TreeSpec) -> list[str]:
    """One ``torch._assert`` line per list, tuple and dict among the traced inputs."""
    lines: list[str] = []
    for name, child in zip(arg_names, in_spec.children()):
        _walk_spec(child, name, name, lines)
    return lines


def _walk_spec(spec: pytree.TreeSpec, expr: str, label: str, lines: list[str]) -> None:
    if spec.type in (list, tuple):
        n = spec.num_children
        kind = spec.type.__name__
        message = (
            f"{label} was traced as a {kind} of {n} element(s) and this call gives "
            f"another number: a traced graph holds the structure of its example; trace "
            f"again with an example of the structure you call it with"
        )
        lines.append(f"torch._assert(len({expr}) == {n}, {message!r})")
        for i, child in enumerate(spec.children()):
            _walk_spec(child, f"{expr}[{i}]", f"{label}[{i}]", lines)
    elif spec.type is dict and all(isinstance(k, str) for k in spec.context):
        keys = sorted(spec.context)
        message = (
            f"{label} was traced as a dict with keys {keys} and this call gives other "
            f"keys: trace again with an example of the structure you call it with"
        )
        lines.append(f"torch._assert(sorted({expr}) == {keys!r}, {message!r})")
        for key, child in zip(spec.context, spec.children()):
            _walk_spec(child, f"{expr}[{key!r}]", f"{label}[{key!r}]", lines)


def constant_checks(constants: dict[str, Any]) -> list[str]:
    """One ``torch._assert`` line per Python constant the graph was traced with.

    :param constants: variable name in the generated code -> traced value
    """
    lines = []
    for var, value in constants.items():
        if type(value) not in _CHECKED_CONSTANTS or value != value:  # NaN never equals
            continue
        compare = "is" if value is None or isinstance(value, bool) else "=="
        message = (
            f"input {var!r} was traced with the constant {value!r}, and the graph "
            f"computes with that value only: pass {value!r}, or trace again with the "
            f"value you call it with"
        )
        lines.append(f"torch._assert({var} {compare} {value!r}, {message!r})")
    return lines


def _indent(lines: list[str]) -> str:
    """The checks as a block of ``forward``. It is skipped while torch.fx traces the
    generated code again (unpickling a GraphModule does), where inputs are proxies."""
    if not lines:
        return ""
    body = "".join(f"\n        {line}" for line in lines)
    return f"\n    if not torch.fx._symbolic_trace.is_fx_symbolic_tracing():{body}"


class CheckedCodeGen(CodeGen):
    """torch.fx's code generator plus checks of the Python constants traced with."""

    def __init__(self, constants: dict[str, Any]):
        super().__init__()
        self.constants = dict(constants)

    def gen_fn_def(self, free_vars, maybe_return_annotation, *, expanded_def=False):
        """The ``def forward(...)`` line followed by the constant checks."""
        names = {v.split(":")[0].split("=")[0].strip() for v in free_vars}
        definition = super().gen_fn_def(
            free_vars, maybe_return_annotation, expanded_def=expanded_def
        )
        kept = {k: v for k, v in self.constants.items() if k in names}
        return definition + _indent(constant_checks(kept))


class CheckedPyTreeCodeGen(_PyTreeCodeGen):
    """torch.fx's pytree code generator plus checks of the input structure (before
    flattening) and of the Python constants traced with (after)."""

    def __init__(self, pytree_info: _PyTreeInfo, constants: dict[str, Any]):
        super().__init__(pytree_info)
        self.constants = dict(constants)

    def gen_var_bindings(self, fn_args, free_vars, expanded_def):
        """Structure checks, torch.fx's flattening, then the constant checks."""
        info = self.pytree_info
        # `*args` is in the signature as it is in the model's; it is a tuple inside
        fn_args = [name.lstrip("*") for name in fn_args]
        checks = structure_checks(fn_args, info.in_spec)
        bindings = super().gen_var_bindings(fn_args, free_vars, expanded_def)
        names = {v.split(":")[0].split("#")[0].strip() for v in free_vars}
        kept = {k: v for k, v in self.constants.items() if k in names}
        return _indent(checks) + bindings + _indent(constant_checks(kept))
