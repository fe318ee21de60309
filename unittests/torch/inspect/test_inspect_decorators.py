"""trace_func and trace_model_func: recorded during record_run only."""

import threading

import torch

from yobx.torch.inspect import record_run, recording, trace_func, trace_model_func

CALLS = []


@trace_func(stage_name="preprocess")
def normalize(x, eps=1e-5):
    CALLS.append("normalize")
    return (x - x.mean()) / (x.std() + eps)


@trace_func
def double(x):
    return x * 2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    @trace_model_func
    def gate(self, x):
        return torch.sigmoid(x)

    def forward(self, x):
        return self.gate(double(self.linear(x)))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(normalize(x))


def test_decorators_are_transparent_outside_recording():
    CALLS.clear()
    x = torch.randn(3, 4)
    assert recording._ACTIVE is None
    torch.testing.assert_close(normalize(x), (x - x.mean()) / (x.std() + 1e-5))
    assert CALLS == ["normalize"]
    assert normalize.__name__ == "normalize" and normalize.__wrapped__ is not None
    block = Block()
    torch.testing.assert_close(block.gate(x), torch.sigmoid(x))
    # Nothing was recorded anywhere and no recording started.
    assert recording._ACTIVE is None
    result = record_run(Model(), x, stages=["eager"])
    assert len(result.preprocess) == 1  # only the call made during the run


def test_decorated_calls_recorded_in_their_stage():
    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(3, 4)
    result = record_run(model, x, inputs=[(torch.randn(5, 4),)], stages=["eager"])
    assert result.keys() == ["eager", "preprocess"]
    pre = result.preprocess
    assert [c.name for c in pre] == ["normalize", "normalize"]
    assert [c.run for c in pre] == [0, 1]
    assert pre[0].params.keys() == ["x"]
    assert pre[0].retval.shape == (3, 4) and pre[1].retval.shape == (5, 4)
    torch.testing.assert_close(pre[0].retval.tensor, (x - x.mean()) / (x.std() + 1e-5))
    # stage_name=None: the stage being recorded, in call order with the leaf modules.
    names = [c.name for c in result.eager if c.run == 0]
    assert names == ["block.linear", "double", "block.gate"]
    gate = result.eager["block.gate"][0]
    assert gate.kind == "method" and gate.params.keys() == ["x"]
    assert gate.target == "Block.gate"
    assert result.eager["double"][0].duration_ns > 0


def test_method_of_module_outside_the_model_uses_class_name():
    other = Block()

    class Wrapper(torch.nn.Module):
        def forward(self, x):
            return other.gate(x)

    result = record_run(Wrapper(), torch.randn(2, 4), stages=["eager"])
    assert result.eager.keys() == ["Block.gate"]


def test_calls_from_other_threads_are_not_recorded():
    box = {}

    class Threaded(torch.nn.Module):
        def forward(self, x):
            thread = threading.Thread(target=lambda: box.setdefault("y", double(x)))
            thread.start()
            thread.join()
            return double(x)

    x = torch.randn(2)
    result = record_run(Threaded(), x, stages=["eager"])
    torch.testing.assert_close(box["y"], x * 2)
    assert len(result.eager) == 1
