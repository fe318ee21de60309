"""Never narrow, in ONNX: the versions of a capture become an ``If`` choosing from the
input sizes; what a version still assumes is checked when the model selects it."""

from __future__ import annotations

import copy

import numpy as np
import onnxruntime
import pytest
import torch

from unittests.torch.tracing._helpers import MaskOrToken
from unittests.torch.tracing.test_tracing_versions import SqueezeAndCompare
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.runtime_checks import failed_check


def _session(result) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


class Long(torch.nn.Module):
    def forward(self, x):
        if x.shape[2] > 16:
            return x.sum(dim=2) * 2
        return x.mean(dim=2) + 1


def test_both_sides_are_exported_and_validated():
    model = Long()
    result = to_onnx(
        model, (torch.randn(2, 3, 8),), dynamic_shapes={"x": {0: "batch", 2: "seq"}}, validate=True
    )
    assert "If" in [n.op_type for n in result.model_proto.graph.node]
    # nothing narrowed: no constraint, no check beyond the declared ranges
    assert result.constraints == []
    assert all("16" not in c.expression for c in result.runtime_checks)
    report = result.validation
    assert report.ok, report.format()
    assert any(c.description.startswith("[version 2: (seq > 16)]") for c in report.cases)
    session = _session(result)
    for batch, seq in ((2, 5), (3, 16), (2, 17), (4, 40)):
        x = torch.randn(batch, 3, seq)
        (got,) = session.run(None, {"x": x.numpy()})
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-5, rtol=1e-5)


class Table(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(32, 4))

    def forward(self, x):
        if x.shape[1] > 8:
            return x + self.table[: x.shape[1]] * 2
        return x + self.table[: x.shape[1]]


def test_a_version_constraint_is_checked_where_the_version_runs():
    model = Table()
    result = to_onnx(
        model, (torch.randn(2, 4, 4),), dynamic_shapes={"x": {0: "b", 1: "n"}}, validate=True
    )
    (check,) = [c for c in result.runtime_checks if "32" in c.expression]
    assert check.expression == "n <= 32 when (n > 8)"
    report = result.validation
    assert report.ok, report.format()
    assert report.n_checks_fired >= 1
    session = _session(result)
    for n in (2, 8, 9, 20, 32):
        x = torch.randn(3, n, 4)
        (got,) = session.run(None, {"x": x.numpy()})
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-5, rtol=1e-5)
    with pytest.raises(Exception) as info:
        session.run(None, {"x": torch.randn(3, 33, 4).numpy()})
    assert "n <= 32 when (n > 8)" in failed_check(str(info.value))


def test_constraints_narrowing_keeps_one_capture():
    result = to_onnx(
        Long(),
        (torch.randn(2, 3, 8),),
        dynamic_shapes={"x": {2: "seq"}},
        narrowing="constraints",
    )
    assert "If" not in [n.op_type for n in result.model_proto.graph.node]
    assert [c.expression for c in result.constraints] == ["seq <= 16"]


def test_max_versions_bounds_the_versions_and_keeps_the_single_token_first():
    from torch.export import Dim

    inputs = (torch.randn(2, 3, 4), torch.ones(2, 3))
    dims = {"x": {0: "b", 1: Dim.DYNAMIC(min=1)}, "mask": {0: "b", 1: Dim.DYNAMIC(min=1)}}
    every = to_onnx(MaskOrToken(), inputs, dynamic_shapes=dims)
    assert len(every.versions) >= 3
    two = to_onnx(MaskOrToken(), inputs, dynamic_shapes=dims, max_versions=2, validate=True)
    assert two.validation.ok, two.validation.format()
    assert [v.when for v in two.versions] == ["(x_dim_1 != 1)", "(x_dim_1 == 1)"]
    session = _session(two)
    for seq, total in ((1, 1), (4, 2), (3, 3)):
        x, mask = torch.randn(3, seq, 4), torch.rand(3, total)
        (got,) = session.run(None, {"x": x.numpy(), "mask": mask.numpy()})
        np.testing.assert_allclose(got, MaskOrToken()(x, mask).numpy(), atol=1e-5, rtol=1e-5)
    # the mask longer than the sequence is refused by the model, not computed wrong
    with pytest.raises(Exception, match="mask_dim_1 <= x_dim_1"):
        session.run(
            None, {"x": np.ones((3, 2, 4), np.float32), "mask": np.ones((3, 5), np.float32)}
        )
    with pytest.raises(ValueError, match="max_versions must be at least 1"):
        to_onnx(MaskOrToken(), inputs, dynamic_shapes=dims, max_versions=0)


class Projection(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.shape[1] > 8:
            return self.linear(x) * 2
        return self.linear(x) + 1


def test_the_versions_share_the_weights_and_leave_the_model_alone():
    model = Projection()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    dynamic = {"x": {0: "b", 1: "n"}}
    x = torch.randn(2, 4, 4)
    result = to_onnx(model, (x,), dynamic_shapes=dynamic, validate=True)
    assert len(result.versions) == 2 and result.validation.ok, result.validation.format()
    # the lowering replaces the weights with fakes while it runs: all are put back,
    # though both versions reach them (two paths to the same attribute)
    for name, value in model.state_dict().items():
        assert type(value) is torch.Tensor and torch.equal(value, weights[name]), name
    # stored once, not once per version
    matrices = [i for i in result.model_proto.graph.initializer if list(i.dims) == [4, 4]]
    assert len(matrices) == 1


def test_versions_that_do_not_export_fall_back_to_one_checked_capture(monkeypatch):
    from yobx.torch.onnx import lowering

    def refused(*args, **kwargs):
        raise RuntimeError("cond lowering refused\nsecond line")

    # a version whose lowering fails (an operator without translation in one of
    # them): the model is exported, on the example's side, checked
    monkeypatch.setattr(lowering, "record_cond", refused)
    model = Long()
    result = to_onnx(
        model, (torch.randn(2, 3, 8),), dynamic_shapes={"x": {2: "seq"}}, validate=True
    )
    assert result.validation.ok, result.validation.format()
    note = result.version_notes[0]
    assert note.startswith("the versions could not be exported (OnnxExportError: "), note
    assert "RuntimeError: cond lowering refused" in note
    assert note.endswith("exported the example's side, its constraints checked by the model")
    assert [c.expression for c in result.constraints] == ["seq <= 16"]
    assert [s.name for s in result.stages].count("capture") == 1
    with pytest.raises(Exception) as info:
        _session(result).run(None, {"x": torch.randn(2, 3, 17).numpy()})
    assert "seq <= 16" in failed_check(str(info.value))


def test_a_side_returning_another_rank_stays_a_constraint_the_others_versions():
    # fuzz_onnx seed 10848: the side of `width == 1` (squeeze drops the axis) made the
    # whole choice fail to export, and every decision became a constraint, `width <=
    # heads` too; now that side alone does
    model = SqueezeAndCompare()
    x, y = torch.randn(4, 3), torch.randn(2, 5)
    result = to_onnx(model, (x, y), dynamic_shapes=({0: "width"}, {1: "heads"}))
    assert not result.version_fallback
    assert [v.when for v in result.versions] == ["(width <= heads)", "(width > heads)"]
    assert [c.expression.split(" when ")[0] for c in result.constraints] == ["width != 1"]
    notes = result.version_notes
    assert any("returns a tensor of rank 1 where the example's side" in n for n in notes)
    session = _session(result)
    for width, heads in ((4, 5), (2, 2), (7, 3), (3, 2)):
        x, y = torch.randn(width, 3), torch.randn(2, heads)
        (got,) = session.run(None, {"x": x.numpy(), "y": y.numpy()})
        np.testing.assert_allclose(got, model(x, y).numpy(), atol=1e-5, rtol=1e-5)
    with pytest.raises(Exception) as info:
        session.run(None, {"x": torch.randn(1, 3).numpy(), "y": torch.randn(2, 4).numpy()})
    assert "width != 1" in failed_check(str(info.value))


class SizeOutput(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] > 4:
            return x.sum(1), x.shape[1] * 2
        return x.mean(1), 8


class Blocks(torch.nn.Module):
    def forward(self, x):
        blocks = (x.shape[1] + 3) // 4
        return torch.stack([x[:, i * 4 : (i + 1) * 4].sum(1) for i in range(blocks)], 1)


@pytest.mark.parametrize(
    ("model", "example", "sizes"),
    [(SizeOutput(), (2, 3), [2, 4, 5, 9]), (Blocks(), (2, 7, 3), [2, 5, 8, 9, 13])],
    ids=["size_output", "nested_blocks"],
)
def test_versions_returning_sizes_or_nested_are_exported(model, example, sizes):
    """A size computed by one version and folded by another, and nested choices (one
    version per number of blocks), export as Ifs, exact at every size."""
    result = to_onnx(model, (torch.randn(*example),), dynamic_shapes={"x": {1: "n"}}, validate=True)
    assert not result.version_fallback and len(result.versions) >= 2
    assert result.validation.ok, result.validation.format()
    session = _session(result)
    for n in sizes:
        x = torch.randn(example[0], n, *example[2:])
        got = session.run(None, {"x": x.numpy()})
        expected = model(x)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for e, g in zip(expected, got):
            np.testing.assert_allclose(np.asarray(e), g, atol=1e-5, rtol=1e-5)


def test_position_interpolation_versions_export_exact_at_non_square_sizes():
    """A vision transformer skips the interpolation of its position table for the
    square size it was built for: each version is lowered on its own example (the
    square version adds a table of 17 rows, which the joined graph's sizes cannot
    show), and the ONNX model is exact at square, non-square and other patch counts."""
    pytest.importorskip("transformers")
    from yobx.models.architectures import build
    from yobx.torch.onnx.validation import validate

    case = build("vit")
    result = to_onnx(
        case.model, case.args, case.kwargs, dynamic_shapes=case.dynamic_shapes, validate=True
    )
    assert not result.version_fallback and len(result.versions) == 3
    # nothing narrowed; the suite compares every direct value with torch's kernels
    # (YOBX_CHECK_SHAPE_RULES), whose decisions (`max(1, h//8)*max(1, w//8) != 1`) are
    # the comparison's, not the lowering's (yobx.torch.onnx.version_guards)
    assert result.constraints == [], result.constraints
    assert result.validation.ok, result.validation.format()
    # the weights, read by every version, are stored once under the model's names
    names = [i.name for i in result.model_proto.graph.initializer]
    weights = [n for n in names if "constant" not in n and not n.startswith("val_")]
    assert sorted(weights) == sorted(dict(case.model.named_parameters())), weights
    for sizes in case.stress_sizes:  # torch.export's program refuses these
        report = validate(case.model, result, [((), case.inputs_at(sizes))])
        assert report.ok and report.n_checked == 1, report.format()


class Three(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] + 2 == 5:
            return x * 2
        return x - 1


def test_a_decision_fixing_the_example_size_exports_both_sides():
    """The example's side (d == 3) is a version where ``d`` is a constant; the ONNX
    model is exact at d=3 and elsewhere, and validation runs both sides."""
    model = Three()
    result = to_onnx(model, (torch.randn(2, 3),), dynamic_shapes=({1: "d"},), validate=True)
    assert result.validation.ok, result.validation.format()
    assert result.constraints == []
    session = _session(result)
    for d in (2, 3, 4, 9):
        x = torch.randn(2, d)
        (got,) = session.run(None, {"x": x.numpy()})
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-6)


class Windows(torch.nn.Module):
    """Block-wise compression: windows of 4 tokens exist only from 4 tokens on; the
    channels are split among the windows (they must divide them)."""

    def forward(self, x):
        batch = x.shape[0]
        usable = (x.shape[1] // 4) * 4
        chunk = x[:, :usable]
        if chunk.shape[1] > 0:
            windows = chunk.shape[1] // 4
            return chunk.reshape(batch, usable, windows, -1).sum(dim=2)
        return x.new_zeros((batch, 0, x.shape[2] // 2))


def test_a_version_check_dividing_by_zero_outside_its_version_holds():
    # the version with windows checks reshape conditions dividing by the window count,
    # which is 0 where that version does not run: the check, `body when guard`, holds
    # there (it refused the example itself when the division broke the whole check)
    model = Windows()
    result = to_onnx(
        model,
        (torch.randn(2, 3, 8),),
        dynamic_shapes={"x": {0: "batch", 1: "seq", 2: "c"}},
        validate=True,
    )
    assert any(" when " in c.expression for c in result.runtime_checks)
    assert result.validation.ok, result.validation.format()
    session = _session(result)
    for batch, seq, c in ((2, 3, 8), (1, 1, 8), (3, 2, 8), (2, 4, 8), (2, 9, 8), (1, 13, 6)):
        x = torch.randn(batch, seq, c)
        (got,) = session.run(None, {"x": x.numpy()})
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-5, rtol=1e-5)
    for check in result.runtime_checks:
        if " when " in check.expression:
            assert check.holds({("x", 0): 2, ("x", 1): 3, ("x", 2): 8}), check.expression


class EmptyOrNot(torch.nn.Module):
    """Two versions on ``n``, then a branch on an empty ``x`` each version adopts
    the non-empty side of."""

    def forward(self, x, y):
        z = y.sum(dim=0) * 2 if y.shape[0] > 4 else y.sum(dim=0) - 1
        if x.numel() == 0:
            return z + 1
        return z + x.shape[2]


def test_a_check_on_an_empty_size_shared_by_every_version_is_in_the_model():
    # the ONNX model returned the non-empty branch's values at batch=0 (wrong by 2)
    model = EmptyOrNot()
    result = to_onnx(
        model,
        (torch.randn(2, 4, 3), torch.randn(5, 3)),
        dynamic_shapes={"x": {0: "batch", 2: "past"}, "y": {0: "n"}},
    )
    session = _session(result)
    for batch, past, n in ((2, 3, 5), (1, 1, 3), (0, 3, 5), (2, 0, 3), (0, 0, 7)):
        x, y = torch.randn(batch, 4, past), torch.randn(n, 3)
        try:
            (got,) = session.run(None, {"x": x.numpy(), "y": y.numpy()})
        except Exception as e:  # refused: it must name the check, and only at a size 0
            assert failed_check(str(e)) is not None, str(e)
            assert 0 in (batch, past), (batch, past, str(e))
            continue
        np.testing.assert_allclose(got, model(x, y).numpy(), atol=1e-5)


class PinnedAtTwo(torch.nn.Module):
    """The side ``batch < 3``, captured at batch 2, where batch is the constant 2."""

    def forward(self, x, y):
        t = y[: x.shape[0]]
        if x.shape[0] < 3:
            return t * 2, x * 2
        return t - 1, x - 1


def test_a_version_pinning_a_dimension_to_two_is_checked_beyond_the_budget():
    model = PinnedAtTwo()
    y = torch.randn(2, 3)
    result = to_onnx(
        model,
        (torch.randn(8, 3), y),
        dynamic_shapes={"x": {0: "batch"}, "y": None},
        max_versions=2,
    )
    session = _session(result)
    for batch in (8, 3, 2, 1, 0):
        x = torch.randn(batch, 3)
        try:
            got = session.run(None, {"x": x.numpy(), "y": y.numpy()})
        except Exception as e:  # refused at 1 and 0, naming the check
            assert batch < 2 and "batch >= 2 when" in (failed_check(str(e)) or ""), str(e)
            continue
        assert batch >= 2
        for expected, value in zip(model(x, y), got):
            np.testing.assert_allclose(value, expected.numpy(), atol=1e-6)


def test_a_version_pinning_a_dimension_to_two_has_versions_below_it_in_the_model():
    model = PinnedAtTwo()
    y = torch.randn(2, 3)
    result = to_onnx(model, (torch.randn(8, 3), y), dynamic_shapes={"x": {0: "batch"}, "y": None})
    assert len(result.versions) == 4
    session = _session(result)
    for batch in (8, 3, 2, 1, 0):
        x = torch.randn(batch, 3)
        got = session.run(None, {"x": x.numpy(), "y": y.numpy()})
        for expected, value in zip(model(x, y), got):
            np.testing.assert_allclose(value, expected.numpy(), atol=1e-6)


class _WritesAHalfThenBranches(torch.nn.Module):
    def forward(self, x):
        x[: x.shape[0] // 2] *= 2
        if x.shape[1] % 2 != 0:
            return x + 1
        return x * 3


class _OneVersionWritesAndReturnsIt(torch.nn.Module):
    def forward(self, x, y):
        if x.shape[1] % 2 != 0:
            x.add_(1)
        y.mul_(2)
        return x, x[:, :1] * 1


@pytest.mark.parametrize(
    ("model", "shapes", "sizes"),
    [
        (_WritesAHalfThenBranches(), [(4, 6)], [[(5, 7)], [(2, 3)], [(4, 4)], [(1, 9)]]),
        (
            _OneVersionWritesAndReturnsIt(),
            [(4, 6), (3,)],
            [[(5, 7), (3,)], [(2, 3), (1,)], [(4, 4), (2,)]],
        ),
    ],
)
def test_versions_writing_into_their_inputs_export_both_sides(model, shapes, sizes):
    """A version writing into an input in place: the branches write into copies, the
    joined graph writes back once after the choice, the ONNX model returns the new
    values (`x_updated`) at every size (it fell back to the example's side alone)."""
    names = ["x", "y"][: len(shapes)]
    dynamic = {"x": {0: "rows", 1: "cols"}, "y": {0: "n"}}
    args = tuple(torch.randn(*s) for s in shapes)
    result = to_onnx(
        model, tuple(a.clone() for a in args), dynamic_shapes={n: dynamic[n] for n in names}
    )
    # `x[:, :1]` in the version of an even `cols` has a version at cols = 0, where the
    # folding made the model's input `[rows, 0]` through an Identity (a fallback)
    assert result.version_fallback == "" and len(result.versions) >= 2
    outputs = [o.name for o in result.model_proto.graph.output]
    session = _session(result)
    zero = [(s[0], 0) if len(s) == 2 else s for s in shapes]
    for case in [shapes, *sizes, zero]:
        inputs = [torch.randn(*s) for s in case]
        eager_inputs = [t.clone() for t in inputs]
        with torch.no_grad():
            expected = model(*eager_inputs)
        expected = list(expected) if isinstance(expected, tuple) else [expected]
        got = session.run(None, {n: t.numpy() for n, t in zip(names, inputs)})
        for name, value in zip(outputs, got):
            if name.endswith("_updated"):
                reference = eager_inputs[names.index(name[: -len("_updated")])]
            else:
                reference = expected[outputs.index(name)]
            np.testing.assert_allclose(value, reference.numpy(), rtol=1e-6, err_msg=name)


class _Accumulator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.arange(16.0))

    def forward(self, x):
        self.acc[: x.shape[0]] += x.sum(1)
        if x.shape[0] % 2:
            return x + 1
        return x * 2


class _WritesASubmodulesBufferInOneVersion(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.state = _Accumulator()

    def forward(self, x):
        if x.shape[1] % 2:
            self.state.acc[: x.shape[1]] *= 3
        return self.state(x) - self.state.acc[: x.shape[0]].unsqueeze(1)


@pytest.mark.parametrize(
    ("model_class", "buffer", "sizes"),
    [
        (_Accumulator, "acc", [(4, 3), (5, 3), (2, 3), (1, 3), (16, 3)]),
        (_WritesASubmodulesBufferInOneVersion, "state.acc", [(4, 6), (5, 3), (2, 7), (6, 2)]),
    ],
)
def test_versions_writing_into_a_buffer_export_both_sides(model_class, buffer, sizes):
    """A version writing into the model's buffer: the joined graph reads the buffer,
    the branches write into a copy, the new value is written back once after the
    choice, and the ONNX model returns it (`..._updated`) on both sides of the
    decision (it fell back to the example's side alone)."""
    model = model_class()
    result = to_onnx(
        copy.deepcopy(model), (torch.randn(*sizes[0]),), dynamic_shapes={"x": {0: "n", 1: "m"}}
    )
    assert result.version_fallback == "" and len(result.versions) >= 2
    outputs = [o.name for o in result.model_proto.graph.output]
    assert len(outputs) == 2 and outputs[1].endswith("_updated"), outputs
    session = _session(result)
    for size in sizes:
        x = torch.randn(*size)
        eager = copy.deepcopy(model)
        with torch.no_grad():
            expected = eager(x.clone())
        got = session.run(None, {"x": x.numpy()})
        np.testing.assert_allclose(got[0], expected.numpy(), atol=1e-5, err_msg=str(size))
        updated = eager.get_buffer(buffer).numpy()
        np.testing.assert_allclose(got[1], updated, atol=1e-5, err_msg=str(size))


def test_an_example_pinned_by_its_decisions_exports_its_dimension_dynamic():
    # exported from batch 2, which `batch < 3` holds at 2 in the example's capture:
    # to_onnx refused ("'batch' (axis 0 of x) is 2 in the ONNX model")
    model = PinnedAtTwo()
    y = torch.randn(2, 3)
    result = to_onnx(model, (torch.randn(2, 3), y), dynamic_shapes={"x": {0: "batch"}, "y": None})
    session = _session(result)
    assert session.get_inputs()[0].shape == ["batch", 3]
    for batch in (2, 8, 3, 1, 0):
        x = torch.randn(batch, 3)
        got = session.run(None, {"x": x.numpy(), "y": y.numpy()})
        for expected, value in zip(model(x, y), got):
            np.testing.assert_allclose(value, expected.numpy(), atol=1e-6)


class OneTokenIndexed(torch.nn.Module):
    """The version for one token indexes its input: the ``If`` branch holds an
    ``Identity`` of the input whose output is ``[batch, 1]``."""

    def forward(self, x):
        y = x[:, None, :, None].float()
        if x.shape[1] == 1:
            return y * 2
        return y + 1


def test_a_branch_knowing_a_size_of_an_input_leaves_the_input_dynamic():
    """The optimizer infers an ``Identity``'s input shape from its output's: inside a
    branch, that shape holds under the branch's condition only, and the model's input
    keeps its dynamic dimension (the export used to fall back to one capture checked
    at ``seq >= 2``)."""
    model = OneTokenIndexed()
    dynamic_shapes = ({0: "batch", 1: "seq"},)
    result = to_onnx(model, (torch.randn(2, 3),), dynamic_shapes=dynamic_shapes, validate=True)
    assert len(result.versions) == 2 and not result.version_fallback
    assert result.validation.ok, result.validation.format()
    x_input = result.model_proto.graph.input[0]
    assert [d.dim_param for d in x_input.type.tensor_type.shape.dim] == ["batch", "seq"]
    session = _session(result)
    for batch, seq in ((2, 1), (1, 1), (3, 4)):
        x = torch.randn(batch, seq)
        (got,) = session.run(None, {"x": x.numpy()})
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-6)


class _SlicedRows(torch.nn.Module):
    def forward(self, x):
        first, last = x[:2], x[-3:]
        return first.reshape(first.shape[0] * 3) + 1, last.sum(0) * last.shape[0]


def test_a_slice_clamped_below_the_default_range_gets_a_version():
    """``x[:2]`` has 2 rows for n >= 2, which the default range [2, inf) decides inside
    torch's kernel without a guard: the reshape to 6 values failed at n = 1 and 0. The
    decision is a version's, the model exact at every size."""
    result = to_onnx(_SlicedRows(), (torch.randn(8, 3),), dynamic_shapes=({0: "n"},))
    assert result.constraints == []
    session = _session(result)
    for rows in (8, 3, 2, 1, 0):
        x = torch.randn(rows, 3)
        for expected, got in zip(_SlicedRows()(x), session.run(None, {"x": x.numpy()})):
            assert got.shape == tuple(expected.shape), rows
            np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-6)


class _FirstColumnPieces(torch.nn.Module):
    def forward(self, x):
        first, last, piece = x[:, :1], x[:, -1:], x.split(1, 1)[0]
        return first.new_zeros(*first.shape, 2) + last.sum(), piece * last.shape[1]


def test_a_slice_of_length_one_over_an_empty_dimension_runs_in_onnxruntime():
    """``x[:, :1]`` has ``min(1, width)`` columns, which sympy folds to 1: the model
    made one column at width 0 where eager makes none. ``split``'s first piece at width
    0 is the empty tensor itself (onnxruntime's SplitToSequence gives no piece)."""
    result = to_onnx(_FirstColumnPieces(), (torch.randn(3, 8),), dynamic_shapes=({1: "width"},))
    session = _session(result)
    for width in (8, 2, 1, 0):
        x = torch.randn(3, width)
        for expected, got in zip(_FirstColumnPieces()(x), session.run(None, {"x": x.numpy()})):
            assert got.shape == tuple(expected.shape), width
            np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-6)


class EitherSize(torch.nn.Module):
    def forward(self, x):
        # `|` of two comparisons: one decision, whose example side is its negation
        if (x.shape[0] == 1) | (x.shape[1] == 2):
            return x + 1
        return x * 2


def test_a_version_chosen_by_a_negated_disjunction_is_exported():
    """The version taken where ``not (a == 1 or b == 2)`` holds: its choice computed
    with ``operator.not_`` asked the lowering's symbolic boolean for its value, fixing
    the choice, and the versions fell back to the example's side alone."""
    model = EitherSize()
    result = to_onnx(model, (torch.randn(3, 4),), dynamic_shapes=({0: "a", 1: "b"},))
    assert not result.version_fallback, result.version_fallback
    assert len(result.versions) == 2
    session = _session(result)
    for shape in ((3, 4), (1, 4), (3, 2), (1, 2), (5, 5)):
        x = torch.randn(*shape)
        (got,) = session.run(None, {"x": x.numpy()})
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-6)


class ChoiceAndWriteIntoAHalf(torch.nn.Module):
    """A decision on ``batch`` (``batch <= 4`` on the example's side), then a write
    into a view of the first half of ``y`` (fuzz_onnx seed 11249)."""

    def forward(self, x, y):
        t1 = x * 2 if x.shape[1] > 4 else x - 1
        half = y[: y.shape[0] // 2].reshape(-1)
        half.add_(half.shape[-1])
        return t1, y + 1


def test_a_write_rewritten_after_a_decision_keeps_the_dimension_dynamic():
    """The rewrite of the write computed its new nodes' fake values with torch's
    kernels, which asked ``(batch//2) != 1`` (is the view contiguous) on the example:
    the guard narrowed ``batch`` to ``[4, 4]`` within the decision's ``batch <= 4``, the
    ShapeEnv made it the constant 4, and the export was refused ('batch' is 4 in the
    ONNX model). Such a node's value now stays unknown and nothing is decided."""
    model = ChoiceAndWriteIntoAHalf()
    example = (torch.randn(3, 4, 4, 4), torch.randn(4))
    shapes = ({1: "batch", 2: "batch"}, {0: "batch"})
    result = to_onnx(model, example, dynamic_shapes=shapes)
    assert not result.version_fallback, result.version_fallback
    session = _session(result)
    for batch in (4, 2, 3, 5, 8):
        x, y = torch.randn(3, batch, batch, 4), torch.randn(batch)
        eager_y = y.clone()
        expected = model(x, eager_y)
        got = session.run(None, {"x": x.numpy(), "y": y.numpy()})
        # the outputs, then y as the model leaves it
        assert len(got) == 3
        for value, output in zip((*expected, eager_y), got):
            np.testing.assert_allclose(output, value.numpy(), rtol=1e-5, atol=1e-6)


class SqueezedQuarter(torch.nn.Module):
    """``squeeze`` of a dimension ``(batch//2)//2``: removed where it is 1, kept
    otherwise (fuzz_onnx seed 12944)."""

    def forward(self, y):
        pairs = y.contiguous().view(*y.shape[:2], y.shape[2] // 2, 2)
        quarter = pairs.shape[2] // 2
        return pairs.narrow(2, quarter, quarter).squeeze(2)


def test_a_squeezed_dimension_decided_to_be_one_leaves_the_output_of_its_rank():
    """Where the dimension was decided to be 1, torch's fake kernel still kept it (it
    cannot prove ``(batch//2)//2`` to be 1): the ONNX model, whose ranks come from those
    values, returned ``[8, 8, 1, 2]`` where eager returns ``[8, 8, 2]``, at the example
    itself. The squeeze is now recorded as ``select(2, 0)``."""
    model = SqueezedQuarter()
    result = to_onnx(model, (torch.randn(8, 8, 6),), dynamic_shapes=({2: "batch"},))
    session = _session(result)
    for batch in (6, 4, 8, 12):
        y = torch.randn(8, 8, batch)
        expected = model(y)
        try:
            (got,) = session.run(None, {"y": y.numpy()})
        except Exception as e:  # a size the model refuses names the check
            assert "yobx check failed" in str(e), e
            continue
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-6)
    # the example's side, and the sizes it covers, are computed
    (got,) = session.run(None, {"y": torch.ones(8, 8, 4).numpy()})
    assert got.shape == (8, 8, 2)
