"""A KeyboardInterrupt anywhere in a trace leaves nothing behind (issue 11, item 7).

An interrupt landing in torch's ``FakeTensorMode.__exit__`` used to leave the fake mode
installed (every eager op then returned a FakeTensor); landing elsewhere it left
patches, torch.fx's patcher, or the user's module changed. The sweep interrupts the
trace at a few dozen Python calls, spread over the trace and over the exits; a longer
sweep is ``_scripts/sweep_interrupts.py``.
"""

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from . import interrupt_sweep


@pytest.fixture(scope="module")
def calls():
    """The code object of every Python call made by one trace."""
    model, inputs, dynamic_shapes = interrupt_sweep.example()
    interrupt_sweep.trace(model, inputs, dynamic_shapes)  # warm-up: imports, caches
    recorder = interrupt_sweep.Interrupter(record=True)
    error = interrupt_sweep.run_interrupted(
        lambda: interrupt_sweep.trace(model, inputs, dynamic_shapes), recorder
    )
    assert error is None
    return recorder.codes


def _exit_points(codes, functions, per_function):
    points = []
    for function in functions:
        indices = [i + 1 for i, code in enumerate(codes) if code is function.__code__]
        assert indices, function
        step = max(1, len(indices) // per_function)
        points.extend(indices[::step][:per_function])
    return points


def _sweep(points):
    model, inputs, dynamic_shapes = interrupt_sweep.example()
    for at in points:
        before = interrupt_sweep.snapshot(model)
        interrupter = interrupt_sweep.Interrupter(at)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            error = interrupt_sweep.run_interrupted(
                lambda: interrupt_sweep.trace(model, inputs, dynamic_shapes), interrupter
            )
        where = f"interrupt at call {at} ({interrupter.where})"
        assert interrupt_sweep.leftovers(before, model) == [], where
        # the interrupt surfaces (possibly wrapped by torch's C++), or was swallowed by a
        # finalizer and the trace completed
        assert error is None or interrupt_sweep.is_interrupt(error), (where, error)
    # tracing still works and is right
    gm = interrupt_sweep.trace(model, inputs, dynamic_shapes)
    reference = interrupt_sweep.SweepModel()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(6, 4)
    torch.testing.assert_close(gm(x), reference(x))


def test_interrupts_spread_over_a_trace(calls):
    _sweep(interrupt_sweep.choose_points(calls, regular=12, exits=12))


def test_interrupts_in_fake_and_dispatch_mode_exits(calls):
    """Where the reported bug was: the fake mode stayed installed."""
    _sweep(_exit_points(calls, [FakeTensorMode.__exit__, TorchDispatchMode.__exit__], 4))


def test_an_interrupt_leaving_guards_suppressed_is_undone(monkeypatch):
    # torch's ShapeEnv.suppress_guards is a flag of the thread: an interrupt in its
    # exit left it on, and no later trace of the thread recorded a fact it adopted
    from torch.fx.experimental import symbolic_shapes

    from yobx.torch.tracing import CustomTracer

    original = symbolic_shapes.ShapeEnv._suppress_guards_exit
    calls = []

    def interrupted_exit(self):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return original(self)

    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    monkeypatch.setattr(symbolic_shapes.ShapeEnv, "_suppress_guards_exit", interrupted_exit)
    with pytest.raises(BaseException) as info:
        CustomTracer().trace(
            conv,
            concrete_args={"input": torch.randn(2, 3, 8, 8)},
            dynamic_shapes={"input": {0: "b"}},
        )
    assert interrupt_sweep.is_interrupt(info.value)
    monkeypatch.undo()
    assert not getattr(symbolic_shapes.TLS, "suppress_guards", False)

    class NeedsAFact(torch.nn.Module):
        def forward(self, x):
            return x.reshape(-1, 3)  # the dimension must be a multiple of 3

    tracer = CustomTracer()
    tracer.trace(NeedsAFact(), concrete_args={"x": torch.randn(6)}, dynamic_shapes={"x": {0: "n"}})
    assert [c.expression for c in tracer.constraints] != []


def test_an_interrupt_in_a_dispatch_guard_exit_is_undone(monkeypatch):
    # torch.inference_mode holds a C++ guard that, freed without its exit, puts back the
    # dispatch keys it found on entry: the middle of the trace. The restoration sets
    # them back, including keys Python has no name for (Tracer).
    from torch.autograd import grad_mode

    from yobx.torch.tracing import CustomTracer
    from yobx.torch.tracing.isolation.world_state import WorldState

    class InferenceBlock(torch.nn.Module):
        def forward(self, x):
            with torch.inference_mode(False):
                y = x * 2
            return y + 1

    original = grad_mode.inference_mode.__exit__

    def interrupted_exit(self, *args):
        raise KeyboardInterrupt

    before = WorldState.capture()
    monkeypatch.setattr(grad_mode.inference_mode, "__exit__", interrupted_exit)
    with pytest.raises(BaseException) as info:
        CustomTracer().trace(InferenceBlock(), concrete_args={"x": torch.randn(2, 3)})
    assert interrupt_sweep.is_interrupt(info.value)
    monkeypatch.setattr(grad_mode.inference_mode, "__exit__", original)
    del info
    assert WorldState.capture().with_process_state() == before.with_process_state()
    tracer = CustomTracer()
    graph = tracer.trace(InferenceBlock(), concrete_args={"x": torch.randn(2, 3)})
    x = torch.randn(2, 3)
    torch.testing.assert_close(torch.fx.GraphModule(tracer.traced_model, graph)(x), x * 2 + 1)


def test_dispatch_keys_without_a_python_name_are_restored():
    from yobx.torch.tracing.isolation.world_state import WorldState

    before = WorldState.capture()
    included = torch._C._dispatch_tls_local_include_set()
    # Tracer and the testing keys are not members of torch._C.DispatchKey
    unnamed = torch._C.DispatchKeySet.from_raw_repr(915919299338567680)
    leaked = torch._C._ForceDispatchKeyGuard(included, unnamed)
    leaked.__enter__()  # never exited: as after an interrupt
    assert torch._C._dispatch_tls_local_exclude_set().raw_repr() != before.excluded
    before.restore()
    assert WorldState.capture() == before


def test_an_interrupt_in_the_eager_run_of_a_version_is_undone(monkeypatch):
    # before capturing a version, the model runs eagerly at its sizes, its parameters
    # watched by a torch function mode; an interrupt in that mode's exit left it on the
    # stack, outside any trace's window (found by _scripts/sweep_interrupts.py, and by
    # CI's spread sweep at another call count)
    import inspect

    from yobx.torch.tracing.isolation import parameter_writes
    from yobx.torch.tracing.isolation.world_state import WorldState

    original = parameter_writes._FirstWrites.__exit__
    raised = []

    def interrupted_exit(self, *args):
        eager = any(f.function in ("run_eagerly", "_run_eagerly") for f in inspect.stack(0))
        if eager and not raised:
            raised.append(1)
            raise KeyboardInterrupt
        return original(self, *args)

    model, inputs, dynamic_shapes = interrupt_sweep.example()
    before = WorldState.capture()
    monkeypatch.setattr(parameter_writes._FirstWrites, "__exit__", interrupted_exit)
    with pytest.raises(BaseException) as info:
        interrupt_sweep.trace(model, inputs, dynamic_shapes)
    assert raised and interrupt_sweep.is_interrupt(info.value)
    monkeypatch.undo()
    del info
    assert WorldState.capture().with_process_state() == before.with_process_state()
