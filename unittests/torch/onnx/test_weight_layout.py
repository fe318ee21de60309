"""Linear layers read their weights [in, out]: MatMul(x, W) without a Transpose, a Gemm
of a weight as MatMul + Add, what weight-only quantizers look for."""

import io
import json

import numpy as np
import onnx_ir as ir
import onnxruntime
import pytest
import torch

from unittests.torch.onnx._helpers import NestedVersions, export_and_validate
from yobx.torch.onnx import to_onnx
from yobx.torch.onnx.weight_layout import (
    TRANSPOSED_SUFFIX,
    TRANSPOSED_WEIGHTS_KEY,
    TransposedTensor,
    store_weights_transposed,
    transposed_weights,
)
from yobx.torch.onnx.weights import empty_weights, pending_weights


class _Projections(torch.nn.Module):
    """Linear layers on 3-d inputs (MatMul), on 2-d ones with a bias (Gemm), and an
    output projection tied to the embedding (read by a Gather too)."""

    def __init__(self, vocab=20, width=8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.up = torch.nn.Linear(width, 2 * width, bias=False)
        self.down = torch.nn.Linear(2 * width, width)
        self.pool = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        x = x + self.down(torch.relu(self.up(x)))
        pooled = torch.tanh(self.pool(x[:, 0]))
        return self.head(x), pooled


def _ids(batch=2, seq=5):
    return torch.randint(0, 20, (batch, seq), generator=torch.Generator().manual_seed(batch))


SHAPES = {"ids": {0: "batch", 1: "seq"}}


def _readers(model: ir.Model, name: str) -> list[str]:
    value = model.graph.initializers[name]
    return sorted(node.op_type for node, _ in value.uses())


def test_linear_layers_read_their_weights_in_out_and_the_tied_one_keeps_its_layout():
    torch.manual_seed(0)
    model = _Projections().eval()
    result = export_and_validate(model, (), {"ids": _ids()}, SHAPES, min_cases=2)
    graph = result.model.graph
    for name, (rows, columns) in {
        "up.weight": (8, 16),
        "down.weight": (16, 8),
        "pool.weight": (8, 8),
    }.items():
        assert _readers(result.model, name) == ["MatMul"], name
        assert tuple(graph.initializers[name].shape) == (rows, columns)
    # the 2-d linear layer with a bias was a Gemm: MatMul + Add now
    assert not any(node.op_type == "Gemm" for node in graph)
    # the embedding is read by a Gather too: it stays [vocab, width] and transposed
    assert _readers(result.model, "embed.weight") == ["Gather", "Transpose"]
    assert json.loads(result.model.metadata_props[TRANSPOSED_WEIGHTS_KEY]) == [
        "down.weight",
        "pool.weight",
        "up.weight",
    ]
    optimize = next(stage for stage in result.stages if stage.name == "optimize")
    assert optimize.args["weights_transposed"] == 3


def _run(model: ir.Model, ids: torch.Tensor) -> list[np.ndarray]:
    proto = ir.serde.serialize_model(model)
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"ids": ids.numpy()})


def _expected(model: torch.nn.Module, ids: torch.Tensor) -> list[np.ndarray]:
    with torch.no_grad():
        return [t.numpy() for t in model(ids)]


@pytest.mark.parametrize("tied", [False, True])
def test_weights_applied_later_are_transposed_as_the_graph_reads_them(tied, tmp_path):
    # exported on the meta device: the layout is decided without data, and the
    # checkpoint's [out, in] tensors are transposed when read
    torch.manual_seed(1)
    real = _Projections().eval()
    with empty_weights():
        meta = _Projections().eval()
    result = to_onnx(meta, (), {"ids": _ids()}, dynamic_shapes=SHAPES)
    if tied:
        # the tied projection reads a transposed copy, filled from the same tensor
        names = list(result.weight_names.names)
        assert store_weights_transposed(result.model, names, tied=True) == 1
        copy = "embed.weight" + TRANSPOSED_SUFFIX
        assert transposed_weights(result.model)[copy] == "embed.weight"
        assert _readers(result.model, "embed.weight") == ["Gather"]
        assert copy in pending_weights(result.model)
    result.apply_weights(real.state_dict())
    assert not pending_weights(result.model)
    path = tmp_path / "applied.onnx"
    result.save(path, external_data=True)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, seq in [(2, 5), (3, 9)]:
        ids = _ids(batch, seq)
        got = session.run(None, {"ids": ids.numpy()})
        for g, e in zip(got, _expected(real, ids)):
            np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5)


def test_a_transposed_copy_of_real_weights_computes_the_same():
    torch.manual_seed(2)
    model = _Projections().eval()
    result = to_onnx(model, (), {"ids": _ids()}, dynamic_shapes=SHAPES)
    before = _run(result.model, _ids(3, 4))
    assert store_weights_transposed(result.model, list(result.weight_names.names), True) == 1
    assert "Transpose" not in _readers(result.model, "embed.weight")
    for g, e in zip(_run(result.model, _ids(3, 4)), before):
        np.testing.assert_array_equal(g, e)


def test_weights_read_in_nested_versions_keep_their_transpose():
    # onnxruntime prepacks a subgraph's MatMul weight only from the graph just above;
    # deeper, a Transpose inside the subgraph is folded there and prepacked (stored
    # [in, out] at the top, a decode step ran 1.9 times slower)
    torch.manual_seed(0)
    model = NestedVersions().eval()
    x = torch.randn(2, 3, 32)
    nested = export_and_validate(model, (x,), dynamic_shapes=({0: "b", 1: "s"},))
    assert len(nested.versions) == 4
    # a and b one If deep, c two
    assert set(transposed_weights(nested.model)) == {"a.weight", "b.weight"}
    assert _readers(nested.model, "c.weight") == ["Transpose", "Transpose"]
    single = to_onnx(model, (x,), dynamic_shapes=({0: "b", 1: "s"},), narrowing="constraints")
    assert set(transposed_weights(single.model)) == {"b.weight"}


@pytest.mark.parametrize(
    "source",
    [
        ir.tensor(torch.arange(35, dtype=torch.float32).reshape(5, 7)),
        ir.tensor(torch.arange(35, dtype=torch.bfloat16).reshape(5, 7)),
        ir.tensor(np.arange(35, dtype=np.float16).reshape(5, 7)),
    ],
    ids=["float32", "bfloat16", "numpy-float16"],
)
def test_a_transposed_weight_is_written_in_bands_with_the_bytes_of_its_transposition(source):
    expected = np.ascontiguousarray(source.numpy().T)
    transposed = TransposedTensor(source, "w")
    # bands of one and of two rows, and the whole tensor at once
    for band_bytes in (1, 2 * 5 * 4, 1 << 24):
        transposed.BAND_BYTES = band_bytes
        written = io.BytesIO()
        transposed.tofile(written)
        assert written.getvalue() == expected.tobytes()
    assert transposed.tobytes() == expected.tobytes()
    assert list(transposed.shape) == [7, 5]
