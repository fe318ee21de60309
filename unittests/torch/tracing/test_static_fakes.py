"""The directly made fake copies of parameters and buffers (``static_fakes``) against
torch's converter, and the tensors that must keep going through the converter."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from yobx.torch.tracing import CustomTracer
from yobx.torch.tracing.symbolic.static_fakes import StaticFakes


def _mode() -> FakeTensorMode:
    return FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)


def _describe(fake: torch.Tensor) -> tuple:
    return (
        type(fake),
        tuple(fake.shape),
        fake.stride(),
        fake.storage_offset(),
        fake.untyped_storage().nbytes(),
        fake.dtype,
        fake.device,
        fake.requires_grad,
        fake.is_leaf,
        getattr(fake, "_is_param", False),
    )


def test_plain_tensors_match_the_converter():
    tensors = [
        torch.nn.Parameter(torch.randn(4, 6)),
        torch.nn.Parameter(torch.randn(5), requires_grad=False),
        torch.randn(3, 2, dtype=torch.float16),
        torch.arange(7),
        torch.tensor(2.5),
        torch.nn.Parameter(torch.empty(8, 3, device="meta")),
        torch.zeros(0, 4),
    ]
    fakes = StaticFakes(_mode())
    fakes.index(tensors)
    reference = _mode()
    for tensor in tensors:
        fake = fakes.get(tensor)
        assert fake is not None, tensor
        expected = reference.from_tensor(tensor, static_shapes=True)
        if tensor.device.type == "meta":
            expected.fake_device = torch.device("cpu")
        assert _describe(fake) == _describe(expected)
        # torch's converter finds the same fake (a leaf module run by the fake mode)
        assert fakes.fake_mode.from_tensor(tensor, static_shapes=True) is fake
        assert fakes.get(tensor) is fake


def test_shared_or_unusual_storages_go_through_the_converter():
    base = torch.randn(6, 4)
    transposed = torch.nn.Parameter(torch.randn(4, 6).t())
    view = base[1:]
    alias = base.detach()
    tied = torch.nn.Parameter(torch.randn(3, 3))
    other = torch.randn(2, 2)
    fakes = StaticFakes(_mode())
    fakes.index([base, view, alias, transposed, tied, tied, other])
    for tensor in (base, view, alias, transposed):
        assert fakes.get(tensor) is None
    # the same object twice (tied weights) is still one tensor
    assert fakes.get(tied) is not None
    # a tensor that was not indexed is unknown
    assert fakes.get(torch.randn(2)) is None
    assert fakes.get(other) is not None


def test_tied_and_aliased_weights_trace_and_compute_as_eager():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight
            # a buffer sharing the weight's storage: writes through it are visible
            self.register_buffer("scale", torch.ones(4))
            self.register_buffer("scale_view", self.scale[:2])

        def forward(self, ids):
            self.scale_view.mul_(2)
            return self.head(self.embed(ids) * self.scale)

    model = Tied()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    tracer = CustomTracer()
    graph = tracer.trace(model, concrete_args={"ids": ids}, dynamic_shapes={"ids": {1: "seq"}})
    eager_model, traced_model = Tied(), Tied()
    traced_model.load_state_dict(eager_model.state_dict())
    gm = torch.fx.GraphModule(traced_model, graph)
    for other in (ids, torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]])):
        torch.testing.assert_close(gm(other), eager_model(other))
        torch.testing.assert_close(traced_model.scale, eager_model.scale)


def test_inference_tensors_gradients_and_earlier_conversions_stay_torchs():
    with torch.inference_mode():
        made_in_inference = torch.ones(3)
    with_grad = torch.nn.Parameter(torch.ones(2))
    with_grad.grad = torch.zeros(2)
    converted = torch.ones(4)
    fakes = StaticFakes(_mode())
    earlier = fakes.fake_mode.from_tensor(converted, static_shapes=True)
    fakes.index([made_in_inference, with_grad, converted])
    # the converter copies what a direct fake would miss
    assert fakes.get(made_in_inference) is None
    assert fakes.get(with_grad) is None
    # a tensor torch converted first keeps torch's fake
    assert fakes.get(converted) is earlier
