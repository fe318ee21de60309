"""The process and thread state a trace may change, captured before and restored after.

A trace installs torch's fake mode, sometimes a proxy mode (``make_fx`` for
``torch.vmap``), functorch layers, dispatch-key guards, torch.fx's patcher and flags.
Each is undone by a ``with`` block or a ``finally``, but a ``KeyboardInterrupt`` can land
anywhere, including in the middle of an ``__exit__`` (FakeTensorMode's, a
``contextlib`` generator's), and then some of it stays installed: every eager op of
the process would return a FakeTensor. :class:`WorldState` records what a trace may
change and puts it back; :func:`clear_interrupted_frames` first finalizes the context
managers an interrupt left suspended, so that their late clean-up cannot undo the
repair later.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import torch
import torch.fx._symbolic_trace as fx_symbolic_trace
from torch.fx.experimental import _config as fx_config
from torch.fx.experimental import proxy_tensor, symbolic_shapes
from torch.utils import _python_dispatch


class _ThreadState(threading.local):
    """What this module and :mod:`.patch_window` keep per thread."""

    #: the patch window open in this thread (None outside one)
    window: Any = None
    #: torch.fx's patcher of the trace running in this thread (see :mod:`.fx_isolation`)
    fx_patcher: Any = None
    #: the classes of the modules traced in this thread, enclosing traces included
    #: (see :mod:`.module_classes`); None outside a trace
    module_classes: Any = None


#: per-thread state of the tracer's isolation
THREAD_STATE = _ThreadState()

_MODE_KEYS = tuple(torch._C._TorchDispatchModeKey.__members__.values())
#: process-wide flags torch's TorchDispatchMode.__enter__/__exit__ maintain
_DISPATCH_FLAGS = (
    "_is_in_torch_dispatch_mode",
    "_is_in_non_infra_torch_dispatch_mode",
    "_is_in_any_mode_without_ignore_compile_internals",
)
#: torch.fx.experimental._config entries the tracer sets (thread-local ContextVars)
_CONFIG_ENTRIES = ("backed_size_oblivious",)
_DECREMENT_NESTING = {
    torch._C._functorch.TransformType.Vmap: torch._C._functorch._vmap_decrement_nesting,
    torch._C._functorch.TransformType.Grad: torch._C._functorch._grad_decrement_nesting,
    torch._C._functorch.TransformType.Jvp: torch._C._functorch._jvp_decrement_nesting,
    torch._C._functorch.TransformType.Functionalize: torch._C._functorch._func_decrement_nesting,
}


def _config_overrides() -> tuple[Any, ...]:
    entries = getattr(fx_config, "_config", {})
    return tuple(
        entries[name].user_override.get() if name in entries else None for name in _CONFIG_ENTRIES
    )


def _suppressed_guards() -> tuple[bool, int]:
    tls = symbolic_shapes.TLS
    return getattr(tls, "suppress_guards", False), len(getattr(tls, "suppress_guards_stack", ()))


def _restore_suppressed_guards(flag: bool, depth: int) -> None:
    tls = symbolic_shapes.TLS
    stack = getattr(tls, "suppress_guards_stack", None)
    if stack is not None:
        del stack[depth:]
    if getattr(tls, "suppress_guards", False) is not flag:
        tls.suppress_guards = flag


def _interpreter_depth() -> int:
    return len(torch._C._functorch.get_interpreter_stack() or ())


@dataclasses.dataclass(frozen=True)
class WorldState:
    """What a trace may change in the process and in the tracing thread."""

    grad_enabled: bool
    modes: tuple[Any, ...]
    dispatch_stack: int
    function_stack: int
    meta_in_tls: bool
    only_lift_cpu_tensors: bool
    included: int
    excluded: int
    dispatch_flags: tuple[bool, ...]
    interpreter_depth: int
    make_fx_tracer: Any
    fx_patcher: Any
    thread_fx_patcher: Any
    fx_tracing_flag: Any
    config: tuple[Any, ...]
    #: torch's thread-local guard suppression (``ShapeEnv.suppress_guards``): left on,
    #: no later trace of the thread would record the facts it takes from its examples
    suppress_guards: tuple[bool, int]

    @classmethod
    def capture(cls) -> WorldState:
        """The current state."""
        modes = tuple(torch._C._get_dispatch_mode(key) for key in _MODE_KEYS)
        return cls(
            grad_enabled=torch.is_grad_enabled(),
            modes=modes,
            dispatch_stack=torch._C._len_torch_dispatch_stack(),
            function_stack=torch._C._len_torch_function_stack(),
            meta_in_tls=torch._C._meta_in_tls_dispatch_include(),
            only_lift_cpu_tensors=torch._C._only_lift_cpu_tensors(),
            included=torch._C._dispatch_tls_local_include_set().raw_repr(),
            excluded=torch._C._dispatch_tls_local_exclude_set().raw_repr(),
            dispatch_flags=tuple(getattr(_python_dispatch, name) for name in _DISPATCH_FLAGS),
            interpreter_depth=_interpreter_depth(),
            make_fx_tracer=proxy_tensor._CURRENT_MAKE_FX_TRACER,
            fx_patcher=fx_symbolic_trace.CURRENT_PATCHER,
            thread_fx_patcher=THREAD_STATE.fx_patcher,
            fx_tracing_flag=fx_symbolic_trace._is_fx_tracing_flag,
            config=_config_overrides(),
            suppress_guards=_suppressed_guards(),
        )

    def with_process_state(self) -> WorldState:
        """This state with the process-wide values (shared by every thread) read now."""
        now = WorldState.capture()
        return dataclasses.replace(
            self,
            dispatch_flags=now.dispatch_flags,
            make_fx_tracer=now.make_fx_tracer,
            fx_patcher=now.fx_patcher,
            fx_tracing_flag=now.fx_tracing_flag,
        )

    def intact(self) -> bool:
        """True when the current state is this one."""
        return WorldState.capture() == self

    def restore(self) -> None:
        """Puts everything back; each step is idempotent (it may run again after an
        interrupt)."""
        self._restore_fx()
        self._restore_modes()
        while _interpreter_depth() > self.interpreter_depth:
            _DECREMENT_NESTING[torch._C._functorch.peek_interpreter_stack().key()]()
        torch._C._set_meta_in_tls_dispatch_include(self.meta_in_tls)
        torch._C._set_only_lift_cpu_tensors(self.only_lift_cpu_tensors)
        self._restore_dispatch_keys()
        torch._C._set_grad_enabled(self.grad_enabled)
        for name, value in zip(_DISPATCH_FLAGS, self.dispatch_flags):
            setattr(_python_dispatch, name, value)
        proxy_tensor._CURRENT_MAKE_FX_TRACER = self.make_fx_tracer
        entries = getattr(fx_config, "_config", {})
        for name, value in zip(_CONFIG_ENTRIES, self.config):
            if name in entries and entries[name].user_override.get() is not value:
                entries[name].user_override.set(value)
        _restore_suppressed_guards(*self.suppress_guards)

    def _restore_fx(self) -> None:
        patcher = THREAD_STATE.fx_patcher
        if patcher is not self.thread_fx_patcher:
            revert_fx_patches(patcher)
            THREAD_STATE.fx_patcher = self.thread_fx_patcher
        patcher = fx_symbolic_trace.CURRENT_PATCHER
        if patcher is not self.fx_patcher:
            revert_fx_patches(patcher)
            fx_symbolic_trace.CURRENT_PATCHER = self.fx_patcher
        if fx_symbolic_trace._is_fx_tracing_flag is not self.fx_tracing_flag:
            fx_symbolic_trace._is_fx_tracing_flag = self.fx_tracing_flag

    def _restore_modes(self) -> None:
        for key, mode in zip(_MODE_KEYS, self.modes):
            if torch._C._get_dispatch_mode(key) is not mode:
                torch._C._unset_dispatch_mode(key)
                if mode is not None:
                    torch._C._set_dispatch_mode(mode)
        while torch._C._len_torch_dispatch_stack() > self.dispatch_stack:
            torch._C._pop_torch_dispatch_stack()
        while torch._C._len_torch_function_stack() > self.function_stack:
            torch._C._pop_torch_function_stack()

    def _restore_dispatch_keys(self) -> None:
        included = torch._C._dispatch_tls_local_include_set()
        excluded = torch._C._dispatch_tls_local_exclude_set()
        if included.raw_repr() == self.included and excluded.raw_repr() == self.excluded:
            return
        _force_dispatch_keys(
            torch._C.DispatchKeySet.from_raw_repr(self.included),
            torch._C.DispatchKeySet.from_raw_repr(self.excluded),
        )


def _force_dispatch_keys(included: Any, excluded: Any) -> None:
    """Sets the thread's local dispatch key sets to ``included`` and ``excluded``.

    Some keys have no name in Python (``Tracer``, the testing keys) and cannot be set
    one by one. torch's ``_ForceDispatchKeyGuard`` sets whole sets and puts back, on
    exit, the sets it found on entry: a second guard entered inside the first finds
    the wanted sets, and exiting the first, then the second, leaves them.
    """
    first = torch._C._ForceDispatchKeyGuard(included, excluded)
    first.__enter__()
    second = torch._C._ForceDispatchKeyGuard(included, excluded)
    second.__enter__()
    first.__exit__(None, None, None)
    second.__exit__(None, None, None)


_MISSING = object()


class PatchedClasses(fx_symbolic_trace._PatchedFn):
    """A torch.fx patch of an ``nn.Module`` attribute made on the classes of the traced
    modules instead (see :mod:`.module_classes`).

    ``frame_dict`` holds ``(class, value in its __dict__ before, new value)`` triples;
    ``revert`` deletes an attribute the class only inherited. Both are idempotent.
    """

    def revert(self) -> None:
        for cls, saved, _ in reversed(self.frame_dict):
            if saved is not _MISSING:
                setattr(cls, self.fn_name, saved)
            elif self.fn_name in vars(cls):
                delattr(cls, self.fn_name)

    def patch(self) -> None:
        for cls, _, value in self.frame_dict:
            setattr(cls, self.fn_name, value)

    @classmethod
    def of(cls, name: str, values: list[tuple[type, Any]]) -> PatchedClasses:
        """The patch setting ``name`` to each ``(class, value)``, with what each class
        holds now."""
        entries = tuple((c, vars(c).get(name, _MISSING), value) for c, value in values)
        # torch's patch fields reused: new_fn is the first value, None for no class
        return cls(entries, name, None, values[0][1] if values else None)  # type: ignore[arg-type]


class PatchedDictItems(fx_symbolic_trace._PatchedFn):
    """torch.fx patches of several names of one dict (``math.__dict__``), made and
    reverted as one ``dict.update``.

    ``frame_dict`` is the dict, ``orig_fn`` the original values by name and ``new_fn``
    the replacements by name. Both methods are idempotent.
    """

    def revert(self) -> None:
        self.frame_dict.update(self.orig_fn)

    def patch(self) -> None:
        self.frame_dict.update(self.new_fn)


def revert_fx_patches(patcher: Any) -> None:
    """Undoes the patches of a torch.fx ``_Patcher``, latest first.

    Safe to run twice, unlike torch.fx's own revert (which deletes the names it added).
    """
    if patcher is None:
        return
    for patch in reversed(patcher.patches_made):
        if isinstance(patch, (PatchedClasses, PatchedDictItems)):
            patch.revert()
        elif isinstance(patch, fx_symbolic_trace._PatchedFnSetAttr):
            setattr(patch.frame_dict, patch.fn_name, patch.orig_fn)
        elif isinstance(patch, fx_symbolic_trace._PatchedFnDel):
            if patch.frame_dict.get(patch.fn_name) is patch.new_fn:
                del patch.frame_dict[patch.fn_name]
        else:
            patch.frame_dict[patch.fn_name] = patch.orig_fn


def involves_interrupt(error: BaseException | None) -> bool:
    """True if ``error`` or an exception it chains is a KeyboardInterrupt.

    torch turns an interrupt raised in a Python callback of its C++ code into a
    RuntimeError naming it.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, KeyboardInterrupt) or "KeyboardInterrupt" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def clear_interrupted_frames(error: BaseException) -> None:
    """Clears the frames ``error`` went through, innermost first.

    A ``with`` block whose ``__exit__`` was interrupted before it ran leaves its context
    manager suspended (a ``contextlib`` generator holding C++ dispatch guards): it
    finalizes whenever the traceback is freed and would then restore the state of the
    middle of the trace. Clearing the frames finalizes them now, in the order they
    were entered, before the world is restored. The traceback keeps its lines; only
    the local variables of the traced code are lost.
    """
    frames, seen = [], set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        pending.extend((current.__cause__, current.__context__))
    for frame in reversed(frames):
        try:
            frame.clear()
        except RuntimeError:
            # a frame still running (the trace itself and its callers)
            continue


def current_fx_patcher() -> Any:
    """torch.fx's patcher of the trace running in this thread (None if there is none)."""
    return THREAD_STATE.fx_patcher or fx_symbolic_trace.CURRENT_PATCHER


__all__ = [
    "THREAD_STATE",
    "PatchedClasses",
    "WorldState",
    "clear_interrupted_frames",
    "current_fx_patcher",
    "involves_interrupt",
    "revert_fx_patches",
]
