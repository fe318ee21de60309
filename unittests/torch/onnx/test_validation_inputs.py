"""The caller's own input sets in the validation: for a model whose inputs must agree in
their values (a vision-language model's image tokens and images), the random inputs of
other sizes the validation makes are refused by eager, and only given ones compare the
ONNX model at other sizes."""

from __future__ import annotations

import pytest
import torch

from yobx.torch.onnx import to_onnx

pytest.importorskip("onnxruntime")

IMAGE_TOKEN = 7


class ImageTokens(torch.nn.Module):
    """Each image's features replace the image tokens of its text, as a LLaVA-style
    model does: eager fails when the number of image tokens is not the number of
    feature rows."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 4)
        self.project = torch.nn.Linear(3, 4)

    def forward(self, input_ids, features):
        text = self.embed(input_ids)
        mask = (input_ids == IMAGE_TOKEN).unsqueeze(-1).expand_as(text)
        torch._check(int(mask.sum()) == features.shape[0] * features.shape[1] * 4)
        return text.masked_scatter(mask, self.project(features))


def _inputs(batch, seq, tokens):
    generator = torch.Generator().manual_seed(batch * 100 + seq)
    ids = torch.randint(0, IMAGE_TOKEN, (batch, seq), generator=generator)
    ids[:, 1 : 1 + tokens] = IMAGE_TOKEN
    return {"input_ids": ids, "features": torch.randn(batch, tokens, 3, generator=generator)}


DIMS = {"input_ids": {0: "batch", 1: "seq"}, "features": {0: "batch", 1: "tokens"}}


def test_given_input_sets_are_compared_and_count_as_other_sizes():
    model = ImageTokens().eval()
    example = _inputs(2, 6, 3)
    others = [_inputs(3, 9, 5), _inputs(1, 4, 2)]
    result = to_onnx(model, (), kwargs=example, dynamic_shapes=DIMS, validation_inputs=others)
    report = result.validation
    assert report is not None and report.ok, report.format()
    given = [c for c in report.cases if c.description.startswith("given inputs")]
    assert [c.description for c in given] == ["given inputs 1", "given inputs 2"]
    assert all(not c.skipped and c.error is None for c in given), report.format()
    assert report.max_abs_error < 1e-5
    # the same check after the export, from the result
    again = result.validate(model, (), example, validation_inputs=others[:1])
    assert again.ok, again.format()


def test_without_them_the_random_sizes_cannot_vouch_for_the_model():
    # the random token ids of other sizes hold no image token: eager refuses them, the
    # dynamic dimensions are never compared at another size, and the report says so
    model = ImageTokens().eval()
    result = to_onnx(model, (), kwargs=_inputs(2, 6, 3), dynamic_shapes=DIMS, validate=True)
    report = result.validation
    assert not report.ok
    assert any("never compared at another size" in p for p in report.problems), report.format()
