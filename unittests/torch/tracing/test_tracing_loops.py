"""Never narrow, item 3: a loop over a dynamic range (``range(x.shape[1])``,
``x.unbind(1)``, ``x.split(1, 1)``) becomes a scan when each step computes the same
thing, exact at every length; otherwise the length is adopted as before and the
message says why the loop is not a scan. Never a graph that is wrong at other
lengths."""

import pytest
import torch

from yobx.torch.tracing import ConstraintViolationError, CustomTracer, SpecializationError
from yobx.torch.tracing.graph_operators import ScanCCOp

from ._helpers import assert_same, trace_module

DIMS = {"x": {0: "batch", 1: "seq"}}


def _scans(graph) -> int:
    return sum(1 for n in graph.nodes if isinstance(n.target, ScanCCOp))


def _scanned_and_exact(model, lengths=(4, 1, 2, 7)) -> torch.fx.Graph:
    """Traces ``model`` from an input of 4 rows (dimension ``n``): one scan, exact at
    every length of ``lengths``; returns the graph."""
    _, graph, gm = trace_module(model, {"x": torch.randn(4, 3)}, {"x": {0: "n"}})
    assert _scans(graph) == 1
    for n in lengths:
        x = torch.randn(n, 3)
        assert_same(model(x), gm(x))
    return graph


def _all_scans(gm: torch.fx.GraphModule) -> int:
    """The scans of a graph module and of its versions' graphs."""
    return sum(_scans(m.graph) for m in gm.modules() if isinstance(m, torch.fx.GraphModule))


def _check(model, lengths=(5, 1, 2, 9), batch=(2, 3, 1, 2), scans=1, constraints=()):
    """Traces at length 5, checks one graph is exact at every length (a version may
    hold the scan: `x[:, :1]` has a version for an empty sequence)."""
    tracer, graph, gm = trace_module(model, {"x": torch.randn(2, 5, 3)}, DIMS)
    assert _all_scans(gm) == scans, graph
    assert [c.expression for c in tracer.constraints] == list(constraints)
    for b, n in zip(batch, lengths):
        x = torch.randn(b, n, 3)
        assert_same(model(x), gm(x))
    return tracer, graph


class Recurrence(torch.nn.Module):
    """A state-space model's slow path: a state carried over the sequence, the
    per-step outputs stacked."""

    def forward(self, x):
        h = torch.zeros_like(x[:, 0])
        outs = []
        for i in range(x.shape[1]):
            h = torch.sigmoid(x[:, i]) * h + x[:, i]
            outs.append(h * 2)
        return torch.stack(outs, dim=1), h, h * len(outs)


class Cell(torch.nn.Module):
    """A recurrent cell written by hand, with a submodule called at each step."""

    def __init__(self):
        super().__init__()
        self.cell = torch.nn.Linear(6, 3)

    def forward(self, x):
        h = x[:, 0] * 0
        outs = []
        for xt in x.unbind(1):
            h = torch.tanh(self.cell(torch.cat([xt, h], -1)))
            outs.append(h)
        return torch.stack(outs, 1)


class Pieces(torch.nn.Module):
    def forward(self, x):
        h = x[:, :1] * 0
        outs = []
        for piece in torch.split(x, 1, dim=1):
            h = h * 0.9 - piece
            outs.append(h)
        return torch.cat(outs, 1)


class Backwards(torch.nn.Module):
    def forward(self, x):
        h = x[:, 0]
        outs = []
        for t in reversed(range(1, x.shape[1])):
            h = h * 0.5 + x[:, t]
            outs.append(h)
        return h, torch.stack(outs, 0)


class Writes(torch.nn.Module):
    """transformers' recurrent models: a new tensor written one step at a time (with a
    value that broadcasts)."""

    def forward(self, x):
        out = torch.zeros_like(x)
        state = torch.zeros(x.shape[0], 3)
        for t in range(x.shape[1]):
            state = state * 0.5 + x[:, t]
            out[:, t] = state.sum(-1, keepdim=True)
        return out, state


class TwoLoops(torch.nn.Module):
    """The second loop starts from what the first carries."""

    def forward(self, x):
        h = x[:, 0] * 0
        for i in range(x.shape[1]):
            h = h + x[:, i]
        g = h
        for i in range(x.shape[1]):
            g = g * 0.5 + x[:, i] * h
        return g


@pytest.mark.parametrize(
    "model, constraints", [(Recurrence, ["seq >= 1"]), (Pieces, []), (Writes, [])]
)
def test_loop_becomes_one_scan_exact_at_every_length(model, constraints):
    # torch.stack of the steps' values raises in eager for an empty sequence: a limit of
    # the model, checked by the graph
    _check(model(), constraints=constraints)


def test_reversed_range_from_one():
    # eager stacks no tensor at length 1: a limit of the model, checked by the graph
    _check(Backwards(), lengths=(5, 2, 3, 9), constraints=["seq >= 2"])
    _, _, gm = trace_module(Backwards(), {"x": torch.randn(2, 5, 3)}, DIMS)
    with pytest.raises(ConstraintViolationError, match="seq >= 2"):
        gm(torch.randn(2, 1, 3))


class FromOne(torch.nn.Module):
    """A loop over ``range(1, n)``: no step at n = 1, where eager returns the state as
    it came in and an empty stack."""

    def forward(self, y):
        h = y[..., 0] * 0
        outs = []
        for i in range(1, y.shape[2]):
            h = h * 0.5 + y[..., i]
            outs.append(h * 2)
        return h * len(outs), h


def test_a_scan_of_zero_steps_gives_its_states_back():
    # torch's scan reads the first step to know its outputs and raised IndexError
    # (fuzz_tracing seeds 3091, 3108, 3158, 3170, 4064, 4125, 4128, 4177, 4182)
    model = FromOne()
    _, _, gm = trace_module(model, {"y": torch.randn(4, 3, 7)}, {"y": {2: "dim"}})
    for dim in (7, 3, 2, 1):
        y = torch.randn(4, 3, dim)
        assert_same(model(y), gm(y))


class WriteAfterNoStep(torch.nn.Module):
    """A loop whose state starts as a view of ``x``, written after the loop."""

    def forward(self, x, y):
        state = x[:1]
        for i in range(y.shape[0]):
            state = state * 0.5 + y[i]
        state.add_(1)
        return state * 1, x * 1


def test_a_scan_of_zero_steps_gives_its_states_themselves():
    # for zero steps the state is `x[:1]` itself, as in eager: the write reaches `x`
    # (the scan gave a copy: x was left unchanged)
    model = WriteAfterNoStep()
    example = {"x": torch.randn(3, 4), "y": torch.randn(3, 4)}
    _, _, gm = trace_module(model, example, {"x": {}, "y": {0: "n"}})
    for n in (3, 1, 0):
        x, y = torch.randn(3, 4), torch.randn(n, 4)
        written = x.clone()
        assert_same(model(x, y), gm(written, y))
        assert_same(x, written)


class SetByTheFirstStep(torch.nn.Module):
    """Names the steps set to a tensor from before the loop (``prev = other``), to a
    state of the loop whose first value they did not hold (``latest = state``) or to a
    Python value (``seen = True``): where the loop runs no step, they keep their value
    from before it."""

    def forward(self, x):
        state, other = x[:1][0], x[0] * -1.0
        prev, latest, seen = state, other, False
        for i in range(1, x.shape[0]):
            state = torch.tanh(state + x[i] * -1.0)
            prev = other
            latest = state
            seen = True
        return state, prev, latest, state * 0 + seen


def test_names_set_by_the_first_step_keep_their_value_without_steps():
    # the scan made `prev` the tensor the steps set at every length: at n = 1 (no
    # step) eager's is `state`, and the graph's was wrong; the capture decides now that
    # the loop runs, and a version captures n = 1
    model = SetByTheFirstStep()
    tracer, _, gm = trace_module(model, {"x": torch.randn(4, 3)}, {"x": {0: "n"}})
    assert [str(v.conditions[0].expression) for v in tracer.versions] == ["n >= 2", "n < 2"]
    for n in (4, 1, 2, 6):
        x = torch.randn(n, 3)
        assert_same(model(x), gm(x))


class RunsOrNot(torch.nn.Module):
    """A name set by every step of ``range(n)``: where the loop runs no step (n = 0), it
    keeps its value from before the loop."""

    def forward(self, x):
        state, latest = x.sum(0) * 0, x.sum(0) + 5
        for i in range(x.shape[0]):
            state = state + x[i]
            latest = state
        return latest


def test_a_loop_over_a_whole_size_may_run_no_step():
    # the capture decided that the loop runs on `n >= 1`, which torch's positive
    # symbols fold to True: at n = 0 the graph returned the scan's zeros, eager 5
    model = RunsOrNot()
    tracer, _, gm = trace_module(model, {"x": torch.randn(4, 3)}, {"x": {0: "n"}})
    for n in (4, 0, 1, 2, 6):
        x = torch.randn(n, 3)
        assert_same(model(x), gm(x))


class SlicesOfInvariants(torch.nn.Module):
    """Steps selecting their slice from a tensor each step computes the same way from
    values before the loop: ``x[:, 0][i]``, ``x.transpose(0, 1)[:, i]``."""

    def forward(self, x):
        total, h = x[:1].sum(0) * 0, x[0] * 0
        for i in range(x.shape[0] - 1):
            total = total + x[:, 0][i]
            h = torch.tanh(h + x.transpose(0, 1)[:, i] * 0.5)
        return total, h


def test_slices_of_loop_invariants_are_scanned():
    # the selection's source was computed in the loop: the loop was unrolled (refused
    # for a dynamic dimension); it is computed once before the scan now
    graph = _scanned_and_exact(SlicesOfInvariants())
    (scan,) = [n for n in graph.nodes if isinstance(n.target, ScanCCOp)]
    assert scan.args[3] == [], "the body computes nothing it does not need"


class WritesIntoItsOwn(torch.nn.Module):
    """Steps writing in place into new tensors they make: a clone of the state, written
    through ``setitem`` and ``mul_``, read before and after the writes."""

    def forward(self, x):
        state = x[0] * 0
        for i in range(x.shape[0]):
            fresh = state.clone()
            before = fresh * 2
            fresh[::2] = x[i, ::2]
            fresh.mul_(0.5)
            state = fresh + before + x[i]
        return state


def test_writes_into_a_new_tensor_of_the_step_are_scanned():
    # an in-place write in a step made the loop unrolled (refused for a dynamic
    # dimension): one into a tensor the step makes is seen by nothing else
    _scanned_and_exact(WritesIntoItsOwn())


class WritesTheStateReceived(torch.nn.Module):
    """Each step writes the state it received before updating it (the states before
    each step: an exclusive scan)."""

    def forward(self, x):
        state = x[0] * 0 + 1
        before = torch.zeros_like(x)
        for i in range(x.shape[0]):
            before[i] = state
            state = state * 0.5 + x[i]
        return state, before


def test_writing_the_state_received_is_scanned():
    # the written value had to be computed by the step: the loop was unrolled
    _scanned_and_exact(WritesTheStateReceived())


class SlicesWithNewAxes(torch.nn.Module):
    """Slices at the index with a new axis after it (xLSTM's ``fgate[:, :, t, None]``),
    also after an ellipsis."""

    def forward(self, x):
        state = x[:, 0, :, None] * 0
        for t in range(x.shape[1]):
            state = state * torch.sigmoid(x[:, t, None, :]).transpose(1, 2) + x[..., t, :, None]
        return state


def test_slices_with_new_axes_are_scanned():
    # a None after the index was refused: the loop was unrolled (refused for xLSTM's
    # dynamic sequence)
    model = SlicesWithNewAxes()
    _, graph, gm = trace_module(model, {"x": torch.randn(2, 4, 3)}, {"x": {0: "b", 1: "n"}})
    assert _scans(graph) == 1
    for b, n in ((2, 4), (1, 1), (3, 2), (2, 7)):
        x = torch.randn(b, n, 3)
        assert_same(model(x), gm(x))


class ReadsNoSlice(torch.nn.Module):
    """A loop whose steps read no slice of a tensor: only its carried states."""

    def forward(self, x):
        state, decay = x[0] * 1, x[0] * 0 + 0.5
        for _ in range(1, x.shape[0]):
            state = state * decay + 1
        return state


def test_a_loop_reading_no_slice_runs_its_number_of_steps():
    # the scan took its number of steps from the slices it reads: with none, torch's
    # scan ran no step and returned its states as they came in, at every length
    _scanned_and_exact(ReadsNoSlice())


def test_cell_with_submodule_and_unbind():
    _check(Cell(), constraints=["seq >= 1"])


def test_two_loops_two_scans():
    _check(TwoLoops(), scans=2)


def test_len_of_the_stacked_list_is_the_length():
    # no constraint but the stack's own (`len(outs)` is the sequence's length)
    tracer, graph = _check(Recurrence(), constraints=["seq >= 1"])


def test_loop_of_a_nested_loop_over_a_static_size():
    class Nested(torch.nn.Module):
        def forward(self, x):
            h = x[:, 0, 0] * 0
            for i in range(x.shape[1]):
                for j in range(x.shape[2]):
                    h = h + x[:, i, j] * (j + 1)
            return h

    _check(Nested())


# the loops that are not one computation: refused as before, with the reason


def _counter(x):
    h, n = x[:, 0], 0
    for i in range(x.shape[1]):
        h, n = h + x[:, i], n + 1
    return h / n


def _exchanged(x):
    # nothing the steps record reads `a` or `b`: the exchange is Python's alone, which
    # the scan (repeating what the steps record) did not repeat, wrong at even lengths
    a, b = x[:, 0] * 1, x[:, 0] * 2
    for _ in range(x.shape[1]):
        a, b = b, a
    return a - b


def _last(x):
    outs = [x[:, i] * 2 for i in range(x.shape[1])]
    return outs[-1]


def _last_step_first(x):
    # the first step of `reversed()` has the index `n - 1`, not a constant: a decision
    # on it is not one the example can make for every length
    h = x[:, 0] * 0
    for i in reversed(range(x.shape[1])):
        h = x[:, i] if i == x.shape[1] - 1 else h * 0.5 + x[:, i]
    return h


def _two_offsets(x):
    # step i writes row i - 1, then row i, which step i + 1 writes again first: written
    # after the scan, the second write won over eager's (fuzz_loops seed 49, n = 4)
    h, out = x[:, 0] * 0, torch.zeros_like(x)
    for i in range(1, x.shape[1]):
        out[:, i - 1] = h * 0.5
        h = h + x[:, i]
        out[:, i] = h * 2.0
    return out


def _first_two_stacked(x):
    # a list of the first steps' values only: no value a scan gives (a list shorter than
    # the steps was taken for the whole sequence, its last values for the steps')
    h, outs = x[:, 0] * 0, []
    for i in range(x.shape[1]):
        h = h + x[:, i]
        outs.append(h)
    return torch.stack(outs[:2]), h


def _early_exit(x):
    h = x[:, 0] * 0
    for i in range(x.shape[1]):
        if i >= 3:
            break
        h = h + x[:, i]
    return h


def _reversed_index(x):
    h = x[:, 0] * 0
    for i in range(x.shape[1]):
        h = h * 0.5 + x[:, x.shape[1] - 1 - i]
    return h


def _index_given_to_a_function(x):
    # `torch.full_like(t, i)` takes the index as a fill value: no arithmetic of tensors
    # the body computes from its index as it does `x * (i * 0.5)`
    h = x[:, 0] * 0
    for i in range(x.shape[1]):
        h = h + x[:, i] * torch.full_like(h, i)
    return h


def _last_held_by_a_list_too(x):
    # `y` is also outs[4] on the example: which step a constant index reads, the
    # example cannot tell (`outs[4]` at every length, `outs[-1]`...)
    h, outs = x[:, 0] * 0, []
    for i in range(x.shape[1]):
        h = torch.tanh(h + x[:, i])
        y = h * 3
        outs.append(y)
    return y + outs[4]


def _last_a_view_of_the_state(x):
    # `y` views the state: the write after the loop goes into it
    h = x[:, 0] * 0
    for i in range(x.shape[1]):
        h = h * 0.5 + x[:, i]
        y = h.view(-1)
    y.add_(1)
    return h, y


def _two_steps_back(x):
    a, b = x[:, 0], x[:, 1]
    for i in range(x.shape[1]):
        a, b = b, a + b + x[:, i]
    return b


def _read_while_written(x):
    out = torch.zeros_like(x)
    for t in range(x.shape[1]):
        out[:, t] = x[:, t] + out.sum(1)
    return out


class _Counts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        h = x[:, 0] * 0
        for i in range(x.shape[1]):
            h = h + x[:, i]
            self.calls += 1
        return h * self.calls


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (_Fn(_counter), "the Python value of `n` changes from one step to the next"),
        (_Fn(_exchanged), "`a`, `b` take a tensor from one step to the next"),
        (_Fn(_last), "is used after it"),
        (_Fn(_last_step_first), "a decision on"),
        (_Fn(_first_two_stacked), "is used after it by `stack`"),
        (_Fn(_two_offsets), "at rows of several offsets"),
        (_Fn(_early_exit), "a decision on"),
        (_Fn(_reversed_index), "the index is used by"),
        (_Fn(_index_given_to_a_function), "the index is used by"),
        (_Fn(_last_held_by_a_list_too), "is used after it"),
        (_Fn(_last_a_view_of_the_state), "is used after it by `add_`"),
        (_Fn(_two_steps_back), "2 steps back"),
        (_Fn(_read_while_written), "also read while the loop writes it"),
        (_Counts(), "it assigns `_Counts.calls`"),
    ],
    ids=lambda value: value if isinstance(value, str) and " " not in value else None,
)
def test_loop_that_is_not_a_scan_is_refused_with_its_reason(model, reason):
    with pytest.raises(SpecializationError, match="not a scan") as caught:
        CustomTracer().trace(model, {"x": torch.randn(2, 5, 3)}, dynamic_shapes=DIMS)
    assert reason in str(caught.value), str(caught.value)
    assert "seq == 5" in str(caught.value)


def test_a_loop_unrolled_at_the_end_of_the_trace_needs_a_strict_dim_to_be_static():
    # `outs[-1]` reaches the output without a call the tracer sees: the loop unrolls
    # when the scans are made, after the trace; its length, needed from a dimension
    # declared with torch.export.Dim, raised nothing, and the graph returned the
    # example's last step at every length
    from torch.export import Dim

    from yobx.torch.tracing import StrictDimensionError

    with pytest.raises(StrictDimensionError, match="seq == 5"):
        CustomTracer().trace(
            _Fn(_last), {"x": torch.randn(2, 5, 3)}, dynamic_shapes={"x": {1: Dim("seq")}}
        )


def test_one_step_in_the_example_is_not_enough_to_compare():
    # the example's one step needs `seq == 2`: the loop is captured from another size,
    # where its steps compare, and the scan runs at seq=2 too
    model = Backwards()
    tracer, graph, gm = trace_module(model, {"x": torch.randn(2, 2, 3)}, DIMS)
    # torch.stack needs one step at least: eager's own limit, the example at it
    assert [c.expression for c in tracer.constraints] == ["seq >= 2"]
    assert tracer.versions == [] and _scans(graph) == 1
    for seq in (2, 3, 7):
        x = torch.randn(2, seq, 3)
        assert_same(model(x), gm(x))
    with pytest.raises(SpecializationError, match="at least 2 steps"):
        trace_module(
            model, {"x": torch.randn(2, 2, 3)}, DIMS, tracer_kwargs={"narrowing": "constraints"}
        )


def test_unrolled_loop_with_auto_dimension_is_exact_at_the_example():
    # Dim.AUTO lets the length become static: the unrolled steps, right where they run
    from torch.export import Dim

    model = _Fn(_counter)
    x = torch.randn(2, 5, 3)
    with pytest.warns(UserWarning):
        tracer, graph, gm = trace_module(model, {"x": x}, {"x": {0: "batch", 1: Dim.AUTO}})
    assert _scans(graph) == 0
    assert_same(model(x), gm(x))


def test_tracing_leaves_the_module_and_builtins_as_they_were():
    import builtins

    model = _Counts()
    with pytest.raises(SpecializationError):
        CustomTracer().trace(model, {"x": torch.randn(2, 5, 3)}, dynamic_shapes=DIMS)
    assert model.calls == 0
    assert builtins.range is range and isinstance(range(3), range)
    _check(Recurrence(), constraints=["seq >= 1"])
    assert "range" not in Recurrence.forward.__globals__


# pieces given whole to torch.stack / torch.cat


def _stack_unbind(x):
    return torch.stack(x.unbind(1), -1), torch.stack(x.unbind(0), dim=1)


def _cat_unbind(x):
    return torch.cat(x.unbind(1), 1)


def _cat_split(x):
    joined = torch.cat(x.split(2, 1), 1)
    x.add_(1)  # the join is a new tensor, as torch.cat makes
    return joined, x * len(x.split(2, 1))


@pytest.mark.parametrize("fn", [_stack_unbind, _cat_unbind, _cat_split])
def test_pieces_joined_whole_need_no_count(fn):
    model = _Fn(fn)
    tracer, graph, gm = trace_module(model, {"x": torch.randn(2, 5, 3)}, DIMS)
    assert tracer.constraints == [] and _scans(graph) == 0
    for b, n in [(2, 5), (3, 2), (1, 8)]:
        x = torch.randn(b, n, 3)
        assert_same(model(x.clone()), gm(x.clone()))


def test_pieces_indexed_or_unpacked_keep_their_count():
    def first(x):
        head, *_ = x.unbind(1)
        return head

    with pytest.raises(SpecializationError, match="unbind"):
        CustomTracer().trace(_Fn(first), {"x": torch.randn(2, 5, 3)}, dynamic_shapes=DIMS)


def test_joined_values_are_new_tensors_as_eager_makes():
    # found by the fuzzer (fuzz_tracing seed 712): eager's `cat` is contiguous, so
    # `flatten()` of it is a view that `mul_` writes through; two stacks of the same
    # list are two tensors
    def joins(x):
        h = x[:, :1] * 0
        outs = []
        for piece in x.split(1, dim=1):
            h = h * 0.9 - piece
            outs.append(h)
        joined = torch.cat(outs, 1)
        joined.flatten().mul_(2)
        first, second = torch.stack(outs, 0), torch.stack(outs, 0)
        first.add_(1)
        return joined + 1, second

    model = _Fn(joins)
    tracer, graph, gm = trace_module(model, {"x": torch.randn(2, 5, 3)}, DIMS)
    # `x[:, :1]` has a version for an empty sequence, whose capture failed before
    # (the flatten of an empty tensor): `seq >= 1` was a check where eager runs
    assert _all_scans(gm) == 1 and tracer.constraints == []
    for b, n in [(2, 5), (3, 2), (1, 8), (2, 0)]:
        x = torch.randn(b, n, 3)
        assert_same(model(x.clone()), gm(x.clone()))


class ChunkedRecurrence(torch.nn.Module):
    """Chunked linear attention's shape: the sequence padded to a multiple of the chunk
    size, a state carried from chunk to chunk, the padding cut off at the end."""

    def __init__(self, chunk: int = 4):
        super().__init__()
        self.chunk = chunk

    def forward(self, x):
        batch, seq, width = x.shape
        pad = (self.chunk - seq % self.chunk) % self.chunk
        chunks = torch.nn.functional.pad(x, (0, 0, 0, pad))
        chunks = chunks.reshape(batch, -1, self.chunk, width)
        state = torch.zeros(batch, width)
        out = torch.zeros_like(chunks)
        for i in range((seq + pad) // self.chunk):
            out[:, i] = chunks[:, i].cumsum(1) + state[:, None]
            state = state * 0.5 + chunks[:, i].sum(1)
        out = out.reshape(batch, -1, width)[:, :seq]
        return out.transpose(1, 2).contiguous()


def test_padding_to_a_multiple_keeps_the_chunked_loop_one_scan():
    # `(c - n % c) % c` is written `c*ceil(n/c) - n`: the padded size `n + pad` becomes
    # `c*ceil(n/c)`, the cut `[:, :seq]` needs no minimum, and the loop over the chunks
    # is a scan; left as remainders, the cut size was `Min(seq, 4*((seq + (4 - seq % 4)
    # % 4)//4))`, and the layout questions of `contiguous()` on it (`!= 0`, `> 1`)
    # became constraints no prover could drop, refusing `seq == 1`, which eager runs
    model = ChunkedRecurrence()
    tracer, graph, gm = trace_module(model, {"x": torch.randn(2, 9, 3)}, DIMS)
    assert tracer.constraints == []
    assert _scans(graph) == 1 and tracer.versions == []
    for batch, seq in ((2, 9), (3, 1), (1, 4), (2, 5), (3, 8), (2, 33), (1, 50)):
        x = torch.randn(batch, seq, 3)
        assert_same(model(x), gm(x))
    # an example of one chunk captures the other side from a witness of two or more
    tracer, graph, gm = trace_module(model, {"x": torch.randn(2, 3, 3)}, DIMS)
    assert tracer.constraints == []
    assert [v.when for v in tracer.versions] == [
        "((seq + 3)//4 == 1)",
        "((seq + 3)//4 != 1)",
    ]
    for batch, seq in ((2, 3), (3, 1), (1, 4), (2, 5), (3, 8), (2, 33)):
        x = torch.randn(batch, seq, 3)
        assert_same(model(x), gm(x))


def _decorator_of_another_module():
    """A decorator whose wrapper lives in other globals than the code it wraps (as
    transformers' ``@capture_outputs`` wraps most ``forward`` methods)."""
    namespace: dict = {}
    exec(
        "import functools\n"
        "def decorate(function):\n"
        "    @functools.wraps(function)\n"
        "    def wrapper(*args, **kwargs):\n"
        "        return function(*args, **kwargs)\n"
        "    return wrapper\n",
        namespace,
    )
    return namespace["decorate"]


_decorate = _decorator_of_another_module()


class DecoratedRunningMean(torch.nn.Module):
    """A running mean over the patches of a series (TimesFM 2.5's statistics), in a
    ``forward`` wrapped by a decorator of another module."""

    @_decorate
    def forward(self, x):
        patches = x.view(x.shape[0], -1, 4)
        mean = x.new_zeros(x.shape[0])
        history = []
        for i in range(patches.shape[1]):
            mean = 0.5 * mean + patches[:, i].mean(-1)
            history.append(mean)
        return patches - torch.stack(history, dim=1).unsqueeze(-1), len(history)


def test_a_loop_in_a_decorated_forward_is_a_scan():
    # the builtins (range, len, int, float) are replaced in the globals of the code the
    # decorator wraps, not only in the wrapper's: the loop is a scan, exact at every
    # number of patches; before, `range` received the dimension and fixed it
    model = DecoratedRunningMean()
    assert model.forward.__wrapped__.__globals__ is not model.forward.__globals__
    tracer, graph, gm = trace_module(model, {"x": torch.randn(2, 12)}, DIMS)
    assert _scans(graph) == 1
    # the constraints are the view's own, whole patches, and at least one patch (eager
    # stacks no step at seq = 0: the loop's decision on the number of patches, which
    # the default range settled without a trace until the quotient was judged at 0)
    assert [c.expression for c in tracer.constraints] == ["seq % 4 == 0", "seq/4 >= 1"]
    for batch, length in ((2, 12), (3, 4), (1, 8), (2, 40)):
        x = torch.randn(batch, length)
        assert_same(model(x), gm(x))


def _first_step(x):
    # a decision on the first index: the first step runs apart, before a scan of the
    # others (whose indices are known to be above the first)
    h = x[:, 0] * 0
    for i in range(x.shape[1]):
        h = x[:, i] if i == 0 else h * 0.5 + x[:, i]
    return h


def _first_step_flag(x):
    # a Python flag the first step changes: the steps after it do not change it
    h, first = x[:, 0] * 0, True
    outs = []
    for i in range(x.shape[1]):
        h = h + x[:, i] * (2.0 if first else 0.5)
        first = False
        outs.append(h)
    return torch.cat(outs, 1), len(outs) * h


class ConstantState(torch.nn.Module):
    """A hand-written RNN whose batch is static: its state starts as a constant, which
    the first step computes with in Python (``torch.zeros(1, 4)`` has no node), so that
    it records other operations than the steps after it."""

    def __init__(self):
        super().__init__()
        self.ih, self.hh = torch.nn.Linear(3, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        h = torch.zeros(1, 4)
        outs, buf = [], torch.zeros(x.shape[1] + 1, 4)
        for t in range(x.shape[1]):
            buf[t] = h[0]
            h = torch.tanh(self.ih(x[:, t]) + self.hh(h) * 0.5)
            outs.append(h)
        buf[-1] = h[0]
        return torch.stack(outs, 1), h, buf


class LearnedState(torch.nn.Module):
    """A learned initial state: a parameter the first step reads."""

    def __init__(self):
        super().__init__()
        self.ih, self.h0 = torch.nn.Linear(3, 4), torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        h = self.h0
        for t in range(x.shape[1]):
            h = torch.tanh(self.ih(x[:, t]) + h)
        return h


def _constant_first_value(x):
    # the first step appends a constant (computed from the constant state in Python),
    # the later ones tensors of the graph; `len(outs)` is the sequence's length
    h, outs = torch.zeros(3) + 0.5, []
    for t in range(x.shape[1]):
        outs.append(h * 2.0)
        h = torch.tanh(h + x[0, t] * -1.0)
    return torch.stack(outs), h * len(outs)


def _summed(x):
    # sum() of a generator: 0 + the first slice, then the sum so far + each other one
    return sum(x[:, i] * 2 for i in range(x.shape[1]))


@pytest.mark.parametrize(
    "model, batch",
    [
        (_Fn(_first_step), 2),
        (_Fn(_first_step_flag), 2),
        (_Fn(_summed), 2),
        (_Fn(_constant_first_value), 2),
        (ConstantState(), 1),
        (LearnedState(), 2),
    ],
    ids=["decision", "flag", "sum", "constant-first-value", "constant-state", "learned-state"],
)
def test_a_first_step_that_differs_runs_apart_from_the_scan(model, batch):
    # each refused before: its steps differ from the first (a decision on the index,
    # a Python value, a constant or a parameter where the others read the state)
    tracer, graph, gm = trace_module(model, {"x": torch.randn(batch, 5, 3)}, DIMS)
    assert _all_scans(gm) == 1, graph
    for n in (5, 1, 2, 3, 9):
        x = torch.randn(batch, n, 3)
        assert_same(model(x), gm(x))


def test_a_scan_from_a_parameter_runs_with_autograd():
    # torch's scan traced its body on fake tensors to differentiate it, and failed on
    # the real parameters of the body's submodule: the steps run one after the other
    model = LearnedState()
    _, _, gm = trace_module(model, {"x": torch.randn(2, 5, 3)}, DIMS)
    x = torch.randn(2, 6, 3)
    gm(x).sum().backward()
    expected = torch.autograd.grad(model(x).sum(), [model.h0, model.ih.weight])
    # the parameters of the version where the loop runs (another holds n = 0)
    params = dict(gm.named_parameters())
    got = [next(p for n, p in params.items() if n.endswith(k)).grad for k in ("h0", "ih.weight")]
    for e, g in zip(expected, got):
        torch.testing.assert_close(e, g)


class Chunks(torch.nn.Module):
    """A chunked recurrence over the chunks of a sequence (xLSTM's chunkwise form): each
    step reads its chunk (``x[:, c*k : c*(k + 1)]``) and writes its state into the
    chunk of a buffer; the last state is written after the loop."""

    def forward(self, x):
        c, width = 4, x.shape[2]
        n = x.shape[1] // c
        states = torch.zeros(x.shape[0], (n + 1) * width, width)
        h = torch.zeros(x.shape[0], width, width)
        for k in range(n):
            states[:, k * width : (k + 1) * width] = h
            chunk = x[:, k * c : (k + 1) * c]
            h = h * 0.5 + chunk.transpose(1, 2) @ chunk
        states[:, -width:] = h
        return states, h


class Neighbours(torch.nn.Module):
    """Steps reading and writing at their index plus an offset (``x[i + 1] - x[i]``)."""

    def forward(self, x):
        h = x[0] * 0
        out = torch.zeros_like(x)
        for i in range(x.shape[0] - 1):
            h = h * 0.5 + x[i + 1] - x[i]
            out[i + 1] = h
        return out, h


def test_chunks_at_the_index_are_scanned():
    # the index times the chunk's size was no slice a scan selects: the loop unrolled,
    # a version per number of chunks until the budget, then `n == 7` refused
    model = Chunks()
    tracer, graph, gm = trace_module(model, {"x": torch.randn(2, 16, 3)}, DIMS)
    assert _all_scans(gm) == 1, graph
    for b, n in ((2, 16), (1, 3), (3, 4), (2, 13), (1, 40), (2, 0)):
        x = torch.randn(b, n, 3)
        assert_same(model(x), gm(x))


def test_offsets_of_the_index_are_scanned():
    _scanned_and_exact(Neighbours(), lengths=(4, 1, 2, 7))


class IndexAsNumber(torch.nn.Module):
    """Steps taking their index as a number in tensor operations (``x[i] * (i + 1)``,
    ``h - i``, ``2 * i``), forwards, from one and backwards."""

    def forward(self, x):
        h = torch.zeros_like(x[0])
        outs = []
        for i in range(x.shape[0]):
            h = h * 0.5 + x[i] * (i + 1)
            outs.append(h - i)
        g = x[0] * 0
        for i in reversed(range(1, x.shape[0])):
            g = (g + i) * x[i] + 2 * i
        counts = torch.zeros_like(x[0], dtype=torch.int32)
        for i in range(x.shape[0]):
            counts = counts + i  # stays int32, as with a Python int
        return h, torch.stack(outs), g, counts


class IndexAsNumberFirstApart(torch.nn.Module):
    def forward(self, x):
        total = 0
        for i in range(x.shape[0]):
            total = total + x[i] / (i + 1)
        return total


class NumbersOfTheIndex(torch.nn.Module):
    """Steps taking numbers computed from their index (``i % 2``, ``i // 2``,
    ``i * 0.25``, ``-i``, ``i / 3``) in tensor operations, in float and integer tensors."""

    def forward(self, x):
        h = x[0] * 0
        counts = torch.zeros_like(x[0], dtype=torch.int64)
        for i in range(x.shape[0] - 1):
            h = h * 0.5 + x[i] * (i % 2) + (i // 2) * 0.25 - i / 3
            counts = counts + (-i) + i % 3
        return h, counts


class NumberOfTheIndexSelecting(torch.nn.Module):
    def forward(self, x):
        h = x[0] * 0
        for i in range(x.shape[0]):
            h = h + x[i % 2]
        return h


@pytest.mark.parametrize("model", [IndexAsNumber(), IndexAsNumberFirstApart(), NumbersOfTheIndex()])
def test_the_index_taken_as_a_number_is_scanned(model):
    # refused before ("the index is used by `mul`, not to select one slice"), as
    # torch.export refuses the loop: the body now gets the index as a 0-d tensor
    # (numbers computed from the index, `i % 2`, were refused until the body computed
    # them from its index too)
    _, graph, gm = trace_module(model, {"x": torch.randn(5, 3)}, {"x": {0: "n"}})
    assert _all_scans(gm) == (3 if isinstance(model, IndexAsNumber) else 1), graph
    for n in (5, 1, 2, 3, 8):
        x = torch.randn(n, 3)
        expected, got = model(x), gm(x)
        assert_same(expected, got)
        if isinstance(model, IndexAsNumber):
            assert got[3].dtype == torch.int32


def test_a_number_of_the_index_selecting_a_row_is_no_scan():
    # `x[i % 2]` selects the same rows again: no slice a scan reads
    model = NumberOfTheIndexSelecting()
    with pytest.raises(SpecializationError, match="the index is used by `getitem"):
        trace_module(model, {"x": torch.randn(5, 3)}, {"x": {0: "n"}})


class LastStepValues(torch.nn.Module):
    """Values of the last step used after the loop, held by names the steps set: an
    RNN's last output (``y``), backwards, used by an operation or returned, written in
    place after the loop, or set before the loop too (its value at zero steps)."""

    def forward(self, x):
        h, g = torch.zeros_like(x[0]), x[0] * 0
        before = x.sum(0) + 7
        for i in range(x.shape[0]):
            h = torch.tanh(h * 0.5 + x[i])
            y = h * 2
            before = h - 1
        for i in reversed(range(x.shape[0])):
            g = torch.tanh(g + x[i])
            z = g * x[i]
        y.add_(1)
        return y * 3, z, before


class LastStepValueSetBefore(torch.nn.Module):
    def forward(self, x):
        h, y = x.sum(0), x.sum(0) + 7
        for i in range(x.shape[0]):
            h = torch.tanh(h + x[i])
            y = h - 1
        return y


@pytest.mark.parametrize("model", [LastStepValues(), LastStepValueSetBefore()])
def test_values_of_the_last_step_used_after_the_loop_are_scanned(model):
    # refused before ("`mul_4` of step 4 is used after it by `mul`"), as torch.export
    # refuses the loop: the last of the scan's stacked values, the capture deciding
    # that the loop runs (eager has no `y` without a step, or the one set before)
    tracer, graph, gm = trace_module(model, {"x": torch.randn(5, 3)}, {"x": {0: "n"}})
    assert _all_scans(gm) >= 1, graph
    for n in (5, 1, 2, 8, 0):
        x = torch.randn(n, 3)
        if n == 0 and isinstance(model, LastStepValues):
            with pytest.raises(ConstraintViolationError, match="n >= 1"):
                gm(x)
            continue
        assert_same(model(x.clone()), gm(x.clone()))


def _past_the_end(x):
    # `x[..., 0, t, :]` indexes the axis of 4 after the sequence's: the example's last
    # step reads its row 4, where eager raises an IndexError
    h = x[0, 0] * 0
    for t in range(x.shape[1]):
        h = h * 0.5 + x[..., 0, t, :].sum(0)
    return h


def test_a_loop_reading_past_the_end_on_the_example_is_captured_from_another_size():
    # the scan's slice of the axis failed while the graph was made (a crash); the loop
    # is no scan on the example, and the capture starts again from a size eager runs
    model = _Fn(_past_the_end)
    _, graph, gm = trace_module(model, {"x": torch.randn(3, 5, 4, 2)}, {"x": {1: "n"}})
    assert _scans(graph) == 1
    for n in (1, 2, 4):
        x = torch.randn(3, n, 4, 2)
        assert_same(model(x), gm(x))
    with pytest.raises((IndexError, RuntimeError)):
        gm(torch.randn(3, 5, 4, 2))


class JoinedIfAny(torch.nn.Module):
    """The list of a loop's values tested for truth before it is joined."""

    def forward(self, x):
        h, outs = x.sum(0) * 0, []
        for row in x.unbind(0):
            h = h + row
            outs.append(h * 2)
        stacked = torch.cat(outs) if outs else x.new_zeros(0, 3)
        return stacked, h


def test_a_list_of_the_loop_values_tested_for_truth_is_empty_without_steps():
    # a list's truth is no call the tracer sees: at n = 0 the graph joined zero steps
    # (shape (0,)) where eager took the other branch ((0, 3)); joining decides that the
    # loop runs, and a version captures n = 0
    model = JoinedIfAny()
    _, _, gm = trace_module(model, {"x": torch.randn(4, 3)}, {"x": {0: "n"}})
    for n in (4, 0, 1, 2):
        x = torch.randn(n, 3)
        assert_same(model(x), gm(x))
