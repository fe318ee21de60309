"""Checks on tensor values in ONNX: onnxruntime fails, naming the check, where eager
raises, including inside a version, with either optimization level.

PYTEST_DONT_REWRITE: the model's ``assert`` must stay Python's.
"""

import numpy as np
import onnxruntime
import pytest
import torch

from yobx.torch.onnx import to_onnx


class Lengths(torch.nn.Module):
    def forward(self, x, lengths):
        assert lengths.max() <= x.shape[1], "too long"
        torch._check(lengths.min().item() >= 0)
        if x.shape[1] > 8:
            return x[:, :2] * lengths[:, None], lengths > 1
        return x[:, :1] * lengths[:, None], lengths > 1


def _session(result) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(
        result.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@pytest.mark.parametrize("optimize", ["default", "ort"])
def test_value_checks_fail_in_onnxruntime_naming_the_check(optimize):
    model = Lengths()
    result = to_onnx(
        model,
        (torch.randn(2, 5), torch.tensor([3, 4])),
        dynamic_shapes=({0: "b", 1: "s"}, {0: "b"}),
        validate=True,
        optimize=optimize,
    )
    assert result.validation.ok, result.validation.format()
    names = [n.name for n in result.model_proto.graph.node]
    names += [n.name for g in _subgraphs(result.model_proto.graph) for n in g.node]
    assert any("yobx check failed: assert lengths.max() <= x.shape[1]" in n for n in names)
    session = _session(result)
    for s, lengths in [(6, [1, 2, 6]), (12, [1, 12, 3])]:
        x, lengths = torch.randn(3, s), torch.tensor(lengths)
        got = session.run(None, {"x": x.numpy(), "lengths": lengths.numpy()})
        expected = model(x, lengths)
        np.testing.assert_allclose(got[0], expected[0].numpy())
        np.testing.assert_array_equal(got[1], expected[1].numpy())
    for s, lengths, check in [
        (6, [1, 2, 7], "too long|lengths.max"),
        (12, [13, 1, 1], "too long|lengths.max"),
        (6, [1, -2, 3], "lengths.min"),
    ]:
        x, lengths = torch.randn(3, s), torch.tensor(lengths)
        with pytest.raises((AssertionError, RuntimeError)):
            model(x, lengths)
        with pytest.raises(Exception, match=f"yobx check failed: .*({check})"):
            session.run(None, {"x": x.numpy(), "lengths": lengths.numpy()})


def _subgraphs(graph):
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.g is not None and attribute.g.node:
                yield attribute.g
                yield from _subgraphs(attribute.g)


def test_no_runtime_checks_means_no_value_checks_either():
    result = to_onnx(
        Lengths(),
        (torch.randn(2, 5), torch.tensor([3, 4])),
        dynamic_shapes=({0: "b", 1: "s"}, {0: "b"}),
        runtime_checks=False,
    )
    assert not any("yobx check failed" in n.name for n in result.model_proto.graph.node)
    got = _session(result).run(
        None, {"x": np.random.randn(3, 6).astype(np.float32), "lengths": np.array([1, 2, 7])}
    )
    assert got[0].shape == (3, 1)
