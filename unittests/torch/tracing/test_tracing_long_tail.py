"""The long tail of real Python that torch.export takes: each mechanism of issue 29 on
a small model written from its description, compared with eager at other sizes."""

import math

import numpy as np
import pytest
import torch
from torch.export import Dim

from yobx.torch.tracing import CustomTracer
from yobx.torch.tracing.constraints.constraints import ConstraintViolationError
from yobx.torch.tracing.errors import SpecializationError

from ._helpers import assert_same, check_trace, trace_module


class OptionalThroughModule(torch.nn.Module):
    """An optional input passed through a leaf module before ``is not None``."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.Identity()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, mask=None):
        mask = self.norm(mask)
        if mask is not None:
            x = x * mask
        return self.linear(x)


def test_a_leaf_module_called_on_none_returns_none():
    model = OptionalThroughModule()
    tracer, graph, _ = check_trace(
        model,
        {"x": torch.randn(2, 3, 4), "mask": None},
        {"x": {0: "b", 1: "s"}, "mask": None},
        other_inputs=[{"x": torch.randn(3, 5, 4), "mask": None}],
    )
    assert not any(n.op == "call_module" and n.target == "norm" for n in graph.nodes)
    # with a tensor, the leaf stays a module call
    _, graph, _ = check_trace(
        model,
        {"x": torch.randn(2, 3, 4), "mask": torch.rand(2, 3, 4)},
        {"x": {0: "b", 1: "s"}, "mask": {0: "b", 1: "s"}},
        other_inputs=[{"x": torch.randn(3, 5, 4), "mask": torch.rand(3, 5, 4)}],
    )
    assert any(n.op == "call_module" and n.target == "norm" for n in graph.nodes)


class CachedLength(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cached_len = None
        self.names = "abc"

    def forward(self, x):
        seq_len = x.shape[1]
        if seq_len == self.cached_len or seq_len == self.names or seq_len == [seq_len]:
            return x * 2
        if seq_len != self.cached_len:
            return x + 1
        return x


def test_a_dimension_compared_with_none_is_not_equal():
    check_trace(
        CachedLength(),
        {"x": torch.randn(2, 3)},
        {"x": {0: "b", 1: "s"}},
        other_inputs=[{"x": torch.randn(3, 5)}],
    )


class KeywordForms(torch.nn.Module):
    def forward(self, x):
        y = x.reshape(shape=(x.shape[0], -1))
        z = torch.reshape(input=y, shape=(y.shape[0], -1))
        w = y.view(size=(y.shape[0], y.shape[1]))
        e = y.unsqueeze(1).expand(y.shape[0], 3, y.shape[1]).sum(1)
        return z + w + e


class RealTensorSizes(torch.nn.Module):
    """Methods of constant tensors taking a traced size one by one."""

    def forward(self, x):
        table = torch.tensor([1.0, 2.0, 3.0, 4.0])
        a = table.expand(x.shape[0], 4)
        b = table.unsqueeze(0).expand(x.shape[0], -1)
        c = table.new_zeros(x.shape[0], 4) + table.new_ones(x.shape[0], 4)
        d = table.new_empty(x.shape[0], 4).fill_(1.0)
        return x + a + b + c + d


class SplitByTracedSize(torch.nn.Module):
    """``Tensor.split`` is Python code: a traced size reached ``split_with_sizes``."""

    def forward(self, x):
        return x + torch.arange(40.0).split(x.shape[0] * 4)[0].view(x.shape[0], 4)


class NamedTupleFields(torch.nn.Module):
    """Fields of the named tuples torch returns (``values``, ``indices``), measured with
    ``len`` and used as tensors (``len`` of the field failed as an attribute's)."""

    def forward(self, x):
        top = x.topk(min(x.shape[-1], 3), -1).values
        n = len(top)
        index = x.max(dim=-1).indices
        ordered = torch.sort(x, dim=0, descending=True).values
        return top.reshape(n, -1) / n, index * len(index), ordered[: len(ordered) // 2]


@pytest.mark.parametrize(
    "model, shape",
    [
        (KeywordForms(), (2, 3, 4)),
        (RealTensorSizes(), (2, 4)),
        (SplitByTracedSize(), (2, 4)),
        (NamedTupleFields(), (4, 3, 5)),
    ],
    ids=["keywords", "real-tensor-sizes", "split", "named-tuple-fields"],
)
def test_method_forms_eager_takes(model, shape):
    other = torch.randn(5, *shape[1:])
    check_trace(model, {"x": torch.randn(*shape)}, {"x": {0: "b"}}, [{"x": other}])


class ComplexRotary(torch.nn.Module):
    """Rotary embeddings in complex form (``torch.polar``)."""

    def forward(self, x):
        t = torch.arange(x.shape[1], dtype=torch.float32)
        freqs = torch.outer(t, torch.ones(x.shape[-1] // 2))
        cis = torch.polar(torch.ones_like(freqs), freqs)
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * cis).flatten(2)


class TriangularSolve(torch.nn.Module):
    """Gated linear attention solves a triangular system per chunk."""

    def forward(self, a, b):
        system = torch.tril(a) + torch.eye(a.shape[-1]) * 3
        return torch.linalg.solve_triangular(system, b, upper=False)


def test_operators_whose_kernels_fix_sizes_keep_them_symbolic():
    tracer, _, _ = check_trace(
        ComplexRotary(),
        {"x": torch.randn(2, 3, 4)},
        {"x": {0: "b", 1: "s"}},
        other_inputs=[{"x": torch.randn(3, 7, 4)}],
    )
    assert tracer.constraints == [] and tracer.versions == []
    tracer, _, _ = check_trace(
        TriangularSolve(),
        {"a": torch.randn(2, 3, 3), "b": torch.randn(2, 3, 4)},
        {"a": {0: "b", 1: "n", 2: "n"}, "b": {0: "b", 1: "n"}},
        other_inputs=[{"a": torch.randn(3, 5, 5), "b": torch.randn(3, 5, 4)}],
    )
    assert tracer.constraints == [] and tracer.versions == []


class NumpyConstants(torch.nn.Module):
    def forward(self, x):
        return x * np.float32(2.0) + np.sqrt(2.0) + np.ones(3, dtype=np.float32) + np.int64(3)


def test_numpy_constants_become_python_numbers_and_tensors():
    _, _, gm = check_trace(
        NumpyConstants(),
        {"x": torch.randn(2, 3)},
        {"x": {0: "b"}},
        other_inputs=[{"x": torch.randn(5, 3)}],
    )
    assert "np." not in gm.code and "numpy" not in gm.code
    # the graph module runs and reloads as code that names no numpy
    assert_same(NumpyConstants()(torch.ones(4, 3)), gm(torch.ones(4, 3)))


class HalfWrite(torch.nn.Module):
    def forward(self, x):
        v = x.clone()
        v[: v.shape[0] // 2] = x[: v.shape[0] // 2] * 2
        return v


def test_a_write_whose_slice_is_one_row_at_some_sizes():
    """``v[:n//2] = ...`` traced at n=5: exact at n=2 and 3, where the slice has one
    row (the functional form squeezed it before)."""
    check_trace(
        HalfWrite(),
        {"x": torch.randn(5, 3)},
        {"x": {0: "b"}},
        other_inputs=[{"x": torch.randn(n, 3)} for n in (2, 3, 8)],
    )


class DecodeStep(torch.nn.Module):
    def forward(self, x, past):
        total = torch.cat([past, x], 1)
        if x.shape[1] == 1:
            return total.sum(1) * 3
        mask = torch.ones(x.shape[1], total.shape[1]).tril(total.shape[1] - x.shape[1])
        return (total.sum(1, keepdim=True) * mask.sum()).sum(1)


def test_a_one_token_example_covers_every_sequence_length():
    """A decode step exported from one new token: ``seq`` takes 1 and more, the branch
    on ``seq == 1`` gets both sides; a named Dim without min= still refuses 1."""
    model = DecodeStep()
    example = {"x": torch.randn(2, 1, 4), "past": torch.randn(2, 5, 4)}
    dynamic = {"x": {0: "b", 1: "seq"}, "past": {0: "b", 1: "past"}}
    tracer, _, gm = trace_module(model, example, dynamic)
    assert sorted(v.when for v in tracer.versions) == ["(seq != 1)", "(seq == 1)"]
    assert tracer.range_constraints["seq"][0] == 1
    for seq, past in [(1, 7), (4, 7), (1, 2), (3, 2)]:
        x, p = torch.randn(3, seq, 4), torch.randn(3, past, 4)
        assert_same(model(x, p), gm(x, p))
    with pytest.raises(ValueError, match="outside its range"):
        trace_module(model, example, {"x": {0: "b", 1: Dim("seq")}, "past": {0: "b", 1: "past"}})
    # the tracer does not keep the range of a trace for the next one
    tracer = CustomTracer()
    tracer.trace(model, example, dynamic_shapes=dynamic)
    tracer.trace(
        model, {"x": torch.randn(2, 3, 4), "past": example["past"]}, dynamic_shapes=dynamic
    )
    assert tracer.range_constraints["seq"][0] == 2


class SquareGrid(torch.nn.Module):
    """A patch grid's side from the token count, ``int(n ** 0.5)`` (DiT)."""

    def forward(self, x):
        side = int(x.shape[1] ** 0.5)
        return x.reshape(x.shape[0], side, side, x.shape[2]).permute(0, 3, 1, 2)


def test_a_size_from_a_square_root_is_checked_at_run_time():
    # the reshape needs side * side == n, a check with a float power of a size (it
    # used to raise "no runtime check for FloatPow")
    _, _, gm = check_trace(
        SquareGrid(),
        {"x": torch.randn(2, 16, 3)},
        {"x": {0: "b", 1: "n"}},
        other_inputs=[{"x": torch.randn(3, 25, 3)}, {"x": torch.randn(1, 36, 3)}],
    )
    with pytest.raises(Exception, match="n=20"):
        gm(torch.randn(3, 20, 3))


class ArangeToAFloat(torch.nn.Module):
    """``torch.arange`` to a symbolic float (half steps over a length)."""

    def forward(self, x):
        return x[0, :1] * torch.arange(0, x.shape[1] * 0.5, 0.5)


def test_arange_to_a_symbolic_float():
    # torch's argument parser takes a SymFloat only through the Python dispatcher, as
    # torch.export runs it (an internal assertion failed before)
    check_trace(
        ArangeToAFloat(),
        {"x": torch.randn(2, 6)},
        {"x": {1: "n"}},
        other_inputs=[{"x": torch.randn(2, 9)}, {"x": torch.randn(2, 2)}],
    )


class PositionGrid(torch.nn.Module):
    """Position grids of video transformers: ``linspace`` from sizes, its largest value
    read back as a number, a centred grid from a half size."""

    def forward(self, x):
        h, w = x.shape[1], x.shape[2]
        rows = torch.linspace(0, h, h + 1, dtype=torch.float32)[:h]
        columns = torch.linspace(-w / 2, w / 2, w)
        text = torch.arange(3) + rows.max().item() + 1
        return x + rows[:, None] + columns + text.sum()


def test_linspace_between_sizes_keeps_them_symbolic():
    # the kernel takes start and end as plain numbers: `h == 4` was adopted (refused
    # for a dimension declared dynamic); torch.export specializes as well
    tracer, _, _ = check_trace(
        PositionGrid(),
        {"x": torch.randn(2, 4, 6)},
        {"x": {0: "b", 1: "h", 2: "w"}},
        other_inputs=[{"x": torch.randn(3, 7, 5)}, {"x": torch.randn(1, 1, 2)}],
    )
    assert tracer.constraints == [] and tracer.versions == []


class NumpyOfSizes(torch.nn.Module):
    """numpy's functions on numbers computed from sizes (Cosmos' position norm:
    ``np.sqrt(norm.numel() / emb.numel())``), and math.exp, which has no symbolic form."""

    def forward(self, x):
        emb = x.flatten(1, 2)
        norm = torch.linalg.vector_norm(emb, dim=-1, keepdim=True, dtype=torch.float32)
        norm = torch.add(1e-6, norm, alpha=np.sqrt(norm.numel() / emb.numel()))
        scale = np.floor(x.shape[2] / 3) + np.maximum(x.shape[1], 2) + np.cos(x.shape[0])
        return emb / norm * scale + math.exp(x.shape[3] / 10)


def test_numpy_functions_of_sizes_stay_symbolic():
    tracer, _, _ = check_trace(
        NumpyOfSizes(),
        {"x": torch.randn(2, 3, 4, 5)},
        {"x": {0: "b", 1: "h", 2: "w"}},
        other_inputs=[{"x": torch.randn(3, 5, 7, 5)}, {"x": torch.randn(1, 1, 2, 5)}],
    )
    assert tracer.constraints == [] and tracer.versions == []


def test_math_exp_of_a_size_is_a_decision_on_its_value():
    # torch has no symbolic exp: the value is the example's, each value a version
    # (torch.export refuses: "Constraints violated"); torch.fx's wrapper crashed on it
    # beyond the versions' budget, the graph checks the value it assumes
    from yobx.torch.tracing.constraints.constraints import ConstraintViolationError

    model = NumpyOfSizes()
    tracer, _, gm = trace_module(model, {"x": torch.randn(2, 3, 4, 5)}, {"x": {3: "d"}})
    assert tracer.versions
    exact = 0
    for d in range(1, 13):
        x = torch.randn(2, 3, 4, d)
        try:
            got = gm(x)
        except ConstraintViolationError as e:
            assert "IntTrueDiv(d, 10)" in str(e)
            continue
        assert_same(model(x), got)
        exact += 1
    assert exact > len(tracer.versions) // 2, exact


class RepeatedLists(torch.nn.Module):
    """Lists as long as the batch: ``torch.tensor([0] * batch_size)`` fed to an
    embedding (Chroma's guidance), a list of rows repeated, ``len`` of one, a traced
    tensor repeated in a list given to ``torch.cat`` and ``torch.stack``."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(4, 3)

    def forward(self, x):
        batch = x.shape[0]
        guidance = self.embedding(torch.tensor([0] * batch))
        rows = torch.tensor(batch * [[1.0, 2.0, 3.0]], dtype=torch.float32)
        summed = x + guidance + rows + len([0] * batch)
        return summed, torch.cat([x] * batch, dim=1), torch.stack(batch * [x[0]], dim=-1)


def test_a_list_repeated_by_a_size_stays_symbolic():
    tracer, _, _ = check_trace(
        RepeatedLists(),
        {"x": torch.randn(2, 3)},
        {"x": {0: "batch"}},
        other_inputs=[{"x": torch.randn(5, 3)}, {"x": torch.randn(1, 3)}],
    )
    assert tracer.constraints == [] and tracer.versions == []


class RepeatedListsIndexedAndCompared(torch.nn.Module):
    """An item of a list repeated by a size taken by a constant index, and the list
    compared with one written out: ``[0] * n == [0, 0]`` is ``n == 2``."""

    def forward(self, x):
        scales = [2.0, 3.0] * x.shape[0]
        flags = [0] * x.shape[0]
        y = x * scales[0] + scales[-1]
        if flags == [0, 0]:
            y = y * 10
        if flags != [0]:
            y = y - 1
        return y + (flags == [1, 1]) + (flags == (0, 0))


def test_a_list_repeated_by_a_size_indexed_and_compared_stays_symbolic():
    model = RepeatedListsIndexedAndCompared()
    sizes = (3, 1, 2, 5)
    tracer, _, gm = check_trace(
        model,
        {"x": torch.randn(3, 4)},
        {"x": {0: "n"}},
        other_inputs=[{"x": torch.randn(n, 4)} for n in sizes],
    )
    # eager raises an IndexError at n == 0: the capture checks that the item exists
    assert [c.expression for c in tracer.constraints] == ["n >= 1"], tracer.constraints
    with pytest.raises(ConstraintViolationError, match="n >= 1"):
        gm(torch.randn(0, 4))


class RepeatedListsUsedAsLists(torch.nn.Module):
    """``sum([1.0] * n)`` (a loop in C over constants) and a list written into: the
    list is made for real, its length the example's."""

    def forward(self, x):
        values = [1.0] * x.shape[0]
        values.append(3.0)
        return x.sum() + sum(values)


def test_a_list_repeated_by_a_size_used_as_a_list_fixes_its_length():
    # its steps give constants: looping over it would add the example's count of them
    # without recording anything, silently wrong at other sizes
    with pytest.raises(SpecializationError, match="test_tracing_long_tail.py"):
        trace_module(RepeatedListsUsedAsLists(), {"x": torch.randn(3, 4)}, {"x": {0: "b"}})
    tracer, _, gm = trace_module(
        RepeatedListsUsedAsLists(), {"x": torch.randn(3, 4)}, {"x": {0: Dim.AUTO}}
    )
    assert [c.expression for c in tracer.constraints] == ["x_dim_0 == 3"]
    x = torch.randn(3, 4)
    assert_same(RepeatedListsUsedAsLists()(x), gm(x))


class AsTensorWithDevice(torch.nn.Module):
    """``torch.as_tensor(indices, device=indices.device)`` (TAPAS's index maps)."""

    def forward(self, x):
        indices = torch.as_tensor(x.long(), device=x.device)
        sizes = torch.as_tensor([x.shape[0], x.shape[1]], dtype=torch.float32)
        return x * 2 + indices + sizes.sum()


def test_as_tensor_with_a_device():
    # torch.as_tensor takes no requires_grad: the symbolic variant passed one
    check_trace(
        AsTensorWithDevice(),
        {"x": torch.randn(2, 6)},
        {"x": {0: "b", 1: "n"}},
        other_inputs=[{"x": torch.randn(3, 9)}],
    )


class FourierMixing(torch.nn.Module):
    """FNet's token mixing: the real part of a 2-d FFT over sequence and hidden."""

    def forward(self, x):
        return torch.fft.fftn(x, dim=(1, 2)).real


def test_fft_keeps_its_dimensions_dynamic():
    # torch's C++ meta kernel of the FFTs fixed batch and seq to the example's; the
    # Python one (torch.export's) keeps them
    tracer, _, _ = check_trace(
        FourierMixing(),
        {"x": torch.randn(2, 7, 8)},
        {"x": {0: "batch", 1: "seq"}},
        other_inputs=[{"x": torch.randn(3, 5, 8)}],
    )
    assert tracer.constraints == []


class NormalizedByLastRow(torch.nn.Module):
    """A position embedding normalized by its last row (``y / y[:, -1:]``, as detection
    models write it): the slice's size is 1, or 0 when the rows are, which torch's
    size-oblivious broadcasting cannot tell from the rows' count."""

    def forward(self, x):
        rows = torch.ones(x.shape[0], 4 * (x.shape[1] // 8), 3)
        y = rows.cumsum(1)
        return y / (y[:, -1:, :] + 1e-6)


def test_broadcasting_a_slice_of_one_row_is_a_decision():
    others = [{"x": torch.randn(3, w)} for w in (16, 40, 8, 5)]
    tracer, _, _ = check_trace(
        NormalizedByLastRow(),
        {"x": torch.randn(2, 32)},
        {"x": {0: "batch", 1: "width"}},
        other_inputs=others,
    )
    assert len(tracer.versions) == 2  # rows > 0, and no rows at all (width < 8)


class ImagePlaceholders(torch.nn.Module):
    """A vision-language model writes each image's features over the embeddings of its
    image tokens, after checking that there are as many tokens as features, with a
    check helper that calls its condition when it is callable."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)

    def forward(self, ids, features):
        embeds = self.embed(ids)
        mask = ids == 9
        condition = mask.sum() * embeds.shape[-1] == features.numel()
        if callable(condition):
            condition = condition()
        torch._check_tensor_all_with(ValueError, condition, lambda: "tokens and features")
        mask = mask.unsqueeze(-1).expand_as(embeds)
        return embeds.masked_scatter(mask, features)


def _placeholders(batch, seq, per_image):
    ids = torch.randint(0, 9, (batch, seq))
    ids[:, 1 : 1 + per_image] = 9
    return {"ids": ids, "features": torch.randn(batch * per_image, 4)}


def test_masked_scatter_and_a_checked_condition_on_values():
    model = ImagePlaceholders()
    tracer, graph, gm = check_trace(
        model,
        _placeholders(2, 7, 3),
        {"ids": {0: "b", 1: "s"}, "features": {0: "n"}},
        other_inputs=[_placeholders(3, 11, 3), _placeholders(1, 5, 2)],
    )
    assert tracer.constraints == []
    # the check is in the graph: features that do not fit the tokens are refused
    wrong = _placeholders(2, 7, 3)
    wrong["features"] = torch.randn(5, 4)
    with pytest.raises(ValueError):
        model(**wrong)
    with pytest.raises(AssertionError, match="check"):
        gm(**wrong)


class SamePadding(torch.nn.Module):
    """A speech encoder's depthwise convolution padded "same" with an even kernel, on
    its input transposed (not contiguous) and through the functional form."""

    def __init__(self):
        super().__init__()
        self.depthwise = torch.nn.Conv1d(8, 8, 4, padding="same", groups=8)

    def forward(self, x):
        y = self.depthwise(x.transpose(1, 2)).transpose(1, 2)
        z = self.depthwise(x.transpose(1, 2).contiguous()).transpose(1, 2)
        w = torch.nn.functional.conv1d(
            x.transpose(1, 2), self.depthwise.weight, padding="same", groups=8
        )
        return x + y + z + w.transpose(1, 2)


def test_a_convolution_padded_same_keeps_its_length_symbolic():
    tracer, _, _ = check_trace(
        SamePadding(),
        {"x": torch.randn(2, 10, 8)},
        {"x": {0: "batch", 1: "t"}},
        other_inputs=[{"x": torch.randn(3, 7, 8)}, {"x": torch.randn(1, 13, 8)}],
    )
    assert tracer.constraints == [] and tracer.versions == []


class NumbersOfTensors(torch.nn.Module):
    """``int()`` and ``float()`` of one-element tensors (a count of image tokens, a
    scale read from the data), as ``.item()`` is in eager and torch.export."""

    def forward(self, x):
        positives = int((x > 0).sum())
        scale = float(x.abs().amax())
        truncated = int(x[0, 0] * 10)
        torch._check(positives <= x.shape[0] * x.shape[1])
        return x * positives + scale - truncated


def test_int_and_float_of_a_one_element_tensor_read_its_value():
    # before, int(tensor proxy) raised "int() argument must be ... not 'CustomProxy'"
    model = NumbersOfTensors()
    tracer, graph, gm = trace_module(model, {"x": torch.randn(3, 4)}, {"x": {0: "b", 1: "n"}})
    assert any(n.op == "call_method" and n.target == "item" for n in graph.nodes)
    for shape in ((3, 4), (1, 7), (5, 2)):
        x = torch.randn(*shape)
        assert_same(model(x), gm(x))


class SlicesOfAnInterpolation(torch.nn.Module):
    """Slices of a length torch leaves unbacked (``interpolate(scale_factor=2)``) and
    by a dimension declared without a minimum (fuzz_tracing seed 12508)."""

    def forward(self, y):
        t1 = torch.nn.functional.conv1d(y, torch.ones(2, y.shape[1], 3) / 3, padding=0)
        t2 = torch.nn.functional.interpolate(t1, scale_factor=2, mode="linear")
        t3 = t2[..., -(t2.shape[2] // 2) :]
        return t3[..., : y.shape[0]]


def test_a_slice_of_an_unbacked_length_is_traced():
    # the check of the slices' lengths at size 0 asked the example's value of the
    # unbacked length (KeyError: u0, a crash): it is not proved there, and taken as
    # needing the size not to be 0
    model = SlicesOfAnInterpolation()
    dims = {"y": {0: "length", 2: "length"}}
    _, _, gm = trace_module(model, {"y": torch.randn(4, 3, 4)}, dims)
    for length in (4, 8, 14):
        y = torch.randn(length, 3, length)
        assert_same(model(y), gm(y))
