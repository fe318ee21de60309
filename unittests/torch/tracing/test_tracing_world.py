"""Behaviour 8: tracing leaves the user's world as it was, also after an error."""

import builtins

import pytest
import torch
from torch.fx.proxy import TraceError

from yobx.torch.tracing import replace_problematic_function_before_tracing
from yobx.torch.tracing.core.tracer import CONSTANT_PREFIX

from ._helpers import trace_module

PATCHED = [
    (torch, "cat"),
    (torch, "stack"),
    (torch, "zeros"),
    (torch, "full"),
    (torch, "arange"),
    (torch, "cond"),
    (torch, "vmap"),
    (torch.func, "vmap"),
    (torch, "_check"),
    (torch, "max_pool1d"),
    (torch.Tensor, "__getitem__"),
    (torch, "baddbmm"),
    (torch.Tensor, "baddbmm"),
    (torch.ops.higher_order, "scan"),
    (builtins, "max"),
    (builtins, "min"),
    (builtins, "isinstance"),
    (torch.nn.Module, "__call__"),
    (torch.nn.Module, "__getattr__"),
    (torch.nn.Module, "__setattr__"),
]


def _snapshot():
    return [getattr(owner, name) for owner, name in PATCHED]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("running", torch.zeros(4))
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        self.running.add_(1)
        y = self.bn(self.lin(x)) + torch.zeros(x.shape[0], 4) + self.running
        return torch.cat([y, torch.ones(1, 4)])


class Failing(torch.nn.Module):
    def forward(self, x):
        y = torch.cat([x, torch.ones(1, 3)])
        if y.shape[0] > 10:
            return y
        return -y


def test_patches_are_restored_after_success_and_failure():
    before = _snapshot()
    with replace_problematic_function_before_tracing():
        assert torch.cat is not before[0]
    assert _snapshot() == before
    trace_module(Model().train(), {"x": torch.randn(3, 4)}, {"x": {0: "batch"}})
    assert _snapshot() == before
    with pytest.raises(TraceError):
        trace_module(Failing(), {"x": torch.randn(3, 3)}, {"x": {0: torch.export.Dim("batch")}})
    assert _snapshot() == before
    with pytest.raises(RuntimeError), replace_problematic_function_before_tracing():
        raise RuntimeError("boom")
    assert _snapshot() == before
    assert isinstance(torch.randn(2), torch.Tensor)
    assert not torch.fx.experimental._config.backed_size_oblivious


def test_module_not_mutated_by_tracing():
    model = Model().train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attributes = set(vars(model))
    modules = dict(model.named_modules())
    tracer, graph, gm = trace_module(
        model, {"x": torch.randn(3, 4)}, {"x": {0: "batch"}}, remove_inplace=False
    )
    assert set(vars(model)) == attributes
    assert dict(model.named_modules()) == modules
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, state[k], msg=k)
    # the constants live on the traced model, not on the user's module
    assert tracer.traced_model is not model
    assert not any(k.startswith(CONSTANT_PREFIX) for k in vars(model)["_buffers"])
    assert any(k.startswith(CONSTANT_PREFIX) for k in dict(tracer.traced_model.named_buffers()))
    # the traced graph reproduces the training-mode module, buffers included
    reference = Model().train()
    reference.load_state_dict(state)
    x = torch.randn(5, 4)
    torch.testing.assert_close(gm(x), reference(x))
    torch.testing.assert_close(model.running, reference.running)


def test_tracing_a_plain_model_does_not_import_transformers():
    """Importing transformers takes seconds: only models that use it pay for it."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from yobx.torch.tracing import CustomTracer\n"
        "CustomTracer().trace(torch.nn.Linear(3, 2), concrete_args={'input': torch.rand(2, 3)},"
        " dynamic_shapes={'input': {0: 'batch'}})\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_device_context_still_applies_after_a_trace_creating_tensors_on_a_device():
    # torch.device(...) as a context decides once per process which functions create
    # tensors; decided inside a trace, it held the patched factories and every later
    # `with torch.device("meta")` silently created CPU tensors (issue 13).
    from torch.utils import _device

    class Model(torch.nn.Module):
        def forward(self, x):
            with torch.device("cpu"):
                return x + torch.arange(x.shape[0]).float()

    _device._device_constructors.cache_clear()
    x = torch.randn(5)
    _, _, gm = trace_module(Model(), {"x": x}, dynamic_shapes={"x": {0: "n"}})
    torch.testing.assert_close(gm(torch.ones(3)), torch.ones(3) + torch.arange(3).float())
    with torch.device("meta"):
        created = [torch.arange(4), torch.ones(2), torch.zeros(2), torch.full((2,), 1.0)]
        linear = torch.nn.Linear(2, 2)
    assert [t.device.type for t in created] == ["meta"] * 4
    assert linear.weight.device.type == "meta"


class Concatenating(torch.nn.Module):
    def forward(self, x):
        return torch.cat([x, torch.ones(1, x.shape[1])]) * 2


def test_a_function_patched_by_the_user_between_traces_is_wrapped_and_restored():
    # the replacements are built once and reused: one the user installed since the last
    # trace must be the one the next trace wraps, and the one left after it
    model = Concatenating()
    inputs = {"x": torch.randn(3, 4)}
    trace_module(model, inputs, {"x": {0: "batch"}})
    original = torch.cat
    calls = []

    def users_cat(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    torch.cat = users_cat
    try:
        _, graph, gm = trace_module(model, inputs, {"x": {0: "batch"}})
        assert torch.cat is users_cat
        targets = [n.target for n in graph.nodes if n.op == "call_function"]
        assert users_cat in targets, targets
        calls.clear()
        x = torch.randn(5, 4)
        torch.testing.assert_close(gm(x), model(x))
        assert calls, "eager and the graph call the user's torch.cat"
    finally:
        torch.cat = original
    before = _snapshot()
    _, graph, gm = trace_module(model, inputs, {"x": {0: "batch"}})
    assert _snapshot() == before
    assert original in [n.target for n in graph.nodes if n.op == "call_function"]


def _sequence_check(value) -> bool:
    import ctypes

    check = ctypes.pythonapi.PySequence_Check
    check.argtypes = [ctypes.py_object]
    return bool(check(value))


class _Indexed(torch.nn.Module):
    def forward(self, x):
        return x[:, : x.shape[1] // 2] * 2


def test_c_slots_of_tensors_are_restored_after_a_trace():
    # the tracer sets Tensor.__getitem__ and __setitem__ while a trace runs; deleting
    # them afterwards restored the class's dict but left a sequence slot behind, so
    # that eager code anywhere in the process saw every tensor as a list:
    # torch.tensor([t1, t2]) of 0-d tensors raised "len() of a 0-d tensor"
    before = [_sequence_check(torch.tensor(1)), _sequence_check(torch.nn.Parameter(torch.ones(1)))]
    trace_module(_Indexed(), {"x": torch.randn(2, 6)}, {"x": {0: "b", 1: "n"}})
    with pytest.raises(TraceError):
        trace_module(Failing(), {"x": torch.randn(3, 3)}, {"x": {0: torch.export.Dim("batch")}})
    after = [_sequence_check(torch.tensor(1)), _sequence_check(torch.nn.Parameter(torch.ones(1)))]
    assert after == before
    assert torch.tensor([torch.tensor(1), torch.tensor(2)]).tolist() == [1, 2]
    values = [torch.tensor(3) * 2, torch.tensor(4) - 1]
    assert torch.tensor(values).tolist() == [6, 3]
