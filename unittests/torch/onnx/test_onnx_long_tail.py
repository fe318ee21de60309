"""The long tail of issue 29 in ONNX: the models of the tracing tests export and
validate at other sizes, output classes registered without key paths name their
outputs, and symbolic numbers meeting tensors of a lower kind translate."""

import pytest
import torch

from unittests.torch.tracing.test_tracing_long_tail import (
    ArangeToAFloat,
    ComplexRotary,
    FourierMixing,
    HalfWrite,
    KeywordForms,
    NamedTupleFields,
    NumpyConstants,
    NumpyOfSizes,
    OptionalThroughModule,
    PositionGrid,
    RealTensorSizes,
    RepeatedLists,
    RepeatedListsIndexedAndCompared,
    SquareGrid,
)
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.validation import validate
from yobx.torch.passes import MUTATIONS_KEY

from ._helpers import export_and_validate


@pytest.mark.parametrize(
    "model, args, dynamic_shapes",
    [
        (OptionalThroughModule(), (torch.randn(2, 3, 4), None), ({0: "b", 1: "s"}, None)),
        (KeywordForms(), (torch.randn(2, 3, 4),), ({0: "b"},)),
        (RealTensorSizes(), (torch.randn(2, 4),), ({0: "b"},)),
        (NamedTupleFields(), (torch.randn(4, 3, 5),), ({0: "b", 2: "d"},)),
        (NumpyConstants(), (torch.randn(2, 3),), ({0: "b"},)),
        (HalfWrite(), (torch.randn(5, 3),), ({0: "b"},)),
        (NumpyOfSizes(), (torch.randn(2, 3, 4, 5),), ({0: "b", 1: "h", 2: "w"},)),
        (RepeatedLists(), (torch.randn(2, 3),), ({0: "b"},)),
        (RepeatedListsIndexedAndCompared(), (torch.randn(3, 4),), ({0: "n"},)),
    ],
    ids=[
        "identity-none",
        "keywords",
        "real-tensor-sizes",
        "named-tuple-fields",
        "numpy",
        "half-write",
        "numpy-sizes",
        "repeated-lists",
        "repeated-lists-indexed",
    ],
)
def test_long_tail_models_export_exact(model, args, dynamic_shapes):
    export_and_validate(model, args, dynamic_shapes=dynamic_shapes)


def test_complex_rotary_exports_exact():
    """torch.polar traces symbolically, and torch_lib lowers the complex arithmetic to
    real pairs: exact at other sequence lengths."""
    export_and_validate(
        ComplexRotary(), (torch.randn(2, 3, 4),), dynamic_shapes=({0: "b", 1: "s"},)
    )


class DiffusersLikeOutput(torch.nn.Module):
    def forward(self, x):
        from diffusers.models.modeling_outputs import Transformer2DModelOutput

        return Transformer2DModelOutput(sample=x * 2)


def test_outputs_of_classes_registered_without_key_paths_are_named():
    pytest.importorskip("diffusers")
    result = export_and_validate(
        DiffusersLikeOutput(), (torch.randn(2, 3),), dynamic_shapes=({0: "b"},)
    )
    assert [o.name for o in result.model_proto.graph.output] == ["sample"]


class MixedKinds(torch.nn.Module):
    def forward(self, x):
        positions = torch.arange(x.shape[1]) - x.shape[1] / 2
        mask = (x > 0) * (x.shape[1] - 1)
        return positions * x + mask


def test_symbolic_numbers_of_a_higher_kind_than_their_tensor():
    export_and_validate(MixedKinds(), (torch.randn(2, 3),), dynamic_shapes=({0: "b", 1: "s"},))


class Rolls(torch.nn.Module):
    """Window attention's cyclic shift by half the window, computed from the sizes."""

    def forward(self, x):
        shifted = torch.roll(x, shifts=(-(x.shape[0] // 2), x.shape[1] // 3), dims=(0, 1))
        return shifted + torch.roll(x, 3) + x.roll(2, -1)


def test_roll_by_shifts_computed_from_sizes():
    export_and_validate(Rolls(), (torch.randn(4, 6),), dynamic_shapes=({0: "a", 1: "b"},))


class AttentionWithoutWeights(torch.nn.Module):
    """``nn.MultiheadAttention`` returns ``(out, None)`` when not asked for weights."""

    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)


def test_a_none_output_has_no_onnx_output():
    # as torch.onnx exports it: the None is no output (it used to refuse the export)
    result = export_and_validate(
        AttentionWithoutWeights().eval(),
        (torch.randn(2, 5, 8),),
        dynamic_shapes=({0: "b", 1: "s"},),
    )
    assert [o.name for o in result.model_proto.graph.output] == ["output_0"]


def test_a_square_root_of_a_size_exports_with_its_check():
    export_and_validate(SquareGrid(), (torch.randn(2, 16, 3),), dynamic_shapes=({0: "b", 1: "n"},))


def test_arange_to_a_symbolic_float_exports():
    export_and_validate(ArangeToAFloat(), (torch.randn(2, 6),), dynamic_shapes=({1: "n"},))


def test_linspace_between_sizes_exports():
    export_and_validate(
        PositionGrid(), (torch.randn(2, 4, 6),), dynamic_shapes=({0: "b", 1: "h", 2: "w"},)
    )


class ComplexFrequencyGrid(torch.nn.Module):
    """Rotary frequencies of a video transformer in complex form: a complex buffer,
    expanded over a grid, concatenated, indexed by position and selected."""

    def __init__(self):
        super().__init__()
        angles = torch.outer(torch.arange(64.0), torch.linspace(0.1, 1.0, 4))
        self.register_buffer("freqs", torch.polar(torch.ones_like(angles), angles), False)

    def forward(self, x):
        b, h, w, _ = x.shape
        by_row = self.freqs[:h].view(h, 1, -1).expand(h, w, -1)
        by_column = self.freqs[:w].view(1, w, -1).expand(h, w, -1)
        grid = torch.cat([by_row, by_column], dim=-1).reshape(h * w, -1)[:, :4]
        grid = grid[torch.arange(h * w) % (h * w)].unsqueeze(0)
        first = grid.select(-1, 0).unsqueeze(-1)
        pairs = torch.view_as_complex(x.float().reshape(b, h * w, -1, 2))
        return torch.view_as_real(pairs * grid * first).flatten(2)


def test_complex_buffers_and_their_moves_export():
    # the buffer becomes a real initializer of two parts; expand, index, select and
    # unsqueeze of complex tensors translate (NucleusMoE's rotary frequencies)
    export_and_validate(
        ComplexFrequencyGrid(),
        (torch.randn(2, 3, 5, 8),),
        dynamic_shapes=({0: "b", 1: "h", 2: "w"},),
    )


class RemainderBySize(torch.nn.Module):
    """``arange(n) % (n - 1)``: a remainder by a symbolic int (``remainder.Scalar``)."""

    def forward(self, x):
        n = x.shape[0] * x.shape[1]
        wrapped = x.flatten()[torch.arange(n) % (n - 1)]
        return wrapped, torch.arange(x.shape[0]).clamp(max=x.shape[1]) * 1.5


def test_a_remainder_by_a_symbolic_int_exports():
    export_and_validate(RemainderBySize(), (torch.randn(3, 5),), dynamic_shapes=({0: "a", 1: "b"},))


class WriteThroughAStridedReshape(torch.nn.Module):
    """A write through ``y[::2].reshape(-1)``: a view of ``y`` where ``y[::2]`` has one
    row (``b`` of 2 or 3), a copy otherwise."""

    def forward(self, x, y):
        w = y[::2].reshape(-1)
        w[0] = 0.5
        return x + w.sum()


def _matches_eager_with_writes(model, result, input_sets) -> None:
    """onnxruntime computes what eager computes on each input set: the outputs, and the
    inputs the model writes into after the call."""
    output = next(n for n in result.graph_module.graph.nodes if n.op == "output")
    mutations = output.meta.get(MUTATIONS_KEY, ())
    report = validate(model, result, input_sets, mutations=mutations)
    assert report.ok, report.format()


def test_a_write_whose_aliasing_depends_on_the_sizes_reaches_the_input_where_eager_does():
    """The layout of the reshape is a decision of the capture once written through:
    each side a version, the write reaching ``y`` where the reshape is a view (the
    export refused it until the capture decided it)."""
    model = WriteThroughAStridedReshape()
    dims = ({0: "s"}, {0: "b"})
    result = to_onnx(model, (torch.randn(2), torch.randn(8, 3)), dynamic_shapes=dims)
    sizes = [(torch.randn(s), torch.randn(b, 3)) for s, b in ((2, 8), (3, 2), (1, 3), (4, 5))]
    _matches_eager_with_writes(model, result, sizes)
    # the same write into a 1-d input is a view at every size: y is updated
    result = export_and_validate(
        WriteThroughAStridedReshape(),
        (torch.randn(2), torch.randn(8)),
        dynamic_shapes=({0: "s"}, {0: "b"}),
    )
    assert [o.name for o in result.model_proto.graph.output][-1] == "y_updated"


def test_fft_exports_with_dynamic_dimensions():
    export_and_validate(
        FourierMixing(), (torch.randn(2, 7, 8),), dynamic_shapes=({0: "batch", 1: "seq"},)
    )


class WriteThroughContiguous(torch.nn.Module):
    """``contiguous()`` of every other column is the view itself where one column
    remains (and a copy elsewhere): the write reaches ``t`` only there."""

    def forward(self, x):
        t = x + 1
        w = t[:, ::2].contiguous()
        w.mul_(2)
        return t * 3


def test_a_write_through_contiguous_reaches_the_tensor_where_it_is_a_view():
    # the ONNX model computed `mul` into a copy and returned t unchanged: wrong by
    # 2x at x.shape[1] == 1 (found by fuzz_onnx comparing at size 1), where eager's
    # contiguous() returned the view and the write reached t; then the export refused
    # the write; now the capture decides the layout, each side a version
    model = WriteThroughContiguous()
    dims = ({0: "batch", 1: "n"},)
    result = to_onnx(model, (torch.randn(2, 5),), dynamic_shapes=dims)
    sizes = [(torch.randn(b, n),) for b, n in ((2, 5), (2, 1), (3, 2), (1, 4), (2, 6))]
    _matches_eager_with_writes(model, result, sizes)
    # the graph module too
    from yobx.torch.tracing import CustomTracer

    tracer = CustomTracer()
    x = torch.randn(2, 5)
    graph = tracer.trace(model, concrete_args={"x": x}, dynamic_shapes={"x": {0: "b", 1: "n"}})
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    for n in (5, 1, 2, 4):
        x = torch.randn(2, n)
        torch.testing.assert_close(gm(x), model(x))


class SearchSorted(torch.nn.Module):
    """Bucketing positions or durations into sorted boundaries (a speech-language
    model's audio positions): 1-D and batched boundaries, left and right sides, and
    boundaries of another dtype than the values."""

    def forward(self, boundaries, values, batched):
        left = torch.searchsorted(boundaries, values)
        right = torch.searchsorted(boundaries, values, right=True)
        rows = values.unsqueeze(0).expand(batched.shape[0], -1).contiguous()
        # integer boundaries, float values: compared in the promoted type
        mixed = torch.searchsorted(boundaries.long(), values + 0.5)
        return left, right, torch.searchsorted(batched, rows, out_int32=True), mixed


def _sorted_inputs(m: int, k: int, n: int) -> tuple:
    # repeated boundaries and values equal to them: where the sides differ
    boundaries = torch.sort(torch.randint(0, 10, (m,)).float()).values
    batched = torch.sort(torch.randint(0, 10, (n, m)).float(), dim=-1).values
    return boundaries, torch.randint(0, 11, (k,)).float(), batched


def test_searchsorted_exports_exact():
    onnxruntime = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = SearchSorted()
    dims = ({0: "m"}, {0: "k"}, {0: "n", 1: "m"})
    result = to_onnx(model, _sorted_inputs(6, 5, 3), dynamic_shapes=dims)
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for sizes in ((6, 5, 3), (9, 2, 4), (1, 7, 1)):
        inputs = _sorted_inputs(*sizes)
        feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)}
        for expected, got in zip(model(*inputs), session.run(None, feeds)):
            assert torch.equal(torch.from_numpy(got), expected)


class _RepeatBySize(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x, y):
        # a repeat computed from a dimension (a video VAE's time steps)
        return x.repeat_interleave(y.shape[0], dim=self.dim) * 2


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2, None])
def test_repeat_interleave_by_a_size_exports_exact_at_other_sizes(dim):
    # torch_lib's translation expanded the repeated axis instead of a new one: the
    # model failed at other sizes with "invalid expand shape"
    x, y = torch.randn(2, 3, 4), torch.randn(5)
    shapes = {"x": {0: "batch", 2: "width"}, "y": {0: "times"}}
    export_and_validate(_RepeatBySize(dim), (x, y), dynamic_shapes=shapes)


class _BooleanMasks(torch.nn.Module):
    def forward(self, x, n):
        # a boolean mask filled (a video transformer's attention mask): a Where between
        # booleans, which onnxruntime's CPU provider has no kernel for
        ones = torch.ones(x.shape[0], x.shape[1], dtype=torch.bool)
        keep = torch.arange(x.shape[1]) >= n.shape[0]
        mask = ones.masked_fill(keep, False)
        return x * mask, mask.masked_fill(~keep, True) & (x > 0)


def test_boolean_masks_filled_run_in_onnxruntime():
    shapes = ({0: "batch", 1: "seq"}, {0: "n"})
    export_and_validate(
        _BooleanMasks(), (torch.randn(2, 6), torch.randn(3)), dynamic_shapes=shapes, min_cases=2
    )
