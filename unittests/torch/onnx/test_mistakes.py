"""Common mistakes get their cause and their fix (yobx.torch.onnx.mistakes)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from yobx.torch.onnx import OnnxExportError, to_onnx
from yobx.torch.onnx.mistakes import ModelRaisesOnExampleError


class Normalized(torch.nn.Module):
    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.norm(self.linear(x)))


def test_a_model_in_training_mode_is_asked_to_call_eval():
    model = Normalized(dropout=0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"call model.eval\(\)") as info:
        to_onnx(model, (torch.randn(3, 4),))
    assert "BatchNorm1d 'norm' would update its running statistics" in str(info.value)
    assert "Dropout 'drop' would drop values at random" in str(info.value)
    # nothing ran: the statistics are those of the model as it was given
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    # once in eval mode, it exports
    to_onnx(model.eval(), (torch.randn(3, 4),))


def test_a_bare_tensor_is_asked_to_be_a_tuple():
    with pytest.raises(TypeError, match=r"to_onnx\(model, \(x,\)\)"):
        to_onnx(Normalized().eval(), torch.randn(3, 4))


def test_none_positional_inputs_are_none_as_none_keyword_inputs_are():
    x = torch.randn(3, 4)
    result = to_onnx(Normalized().eval(), None, {"x": x}, validate=True)
    assert result.validation.ok and result.input_names == ["x"]


def test_a_numpy_input_is_asked_to_be_converted():
    with pytest.raises(TypeError, match=r"torch.from_numpy") as info:
        to_onnx(Normalized().eval(), (), {"x": np.zeros((3, 4), dtype=np.float32)})
    assert "input 'x'" in str(info.value)


class WithText(torch.nn.Module):
    def forward(self, x):
        return x + 1, "done"


def test_a_string_output_is_named_with_the_fix():
    with pytest.raises(OnnxExportError, match=r"output 'output_1' is a str \('done'\)"):
        to_onnx(WithText(), (torch.randn(3, 4),))


class WrongWidth(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(5, 4)

    def forward(self, x):
        return self.linear(x)


def test_a_model_failing_on_its_example_says_so_without_torch_logs(caplog):
    with caplog.at_level(logging.DEBUG), pytest.raises(ModelRaisesOnExampleError) as info:
        to_onnx(WrongWidth(), (torch.randn(3, 4),))
    message = str(info.value)
    assert message.startswith("the model raises on the example inputs: RuntimeError: ")
    assert "(3x4 and 5x4)" in message
    assert isinstance(info.value.__cause__, RuntimeError)
    # torch's fake tensor traceback is not logged on the way
    assert not [r for r in caplog.records if r.name.startswith("torch._subclasses")]
