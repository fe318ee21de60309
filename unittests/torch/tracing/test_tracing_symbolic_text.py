"""Text of symbolic dimensions and shapes (issue 11, item 6).

``str()``/``repr()``/``format()`` of a dimension or a shape give readable text for
messages, in the user's names and without any constraint; a value computed from that
text is never baked silently: the dimension is fixed to its example (``Dim.AUTO``), or
the trace raises naming the line (a dimension declared dynamic).
"""

import logging
import warnings

import pytest
import torch
from torch.export import Dim

from yobx.torch.tracing import (
    ConstraintViolationError,
    CustomTracer,
    SpecializationError,
    StrictDimensionError,
)
from yobx.torch.tracing.symbolic.symbolic_text import SymbolicText

from ._helpers import check_trace

LOGGER = logging.getLogger("yobx.test.symbolic_text")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


class Messages(torch.nn.Module):
    """Every usual way of putting a size into a message."""

    def forward(self, x):
        n, d = x.shape[0], x.shape[1]
        LOGGER.warning(f"input {x.shape} with n={n} and {n:>7} rows, {n * 2} halves")
        LOGGER.warning("lazy %s %r %s", n, x.shape, d)
        warnings.warn(str(x.shape), stacklevel=1)
        text = str(n)
        LOGGER.warning("n=" + text + "!" + " %s" % text + " " + text.upper() + f" {text:>6}")  # noqa: UP031
        if x.shape[0] > 100:
            raise ValueError(f"too many rows: {n}")
        return x * 2


def test_messages_show_the_expression_and_cost_nothing():
    records = _Records()
    LOGGER.addHandler(records)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tracer, _, _ = check_trace(
                Messages(),
                {"x": torch.randn(3, 4)},
                {"x": {0: "batch"}},
                other_inputs=[{"x": torch.randn(6, 4)}],
            )
    finally:
        LOGGER.removeHandler(records)
    traced = records.messages[:3]
    assert traced == [
        "input torch.Size([batch, 4]) with n=batch and   batch rows, 2*batch halves",
        "lazy batch torch.Size([batch, 4]) 4",
        "n=batch! batch BATCH  batch",
    ]
    assert next(str(w.message) for w in caught if "torch.Size" in str(w.message)) == (
        "torch.Size([batch, 4])"
    )
    assert [c.expression for c in tracer.constraints] == ["batch <= 100"]
    assert not [g for g in tracer.guards if "== 3" in g.expression]


def test_text_of_static_dimensions_is_the_usual_one():
    class Model(torch.nn.Module):
        def forward(self, x):
            assert str(x.shape) == "torch.Size([3, 4])" and f"{x.shape[1]:03d}" == "004"
            assert str(x.shape[1:]) == "torch.Size([4])"
            return x + 1

    tracer, _, _ = check_trace(Model(), {"x": torch.randn(3, 4)})
    assert tracer.constraints == []


class EqualsLiteral(torch.nn.Module):
    def forward(self, x):
        return x + 1 if str(x.shape[0]) == "3" else x - 1


class ParsesText(torch.nn.Module):
    def forward(self, x):
        return x * int(str(x.shape[0]))


class LengthOfText(torch.nn.Module):
    def forward(self, x):
        return x * len(f"{x.shape[0]}")


class SearchesShape(torch.nn.Module):
    def forward(self, x):
        return x + 1 if "3" in str(x.shape) else x - 1


class TextMethod(torch.nn.Module):
    def forward(self, x):
        return x + 1 if str(x.shape[0]).strip().isdigit() else x - 1


class FloatOfText(torch.nn.Module):
    def forward(self, x):
        return x * float(format(x.shape[0], "d"))


class IndexesText(torch.nn.Module):
    def forward(self, x):
        return x + 1 if repr(x.shape[0])[0] == "3" else x - 1


VALUE_USES = [EqualsLiteral, ParsesText, LengthOfText, SearchesShape, TextMethod]
VALUE_USES += [FloatOfText, IndexesText]


def _line_of(model_class) -> str:
    code = model_class.forward.__code__
    return f"{code.co_filename}:{code.co_firstlineno + 1}"


@pytest.mark.parametrize("model_class", VALUE_USES, ids=lambda c: c.__name__)
def test_value_from_text_of_dynamic_dimension_raises_naming_the_line(model_class):
    with pytest.raises(SpecializationError) as info:
        CustomTracer().trace(
            model_class(),
            concrete_args={"x": torch.randn(3, 4)},
            dynamic_shapes={"x": {0: "batch"}},
        )
    assert info.value.location == _line_of(model_class)
    assert str(info.value).startswith(_line_of(model_class))
    assert "batch == 3" in str(info.value) and "on the text of `batch`" in str(info.value)


@pytest.mark.parametrize("model_class", VALUE_USES, ids=lambda c: c.__name__)
def test_value_from_text_of_auto_dimension_makes_it_static(model_class):
    x = torch.randn(3, 4)
    tracer = CustomTracer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = tracer.trace(
            model_class(), concrete_args={"x": x}, dynamic_shapes={"x": {0: Dim.AUTO}}
        )
    assert any("becomes static" in str(w.message) for w in caught)
    assert [(c.expression, c.kind) for c in tracer.constraints] == [("x_dim_0 == 3", "value")]
    assert tracer.constraints[0].location == _line_of(model_class)
    gm = torch.fx.GraphModule(tracer.traced_model, graph)
    torch.testing.assert_close(gm(x), model_class()(x))
    with pytest.raises(ConstraintViolationError, match="x_dim_0 == 3"):
        gm(torch.randn(5, 4))


def test_value_from_text_of_named_dim_needs_a_declaration():
    with pytest.raises(StrictDimensionError, match="n == 3"):
        CustomTracer().trace(
            ParsesText(),
            concrete_args={"x": torch.randn(3, 4)},
            dynamic_shapes={"x": {0: Dim("n")}},
        )


class ShapeCache(torch.nn.Module):
    """A cache keyed by the text of the shape, compared with the same text."""

    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x, y):
        key = str(x.shape)
        if key not in self.cache:
            self.cache[key] = torch.ones(x.shape[0], 1)
        same = str(x.shape[0]) == f"{y.shape[0]}"
        return x * self.cache[str(x.shape)] + y * (2 if same else 3)


def test_same_symbolic_text_compares_and_hashes_without_constraint():
    tracer, _, _ = check_trace(
        ShapeCache(),
        {"x": torch.randn(3, 4), "y": torch.randn(3, 4)},
        {"x": {0: "batch"}, "y": {0: "batch"}},
        other_inputs=[{"x": torch.randn(5, 4), "y": torch.randn(5, 4)}],
    )
    assert tracer.constraints == []


def test_several_dimensions_render_in_user_names():
    seen = []

    class Model(torch.nn.Module):
        def forward(self, x):
            h, w = x.shape[1], x.shape[2]
            seen.extend([str(x.shape), f"{h}x{w}", repr(h * w), format(h + 1, "^9")])
            return x.flatten(1)

    tracer, _, _ = check_trace(
        Model(),
        {"x": torch.randn(2, 3, 5)},
        {"x": {1: "h", 2: "w"}},
        other_inputs=[{"x": torch.randn(2, 4, 6)}],
    )
    # the trace's texts come first (check_trace then runs the model eagerly); an
    # f-string of several parts is a plain str (Python joins them in C)
    assert seen[:4] == ["torch.Size([2, h, w])", "hxw", "h*w", "  h + 1  "]
    assert [type(t) for t in seen[:4]] == [SymbolicText, str, SymbolicText, SymbolicText]
    # eagerly, the usual texts
    assert seen[4:8] == ["torch.Size([2, 3, 5])", "3x5", "15", "    4    "]
    assert tracer.constraints == []


def test_text_outlives_the_trace_as_plain_text():
    kept = []

    class Model(torch.nn.Module):
        def forward(self, x):
            kept.append(str(x.shape))
            return x + 1

    CustomTracer().trace(
        Model(), concrete_args={"x": torch.randn(3, 4)}, dynamic_shapes={"x": {0: "batch"}}
    )
    (text,) = kept
    # no trace to decide anything any more: it is the text it shows
    assert text == "torch.Size([batch, 4])" and len(text) == 22 and text[12:17] == "batch"
    assert text.split("[")[1] == "batch, 4])"
