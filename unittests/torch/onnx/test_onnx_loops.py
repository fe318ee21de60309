"""Never narrow, item 3 in ONNX: a loop over a dynamic range is an ONNX ``Scan`` over
the real length, exact in onnxruntime at lengths the example did not have (1 included);
a state-space model's slow path (transformers' Mamba) exports with its sequence
length dynamic."""

import numpy as np
import onnxruntime
import pytest
import torch

from unittests.torch.onnx._helpers import export_and_validate, onnx_dims
from unittests.torch.tracing.test_tracing_loops import (
    Cell,
    Chunks,
    ConstantState,
    FromOne,
    IndexAsNumber,
    IndexAsNumberFirstApart,
    LastStepValues,
    LastStepValueSetBefore,
    LearnedState,
    Neighbours,
    NumbersOfTheIndex,
    ReadsNoSlice,
    Recurrence,
    RunsOrNot,
    SetByTheFirstStep,
    SlicesOfInvariants,
    SlicesWithNewAxes,
    WriteAfterNoStep,
    Writes,
    WritesIntoItsOwn,
    WritesTheStateReceived,
    _first_step,
    _first_step_flag,
    _Fn,
)
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.errors import OnnxExportError


def _op_types(model_proto) -> list[str]:
    """The operator types of the model, its functions and their subgraphs (a version's
    branch)."""
    nodes = [*model_proto.graph.node, *(n for f in model_proto.functions for n in f.node)]
    types = []
    while nodes:
        node = nodes.pop()
        types.append(node.op_type)
        for attribute in node.attribute:
            nodes.extend(attribute.g.node)
            nodes.extend(n for g in attribute.graphs for n in g.node)
    return types


def _matches_eager(result, model, shapes) -> None:
    """onnxruntime gives eager's outputs on an input ``x`` of each shape of ``shapes``."""
    for shape in shapes:
        x = torch.randn(*shape)
        with torch.no_grad():
            expected = model(x.clone())
        expected = expected if isinstance(expected, tuple) else (expected,)
        for e, got in zip(expected, _run(result, x=x)):
            np.testing.assert_allclose(e.numpy(), got, atol=1e-5, rtol=1e-5)


def _run(result, **feeds) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {k: v.numpy() for k, v in feeds.items()})


@pytest.mark.parametrize("model", [Recurrence, Cell, Writes])
def test_loop_is_a_scan_exact_at_other_lengths(model):
    model = model().eval()
    x = torch.randn(2, 5, 3)
    result = export_and_validate(model, (x,), dynamic_shapes={"x": {0: "batch", 1: "seq"}})
    assert "Scan" in _op_types(result.model_proto)
    assert onnx_dims(result.model_proto)["x"] == ["batch", "seq", 3]
    for batch, seq in [(1, 1), (3, 2), (2, 11)]:
        x = torch.randn(batch, seq, 3)
        with torch.no_grad():
            expected = model(x)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for e, got in zip(expected, _run(result, x=x)):
            np.testing.assert_allclose(e.numpy(), got, atol=1e-5, rtol=1e-5)


def test_a_scan_of_zero_steps_runs_in_onnxruntime():
    # onnxruntime's Scan fails on empty inputs ("dim0_offset < dim0_size was false"):
    # the export gives it one step of zeros there, which a mask keeps out of the states
    # (yobx.torch.onnx.empty_scans)
    model = FromOne()
    result = export_and_validate(model, (torch.randn(4, 3, 7),), dynamic_shapes=({2: "dim"},))
    for dim in (7, 2, 1):
        y = torch.randn(4, 3, dim)
        for e, got in zip(model(y), _run(result, y=y)):
            np.testing.assert_allclose(e.numpy(), got, atol=1e-5, rtol=1e-5)


class WriteIntoTheLoopState(torch.nn.Module):
    """Writes into the states a loop carries out, one through a view (fuzz_onnx seed
    10084): each state is new storage the body computes (a clone for zero steps), never
    an input's."""

    def forward(self, x):
        state = x[:1] * 0
        decayed = x[0] * 1
        for i in range(x.shape[0]):
            state = state + x[i]
            decayed = decayed * 0.5 + x[i]
        state[:, ::2].mul_(2)
        decayed.add_(1)
        return state + 1, decayed, x


def test_a_write_into_the_state_of_a_loop_is_exported():
    # the scan's outputs may have aliased its inputs for the passes, which refused the
    # write ("may share storage with input 'x'")
    model = WriteIntoTheLoopState()
    result = export_and_validate(model, (torch.randn(3, 4),), dynamic_shapes=({0: "n"},))
    assert "Scan" in _op_types(result.model_proto)
    _matches_eager(result, model, [(n, 4) for n in (3, 1, 2, 6)])


class FirstColumnRecurrence(torch.nn.Module):
    """A loop over the rows of ``y[..., :1]``, whose state has 0 columns where ``y``
    has none, and a flattened product of ``y`` with its sizes, which a version at
    ``length = 0`` computes (fuzz_onnx seed 7722)."""

    def forward(self, y):
        first = y[..., :1]
        state = first[0] * 0
        for i in range(first.shape[0]):
            state = state * 0.5 + first[i]
        return state, (y * torch.tensor(y.shape).sum().float()).flatten()


class FirstColumnRecurrenceBesideRows(torch.nn.Module):
    """The same loop, its versions kept apart by what else they compute: the state's
    first value is computed once before them, for both."""

    def forward(self, y):
        first = y[..., :1]
        rows = y.narrow(0, 0, min(y.shape[0], 6))
        scaled = rows * torch.tensor(rows.shape).sum().float()
        state = first[0] * 0
        for i in range(first.shape[0]):
            state = state * 0.5 + first[i]
        return scaled.flatten(), state


@pytest.mark.parametrize("model", [FirstColumnRecurrence, FirstColumnRecurrenceBesideRows])
def test_a_scan_state_empty_in_one_version_runs_in_onnxruntime(model):
    # the versions at `length = 0` and at `length >= 1` each had a Scan whose state is
    # 0 or 1 wide: merged into one Scan (or its first state computed once for both),
    # the body kept the declared width 1, which onnxruntime refused to load (a hoisted
    # state) or allocated ahead and refused to run at length 0 (a merged body)
    model = model()
    result = export_and_validate(
        model, (torch.randn(8, 7),), dynamic_shapes=({0: "seq", 1: "length"},)
    )
    for shape in [(8, 7), (3, 0), (4, 1), (1, 3)]:
        y = torch.randn(*shape)
        got = _run(result, y=y)
        for e, g in zip(model(y), got):
            assert e.shape == g.shape
            np.testing.assert_allclose(e.numpy(), g, atol=1e-5, rtol=1e-5)


def test_mamba_slow_path_has_a_dynamic_sequence():
    transformers = pytest.importorskip("transformers")
    config = transformers.MambaConfig(
        vocab_size=100, hidden_size=32, state_size=8, num_hidden_layers=2,
        intermediate_size=64, conv_kernel=4, expand=2, time_step_rank=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MambaModel(config).eval()
    ids = torch.randint(0, 100, (2, 6))
    result = export_and_validate(
        model,
        (),
        {"input_ids": ids, "use_cache": False},
        dynamic_shapes={"input_ids": {0: "batch", 1: "seq"}},
    )
    assert _op_types(result.model_proto).count("Scan") == 2
    for batch, seq in [(1, 1), (3, 11)]:
        ids = torch.randint(0, 100, (batch, seq))
        with torch.no_grad():
            expected = model(input_ids=ids, use_cache=False).last_hidden_state
        got = _run(result, input_ids=ids)[0]
        np.testing.assert_allclose(expected.numpy(), got, atol=1e-4, rtol=1e-4)


def test_a_write_into_a_loop_state_that_may_view_an_input_is_refused():
    # for zero steps the state is `x[:1]` itself: a write into it changes `x`, which
    # a functional graph cannot show, so the export refuses instead of dropping it
    with pytest.raises(OnnxExportError, match="may share storage with input 'x'"):
        to_onnx(
            WriteAfterNoStep(),
            (torch.randn(3, 4), torch.randn(3, 4)),
            dynamic_shapes=({}, {0: "n"}),
        )


class ZeroStepsInAVersion(torch.nn.Module):
    """A loop over ``range(1, n)`` inside one of the capture's versions (its first
    state is empty at ``n = 0``): no step at ``n = 1``."""

    def forward(self, x):
        state = x[:1].sum(0) * 0
        for i in range(1, x.shape[0]):
            state = torch.tanh(state + x[i] * -1.0)
        return state


def test_a_scan_of_zero_steps_in_a_version_runs_in_onnxruntime():
    # the version's branch is a local function until the optimizer inlines it: the
    # guard against onnxruntime's empty scans did not look there, and the model
    # failed at n = 1 ("dim0_offset < dim0_size was false")
    model = ZeroStepsInAVersion()
    result = export_and_validate(model, (torch.randn(4, 3),), dynamic_shapes=({0: "n"},))
    _matches_eager(result, model, [(n, 3) for n in (4, 2, 1, 0)])


@pytest.mark.parametrize(
    "model",
    [
        ReadsNoSlice,
        SlicesOfInvariants,
        SetByTheFirstStep,
        WritesIntoItsOwn,
        WritesTheStateReceived,
    ],
)
def test_loops_of_other_forms_are_scans(model):
    model = model()
    result = export_and_validate(model, (torch.randn(4, 3),), dynamic_shapes=({0: "n"},))
    assert "Scan" in _op_types(result.model_proto)
    _matches_eager(result, model, [(n, 3) for n in (4, 1, 2, 7)])


def test_slices_with_new_axes_export_exact():
    model = SlicesWithNewAxes()
    result = export_and_validate(model, (torch.randn(2, 4, 3),), dynamic_shapes=({0: "b", 1: "n"},))
    assert "Scan" in _op_types(result.model_proto)
    _matches_eager(result, model, [(2, 4, 3), (1, 1, 3), (3, 2, 3), (2, 7, 3)])


@pytest.mark.parametrize(
    "model, batch",
    [(_Fn(_first_step), 2), (_Fn(_first_step_flag), 2), (ConstantState(), 1), (LearnedState(), 2)],
    ids=["decision", "flag", "constant-state", "learned-state"],
)
def test_a_first_step_apart_from_the_scan_exports_exact(model, batch):
    result = export_and_validate(model, (torch.randn(batch, 5, 3),), dynamic_shapes=({1: "n"},))
    assert "Scan" in _op_types(result.model_proto)
    _matches_eager(result, model, [(batch, n, 3) for n in (5, 1, 2, 3, 9)])


def test_a_loop_over_a_whole_size_may_run_no_step_in_onnxruntime():
    model = RunsOrNot()
    result = export_and_validate(model, (torch.randn(4, 3),), dynamic_shapes=({0: "n"},))
    _matches_eager(result, model, [(n, 3) for n in (4, 0, 1, 2)])


def test_chunks_and_offsets_of_the_index_export_exact():
    model = Chunks()
    result = export_and_validate(model, (torch.randn(2, 16, 3),), dynamic_shapes=({1: "n"},))
    assert "Scan" in _op_types(result.model_proto)
    _matches_eager(result, model, [(2, n, 3) for n in (16, 3, 4, 13, 40, 0)])
    model = Neighbours()
    result = export_and_validate(model, (torch.randn(5, 3),), dynamic_shapes=({0: "n"},))
    assert "Scan" in _op_types(result.model_proto)
    _matches_eager(result, model, [(n, 3) for n in (5, 1, 2, 7)])


@pytest.mark.parametrize("model", [IndexAsNumber, IndexAsNumberFirstApart, NumbersOfTheIndex])
def test_the_index_taken_as_a_number_exports_exact(model):
    model = model()
    result = export_and_validate(model, (torch.randn(5, 3),), dynamic_shapes=({0: "n"},))
    assert "Scan" in _op_types(result.model_proto)
    _matches_eager(result, model, [(n, 3) for n in (5, 1, 2, 3, 8)])


def test_values_of_the_last_step_used_after_the_loop_export_exact():
    cases = ((LastStepValues(), (5, 1, 2, 8)), (LastStepValueSetBefore(), (5, 0, 1, 8)))
    for model, lengths in cases:
        result = export_and_validate(model, (torch.randn(5, 3),), dynamic_shapes=({0: "n"},))
        assert "Scan" in _op_types(result.model_proto)
        _matches_eager(result, model, [(n, 3) for n in lengths])


class WriteIntoTheScannedInput(torch.nn.Module):
    """The input is written after a loop that scanned it, while the state's first value
    also leaves the loop (``prev``): the final state may be that first value (no step),
    never the input."""

    def forward(self, x):
        state = x[:1].sum(0) * 0
        prev = state
        for row in x.unbind(0):
            state = state + row
        x.add_(1)
        return state, prev, x * 1


def test_a_write_into_the_scanned_input_is_exported():
    # the passes took each output of a scan for an alias of everything it reads, the
    # input included: the write into it was refused, `prev` being read after it
    model = WriteIntoTheScannedInput()
    result = export_and_validate(model, (torch.randn(4, 3),), dynamic_shapes=({0: "n"},))
    for n in (4, 1, 2, 7):
        x = torch.randn(n, 3)
        expected = model(x.clone())
        got = _run(result, x=x)
        for e, g in zip((*expected, x + 1), got):
            np.testing.assert_allclose(e.numpy(), g, atol=1e-5, rtol=1e-5)
