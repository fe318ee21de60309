"""Interrupting a trace at a chosen point, and what it may leave behind: nothing.

A trace function (``sys.settrace``) raises ``KeyboardInterrupt`` at the n-th Python
call made inside ``CustomTracer.trace``, as Ctrl-C would (Python checks for signals
at calls). After each interrupted trace, :func:`leftovers` lists what is not as it
was: patched attributes, torch's dispatch and function modes (a fake mode left
installed makes every eager op return a FakeTensor), dispatch keys, grad mode,
torch.fx's patcher and flag, functorch layers, the tracing lock, the user's module.

Used by ``test_tracing_interrupts.py`` (a few dozen points) and
``_scripts/sweep_interrupts.py`` (as many as wanted).
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.fx._symbolic_trace as fx_symbolic_trace
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.sym_node import SymNode
from torch.utils._python_dispatch import TorchDispatchMode

from yobx.torch.tracing import CustomTracer
from yobx.torch.tracing.isolation.patch_window import _WINDOW_LOCK, _dynamo_compile_lock
from yobx.torch.tracing.isolation.world_state import THREAD_STATE, WorldState

#: objects whose attributes the tracer patches (or could)
OWNERS = (
    torch,
    torch.Tensor,
    torch.nn.Module,
    torch.nn.functional,
    torch.func,
    torch.ops.higher_order,
    torch._C._nn,
    builtins,
    math,
    SymNode,
    fx_symbolic_trace,
)

#: names of the functions whose calls are the most delicate to interrupt (exits)
EXIT_NAMES = frozenset(
    {
        "__exit__",
        "close",
        "unwind",
        "undo",
        "restore",
        "release",
        "revert_fx_patches",
        "_pop_mode",
        "_restore_modes",
        "helper",
    }
)


class SweepModel(torch.nn.Module):
    """Touches every kind of state a trace installs: fake mode (every op), patched
    factories and ``len``, a buffer update, a message with a shape, ``torch.cond``
    (subgraphs) and ``torch.vmap`` (make_fx: proxy mode, functorch layers)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        self.calls.add_(1)
        y = torch.cat([self.linear(x), torch.zeros(x.shape[0], 4)], dim=1)
        message = f"shape {y.shape}"  # noqa: F841 - a message, no constraint
        if x.shape[0] > 1:
            y = y * len(x)
        z = torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (y,))
        return torch.vmap(lambda row: row.softmax(-1))(z) + self.calls


def example() -> tuple[torch.nn.Module, dict, dict]:
    """The model, its example inputs and dynamic shapes."""
    return SweepModel(), {"x": torch.randn(3, 4)}, {"x": {0: "batch"}}


def trace(model, inputs, dynamic_shapes) -> torch.fx.GraphModule:
    tracer = CustomTracer()
    graph = tracer.trace(model, concrete_args=inputs, dynamic_shapes=dynamic_shapes)
    return torch.fx.GraphModule(tracer.traced_model, graph)


_TORCH_DECOMPOSITIONS = tuple(
    os.path.join(os.path.dirname(torch.__file__), d) + os.sep for d in ("_decomp", "_prims_common")
)


def _in_torch_decomposition(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith(_TORCH_DECOMPOSITIONS):
            return True
        frame = frame.f_back
    return False


#: torch's dispatch-mode exits: an interrupt at their start, while the fake mode
#: dispatches an operation, makes a C++ guard throw from its destructor and the process
#: aborts (torch 2.13). A real Ctrl-C never lands there during a trace: the tracer
#: raises it at its next operation (yobx.torch.tracing.isolation.deferred_interrupts).
_DISPATCH_MODE_EXITS = frozenset(
    {TorchDispatchMode.__exit__.__code__, FakeTensorMode.__exit__.__code__}
)


def _in_dispatch_mode_exit(frame: Any) -> bool:
    """A dispatch mode's ``__exit__`` runs (``frame`` or a caller) inside a mode's
    ``__torch_dispatch__``, which torch's C++ dispatcher called."""
    exiting = False
    while frame is not None:
        code = frame.f_code
        if code in _DISPATCH_MODE_EXITS:
            exiting = True
        elif exiting and code.co_name == "__torch_dispatch__":
            return True
        frame = frame.f_back
    return False


class Interrupter:
    """A trace function raising KeyboardInterrupt at the ``at``-th Python call (never
    with 0); with ``record``, it also records the code object of every call."""

    def __init__(self, at: int = 0, record: bool = False):
        self.at = at
        self.count = 0
        self.codes: list[Any] | None = [] if record else None
        self.where = ""

    def __call__(self, frame, event, arg):
        if event == "call":
            self.count += 1
            if self.codes is not None:
                self.codes.append(frame.f_code)
            if self.at and self.count >= self.at and not self.where:
                code = frame.f_code
                if _in_dispatch_mode_exit(frame):
                    # see _DISPATCH_MODE_EXITS: interrupted at the next call instead
                    return None
                if _in_torch_decomposition(frame):
                    # an interrupt raised while the fake mode runs a decomposition (a
                    # Python callback of its C++ code, under torch._disable_dynamo)
                    # aborted the process (torch 2.13, `increase_prec`'s `x.to`, under
                    # pytest-xdist): a crash no tracer can undo; the next call outside
                    # torch's decompositions is interrupted instead
                    return None
                self.where = f"{code.co_filename}:{code.co_firstlineno} {code.co_name}"
                # Python removes a trace function that raises: one interrupt per trace
                raise KeyboardInterrupt(f"interrupt at call {self.at} ({self.where})")
        return None


def run_interrupted(function: Callable[[], Any], interrupter: Interrupter) -> BaseException | None:
    """Runs ``function`` under ``interrupter``; returns what it raised (None if nothing)."""
    sys.settrace(interrupter)
    try:
        function()
    except BaseException as e:
        return e
    finally:
        sys.settrace(None)
    return None


def choose_points(codes: list[Any], regular: int, exits: int) -> list[int]:
    """``regular`` points spread over the whole trace, ``exits`` spread over the calls
    of the functions named in :data:`EXIT_NAMES` (1-based call indices)."""
    total = len(codes)
    points = {1 + (i * total) // regular for i in range(regular)} if regular else set()
    exit_points = [i + 1 for i, code in enumerate(codes) if code.co_name in EXIT_NAMES]
    if exits and exit_points:
        step = max(1, len(exit_points) // exits)
        points.update(exit_points[::step][:exits])
    return sorted(points)


@dataclasses.dataclass
class Snapshot:
    """The state an interrupted trace must leave as it was."""

    attributes: dict
    world: WorldState
    module_state: dict
    sigint_handler: object = None


def snapshot(model: torch.nn.Module) -> Snapshot:
    return Snapshot(
        attributes={(id(o), name): v for o in OWNERS for name, v in list(vars(o).items())},
        world=_world(),
        module_state={
            "dict": dict(vars(model)),
            "buffers": {k: v.clone() for k, v in model.named_buffers()},
            "hooks": [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()],
        },
        sigint_handler=signal.getsignal(signal.SIGINT),
    )


def _world() -> WorldState:
    # torch.fx's flag may hold the tracer's thread-aware flag: only its truth matters
    world = WorldState.capture()
    return dataclasses.replace(world, fx_tracing_flag=bool(world.fx_tracing_flag))


def _lock_is_free(lock) -> bool:
    free: list[bool] = []

    def probe():
        acquired = lock.acquire(timeout=5)
        free.append(acquired)
        if acquired:
            lock.release()

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return free[0]


def leftovers(before: Snapshot, model: torch.nn.Module) -> list[str]:
    """What differs from ``before`` (an empty list when the world is as it was)."""
    problems = []
    now = snapshot(model)
    names = {id(o): getattr(o, "__name__", repr(o)) for o in OWNERS}
    for key in before.attributes.keys() | now.attributes.keys():
        if key not in before.attributes and isinstance(
            now.attributes[key], torch._ops.HigherOrderOperator
        ):
            # torch.ops.higher_order registers an operator on first use
            continue
        if before.attributes.get(key) is not now.attributes.get(key):
            problems.append(f"attribute {names[key[0]]}.{key[1]} changed")
    for field in dataclasses.fields(WorldState):
        old, new = getattr(before.world, field.name), getattr(now.world, field.name)
        if old != new:
            problems.append(f"{field.name}: {old!r} -> {new!r}")
    if type(torch.ones(2) + 1) is not torch.Tensor:
        problems.append(f"eager ops return {type(torch.ones(2) + 1).__name__}")
    if signal.getsignal(signal.SIGINT) is not before.sigint_handler:
        problems.append(f"SIGINT handler {signal.getsignal(signal.SIGINT)!r} left installed")
    if THREAD_STATE.window is not None:
        problems.append("the thread still has a patch window")
    if not _lock_is_free(_WINDOW_LOCK):
        problems.append("the tracing lock is still held")
    if not _lock_is_free(_dynamo_compile_lock()):
        problems.append("dynamo's compile lock is still held")
    if before.module_state["dict"] != now.module_state["dict"]:
        problems.append("the module's attributes changed")
    if before.module_state["hooks"] != now.module_state["hooks"]:
        problems.append("the module's hooks changed")
    for name, value in before.module_state["buffers"].items():
        if not torch.equal(value, now.module_state["buffers"][name]):
            problems.append(f"buffer {name} changed")
    return problems


def is_interrupt(error: BaseException | None) -> bool:
    """An interrupt, or an exception raised because of one (torch wraps an interrupt
    raised in a Python callback of its C++ code into a RuntimeError)."""
    from yobx.torch.tracing.isolation.world_state import involves_interrupt

    return involves_interrupt(error)
