"""The contract between the tracer and its mixins (``core/tracer_contract.py``): every
member it declares exists on the tracers, and the mixins cost nothing at run time."""

from __future__ import annotations

import inspect

import pytest
import torch

from yobx.torch.tracing import CustomTracer, RobustTracer, TracingError
from yobx.torch.tracing.core.decisions import DecisionsMixin
from yobx.torch.tracing.core.fake_execution import FakeExecutionMixin
from yobx.torch.tracing.core.graph_finish import GraphFinishMixin
from yobx.torch.tracing.core.loop_tracing import LoopsMixin
from yobx.torch.tracing.core.trace_results import TraceResultsMixin
from yobx.torch.tracing.core.traced_attributes import AttributesMixin
from yobx.torch.tracing.core.tracer_contract import MixinBase, TracerContract

MIXINS = (
    DecisionsMixin,
    FakeExecutionMixin,
    GraphFinishMixin,
    LoopsMixin,
    AttributesMixin,
    TraceResultsMixin,
)


def _declared_members() -> list[str]:
    names = set(TracerContract.__annotations__)
    names.update(
        name
        for name, value in vars(TracerContract).items()
        if not name.startswith("__") and (callable(value) or isinstance(value, property))
    )
    return sorted(names)


def test_the_contract_declares_what_the_mixins_read():
    names = _declared_members()
    for expected in ("state", "dims", "refinements", "location", "decide", "loop_symbols"):
        assert expected in names


@pytest.mark.parametrize("cls", [CustomTracer, RobustTracer])
def test_every_member_of_the_contract_exists_on_a_tracer(cls):
    tracer = cls()
    missing = [name for name in _declared_members() if not hasattr(tracer, name)]
    assert not missing, f"{cls.__name__} lacks members of TracerContract: {missing}"
    # the methods take what the contract says they take
    for name in _declared_members():
        declared = vars(TracerContract).get(name)
        if inspect.isfunction(declared):
            ours = inspect.signature(getattr(cls, name))
            assert list(ours.parameters) == list(inspect.signature(declared).parameters), name


def test_the_mixins_derive_from_object_at_run_time():
    assert MixinBase is object
    for mixin in MIXINS:
        assert mixin.__mro__[1:] == (object,), mixin


def test_the_trace_dims_outside_a_trace_is_an_error_naming_what_to_do():
    tracer = CustomTracer()
    assert tracer.dims is None
    with pytest.raises(TracingError, match="pass examples to trace"):
        tracer.trace_dims()
    with pytest.raises(TracingError, match="pass examples to trace"):
        tracer.trace_refinements()
    # a trace with examples sets both
    tracer.trace(torch.nn.Linear(3, 2), concrete_args={"input": torch.randn(4, 3)})
    assert tracer.trace_dims() is tracer.dims and tracer.trace_refinements() is tracer.refinements
