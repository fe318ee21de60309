"""A Ctrl-C during a trace is raised between two recorded operations, never inside
torch's own code, and the trace leaves nothing behind."""

from __future__ import annotations

import signal
import threading

import pytest
import torch

from yobx.torch.tracing import CustomTracer
from yobx.torch.tracing.isolation.world_state import WorldState


@pytest.fixture
def default_handler():
    """Python's own SIGINT handler (a test runner may have another one)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


class _Log:
    """What the forward reached (not a list attribute of the module: the trace puts
    those back as they were)."""

    def __init__(self):
        self.lines: list[str] = []

    def __eq__(self, other):
        return self.lines == other


class CtrlC(torch.nn.Module):
    """Receives ``presses`` Ctrl-C in its forward, at ``where``."""

    def __init__(self, presses: int = 1, where: str = "middle"):
        super().__init__()
        self.presses, self.where = presses, where
        self.reached = _Log()

    def forward(self, x):
        y = x + 1
        if self.where == "middle":
            for _ in range(self.presses):
                signal.raise_signal(signal.SIGINT)
            self.reached.lines.append("after the signal")
        y = y * 2
        self.reached.lines.append("after the next operation")
        if self.where == "end":
            signal.raise_signal(signal.SIGINT)
        return y


def _trace(model):
    return CustomTracer().trace(
        model, concrete_args={"x": torch.randn(2, 3)}, dynamic_shapes={"x": {0: "b"}}
    )


def test_ctrl_c_is_raised_at_the_next_operation(default_handler):
    before = WorldState.capture()
    model = CtrlC()
    with pytest.raises(KeyboardInterrupt):
        _trace(model)
    # the forward went on to its next operation, where the tracer raised
    assert model.reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert WorldState.capture() == before
    assert type(torch.ones(2) + 1) is torch.Tensor
    # and the next trace is right
    tracer = CustomTracer()
    graph = tracer.trace(
        CtrlC(presses=0), concrete_args={"x": torch.randn(2, 3)}, dynamic_shapes={"x": {0: "b"}}
    )
    x = torch.randn(5, 3)
    torch.testing.assert_close(torch.fx.GraphModule(tracer.traced_model, graph)(x), (x + 1) * 2)


def test_ctrl_c_after_the_last_operation_is_raised_once_restored(default_handler):
    before = WorldState.capture()
    model = CtrlC(where="end")
    with pytest.raises(KeyboardInterrupt):
        _trace(model)
    assert model.reached == ["after the next operation"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert WorldState.capture() == before


def test_a_second_ctrl_c_is_raised_at_once(default_handler):
    model = CtrlC(presses=2)
    with pytest.raises(KeyboardInterrupt):
        _trace(model)
    assert model.reached == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_of_the_users_own_is_left_alone():
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        model = CtrlC()
        _trace(model)
        assert received == [signal.SIGINT]
        assert model.reached == ["after the signal", "after the next operation"]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_trace_in_another_thread_leaves_the_handler_alone(default_handler):
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(signal.getsignal(signal.SIGINT))
            return x * 2

    thread = threading.Thread(target=lambda: _trace(Probe()))
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


def test_a_ctrl_c_noted_in_the_main_thread_stops_its_block_not_another_threads_trace(
    default_handler,
):
    from yobx.torch.tracing.isolation.deferred_interrupts import deferred_interrupts

    outcome = {}

    def worker():
        try:
            _trace(CtrlC(presses=0))
            outcome["worker"] = "traced"
        except BaseException as e:
            outcome["worker"] = repr(e)

    with pytest.raises(KeyboardInterrupt), deferred_interrupts():
        signal.raise_signal(signal.SIGINT)  # noted for this (the main) thread
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        outcome["main"] = "went on"
    assert outcome == {"worker": "traced", "main": "went on"}
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_left_by_a_block_cut_short_is_replaced(default_handler):
    from yobx.torch.tracing.isolation import deferred_interrupts as module

    # as after an interrupt between installing the handler and entering the block
    signal.signal(signal.SIGINT, module._note_interrupt)
    module.PENDING[0] = True
    tracer = CustomTracer()
    graph = tracer.trace(
        CtrlC(presses=0), concrete_args={"x": torch.randn(2, 3)}, dynamic_shapes={"x": {0: "b"}}
    )
    assert len(graph.nodes) > 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not module.PENDING[0]
