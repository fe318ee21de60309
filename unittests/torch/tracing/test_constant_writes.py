"""Tensors the model creates while it runs, then writes into with traced values
(yobx.torch.tracing.core.constant_writes): every call of the graph starts from the
created values, and the reads after a write see it."""

import pytest
import torch

from unittests.torch.onnx._helpers import export_and_validate

from ._helpers import trace_module


class Accumulates(torch.nn.Module):
    """A write into the created tensor, read with a traced value after."""

    def forward(self, x):
        total = torch.zeros(4)
        total.add_(x.sum(dim=0))
        return x + total


class ThroughAView(torch.nn.Module):
    """A write through a view, the base read after without a traced value."""

    def forward(self, x):
        total = torch.zeros(4)
        part = total[:2]
        part.add_(x.sum(dim=0)[:2])
        return total * 1


class ViewMadeBefore(torch.nn.Module):
    """A view made before the base is written, read after."""

    def forward(self, x):
        total = torch.zeros(4)
        middle = total[1:3]
        total.add_(x.sum(dim=0))
        return middle + 0


class EagerWriteAfterARead(torch.nn.Module):
    """An eager write (no traced value) into a tensor the graph already read."""

    def forward(self, x):
        t = torch.zeros(4)
        y = x + t
        t.add_(1)
        return y, x + t


class RowsAndColumns(torch.nn.Module):
    """Writes through a non-contiguous view, a row, a column, and `+=` on them."""

    def forward(self, x):
        acc = torch.zeros(3, 4)
        acc[:, :2] += x[:3, :2]
        acc[1] = x[0]
        acc[:, 3] = x[:3, 0]
        torch.Tensor.mul_(acc, 2.0)
        return acc * 2, acc.sum()


class ColumnsInsideRows(torch.nn.Module):
    """A 2-d view whose rows start inside the rows of its base."""

    def forward(self, x):
        acc = torch.zeros(4, 4)
        acc[:, 1:3] += x[:4, :2]
        return acc + 1


class TransposedBlock(torch.nn.Module):
    """A view whose strides grow (a transposed block): written through an
    ``as_strided`` view of the graph's copy, which the rewrite passes keep in place."""

    def forward(self, x):
        acc = torch.zeros(4, 4)
        block = acc.t()[:2, :2]
        block += x[:2, :2]
        return acc + 1


class AssignedFirst(torch.nn.Module):
    """The first write into the created tensor assigns traced values (fuzz_onnx seed
    7371): the node called the trace's gate of ``Tensor.__setitem__``, which the passes
    did not know, and the ONNX export refused the write."""

    def forward(self, x):
        acc = torch.zeros(4)
        acc[3] = x.mean()
        acc[:2] = x[0, :2]
        return x * acc.sum() + acc


MODELS = [
    Accumulates,
    ThroughAView,
    ViewMadeBefore,
    EagerWriteAfterARead,
    RowsAndColumns,
    ColumnsInsideRows,
    AssignedFirst,
    TransposedBlock,
]


def _same(a, b):
    a, b = (a,) if isinstance(a, torch.Tensor) else a, (b,) if isinstance(b, torch.Tensor) else b
    assert len(a) == len(b)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v)


@pytest.mark.parametrize("remove_inplace", [False, True])
@pytest.mark.parametrize("cls", MODELS, ids=lambda c: c.__name__)
def test_created_tensor_written_by_the_graph(cls, remove_inplace):
    # before: the graph wrote into a constant every call shares (the second call
    # started from the first one's values), and the reads after the write that had no
    # traced value ran eagerly on the values of before it (wrong at the first call)
    _, _, gm = trace_module(
        cls(), {"x": torch.randn(4, 4)}, {"x": {0: "n"}}, remove_inplace=remove_inplace
    )
    for n in (4, 6, 4, 5):
        x = torch.randn(n, 4)
        _same(gm(x), cls()(x))


@pytest.mark.parametrize("cls", MODELS[:-1], ids=lambda c: c.__name__)
def test_created_tensor_written_by_the_graph_in_onnx(cls):
    export_and_validate(cls(), (torch.randn(4, 4),), dynamic_shapes=({0: "n"},))


def test_a_write_through_an_as_strided_view_is_refused_by_the_onnx_export():
    # the graph module keeps that write in place (right); ONNX has no in-place writes
    from yobx.torch.onnx import to_onnx
    from yobx.torch.onnx.errors import OnnxExportError

    with pytest.raises(OnnxExportError, match="as_strided") as caught:
        to_onnx(TransposedBlock(), (torch.randn(4, 4),), dynamic_shapes=({0: "n"},))
    # the user's line, and what to do there (a clone would not write into the tensor)
    assert 'test_constant_writes.py", line 80' in str(caught.value)
    assert "index the tensor itself" in str(caught.value)
    assert ".clone()" not in str(caught.value)


def test_writes_into_a_view_of_a_buffer_stay_the_modules():
    """A real view of a buffer, written with a traced value, writes into the buffer
    (the module's state), not into a copy."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("state", torch.zeros(4))
            self.head = self.state[:2]

        def forward(self, x):
            self.head.add_(x.sum(dim=0)[:2])
            return x + self.state

    model, reference = Model(), Model()
    _, _, gm = trace_module(model, {"x": torch.randn(3, 4)}, {"x": {0: "n"}})
    for n in (3, 5):
        x = torch.randn(n, 4)
        _same(gm(x), reference(x))
        torch.testing.assert_close(model.state, reference.state)


def test_a_created_tensor_viewed_with_two_dtypes_is_refused():
    from yobx.torch.tracing import TracingError

    class Model(torch.nn.Module):
        def forward(self, x):
            t = torch.zeros(4)
            bits = t.view(torch.int32)
            t.add_(x.sum(dim=0))
            return x + t, bits + 1

    with pytest.raises(TracingError, match="two dtypes"):
        trace_module(Model(), {"x": torch.randn(3, 4)}, {"x": {0: "n"}})


TABLE = torch.zeros(4)


class WritesAGlobal(torch.nn.Module):
    """A tensor that lives before the call (a global): eager writes into that object at
    every call, and so does the graph."""

    def forward(self, x):
        TABLE.add_(x.sum(dim=0))
        return x + TABLE


@pytest.mark.parametrize("remove_inplace", [False, True])
def test_a_global_tensor_written_by_the_graph_is_the_one_eager_writes(remove_inplace):
    TABLE.zero_()
    _, _, gm = trace_module(
        WritesAGlobal(), {"x": torch.randn(3, 4)}, {"x": {0: "n"}}, remove_inplace=remove_inplace
    )
    # tracing recorded the write without running it
    torch.testing.assert_close(TABLE, torch.zeros(4))
    for n in (3, 5, 2):
        x = torch.randn(n, 4)
        before = TABLE.clone()
        got = gm(x)
        after = TABLE.clone()
        TABLE.copy_(before)
        _same(got, WritesAGlobal()(x))
        torch.testing.assert_close(TABLE, after)
