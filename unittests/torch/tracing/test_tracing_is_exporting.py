"""Never narrow, item 2: code asking whether it is exported gets the answer that keeps
the graph exact at every size (``torch.compiler.is_exporting()`` True,
``is_compiling()`` and ``torch.jit.is_tracing()`` False), in the model's code and the
tracing thread only."""

import threading

import pytest
import torch
from transformers.utils import is_torchdynamo_compiling, is_torchdynamo_exporting

from ._helpers import assert_same, trace_module


class TriangularSolve(torch.nn.Module):
    """The gated delta-net pattern (Qwen3-Next, Qwen3.5): ``solve_triangular`` eagerly,
    whose fake kernel refuses symbolic batch sizes, a forward substitution over the
    static chunk when exported."""

    def forward(self, a, b):
        lower = torch.tril(a) + 4 * torch.eye(a.shape[-1])
        if not is_torchdynamo_exporting():
            return torch.linalg.solve_triangular(lower, b, upper=False)
        rows = []
        for i in range(lower.shape[-1]):
            done = sum(lower[..., i, j : j + 1, None] * rows[j] for j in range(i)) if i else 0
            rows.append((b[..., i : i + 1, :] - done) / lower[..., i, i : i + 1, None])
        return torch.cat(rows, dim=-2)


def test_models_take_their_export_path():
    model = TriangularSolve()
    inputs = {"a": torch.randn(2, 3, 4, 4), "b": torch.randn(2, 3, 4, 2)}
    dims = {"a": {0: "batch", 1: "heads"}, "b": {0: "batch", 1: "heads"}}
    _, graph, gm = trace_module(model, inputs, dims)
    targets = {getattr(n.target, "__name__", n.target) for n in graph.nodes}
    assert "linalg_solve_triangular" not in targets and "solve_triangular" not in targets
    for batch, heads in [(2, 3), (5, 1), (1, 7)]:
        a, b = torch.randn(batch, heads, 4, 4), torch.randn(batch, heads, 4, 2)
        assert_same(model(a, b), gm(a, b))


def test_the_answers_hold_in_the_tracing_thread_only():
    seen = {}

    class Asks(torch.nn.Module):
        def forward(self, x):
            other = threading.Thread(
                target=lambda: seen.update(other=torch.compiler.is_exporting())
            )
            other.start()
            other.join()
            seen["exporting"] = torch.compiler.is_exporting()
            seen["compiling"] = torch.compiler.is_compiling() or is_torchdynamo_compiling()
            seen["jit"] = torch.jit.is_tracing() or torch.jit.is_scripting()
            seen["fx"] = torch.fx._symbolic_trace.is_fx_symbolic_tracing()
            return x * 2 if torch.compiler.is_exporting() else x * 3

    model = Asks()
    _, _, gm = trace_module(model, {"x": torch.randn(3)}, {"x": {0: "n"}})
    assert seen == {"other": False, "exporting": True, "compiling": False, "jit": False, "fx": True}
    # after the trace, and when the graph runs, torch answers as usual
    assert not torch.compiler.is_exporting() and not torch.compiler.is_compiling()
    assert torch.equal(gm(torch.ones(5)), torch.full((5,), 2.0))


class MarksItsCounter(torch.nn.Module):
    """The pattern of FalconH1's cache: a counter made on the first call, marked for
    torch.compile when not compiling (a trace does not compile), then counted on."""

    def forward(self, x):
        counter = x.new_zeros(())
        if not is_torchdynamo_compiling():
            torch._dynamo.mark_static_address(counter)
            torch._dynamo.mark_dynamic(x, 0)
        counter.add_(x.shape[0])
        return x * counter


def test_torch_compile_marks_of_a_traced_tensor_are_no_ops():
    import torch._dynamo

    originals = [getattr(torch._dynamo, n) for n in ("mark_static_address", "mark_dynamic")]
    model = MarksItsCounter()
    _, _, gm = trace_module(model, {"x": torch.randn(3, 2)}, {"x": {0: "n"}})
    for rows in (3, 5, 1):
        x = torch.randn(rows, 2)
        assert_same(model(x), gm(x))
    assert [getattr(torch._dynamo, n) for n in ("mark_static_address", "mark_dynamic")] == originals
    # outside a trace, and for a real tensor, torch's marks as usual
    with pytest.raises(TypeError, match="expects a tensor"):
        torch._dynamo.mark_static_address(3)
