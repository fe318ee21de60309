"""Real models: Hugging Face transformers (tiny random configs), TransformerEncoder, CNN."""

import pytest
import torch
from torch.export import Dim
from torch.fx.proxy import TraceError

from yobx.torch.tracing import ConstraintViolationError

from ._helpers import check_trace, trace_module

transformers = pytest.importorskip("transformers")

SIZES = [(3, 5), (4, 11)]


def _text_inputs(batch, seq):
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, -2:] = 0
    return {"input_ids": torch.randint(0, 100, (batch, seq)), "attention_mask": mask}


def _text_dynamic_shapes(seq=None):
    seq = seq or "seq"
    return {"input_ids": {0: "batch", 1: seq}, "attention_mask": {0: "batch", 1: seq}}


def _check_text_model(model, seq=None):
    tracer, graph, gm = check_trace(
        model.eval(),
        _text_inputs(2, 7),
        _text_dynamic_shapes(seq),
        other_inputs=[_text_inputs(b, s) for b, s in SIZES],
    )
    placeholders = [n.name for n in graph.nodes if n.op == "placeholder"]
    assert placeholders == ["input_ids", "attention_mask"]
    assert set(tracer.dimension_names.values()) == {"batch", "seq"}
    return tracer, graph


def test_llama_for_causal_lm():
    config = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=100,
    )
    _check_text_model(transformers.LlamaForCausalLM(config))


def test_gpt2_lm_head_model():
    config = transformers.GPT2Config(
        n_embd=32,
        n_layer=2,
        n_head=4,
        vocab_size=100,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    _check_text_model(transformers.GPT2LMHeadModel(config))


def _bert():
    config = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=100,
    )
    return transformers.BertModel(config).eval()


def test_bert_model():
    # BERT slices a buffer of 512 positions: the sequence must be declared <= 512.
    _check_text_model(_bert(), seq=Dim("seq", max=512))


def test_bert_model_unbounded_sequence_adopts_the_bound():
    # the 512 positions of the buffer bound the sequence: adopted, reported, checked
    tracer, _ = _check_text_model(_bert())
    assert ("seq <= 512", "range") in [(c.expression, c.kind) for c in tracer.constraints]
    assert tracer.range_constraints["seq"] == (2, 512)


def test_bert_model_unbounded_named_sequence_is_refused_with_the_fix():
    with pytest.raises(TraceError, match=r'Dim\("seq", max=512\)'):
        trace_module(_bert(), _text_inputs(2, 7), _text_dynamic_shapes(Dim("seq")))


def test_transformer_encoder():
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    check_trace(
        model,
        {"src": torch.randn(2, 7, 32)},
        {"src": {0: "batch", 1: "seq"}},
        other_inputs=[{"src": torch.randn(3, 5, 32)}, {"src": torch.randn(5, 9, 32)}],
    )


class SmallCnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1),
            torch.nn.ReLU(),
        )
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        y = self.features(x)
        y = torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        return self.head(y).softmax(-1)


def test_small_cnn():
    check_trace(
        SmallCnn().eval(),
        {"x": torch.randn(2, 3, 16, 16)},
        {"x": {0: "batch"}},
        other_inputs=[{"x": torch.randn(5, 3, 16, 16)}, {"x": torch.randn(3, 3, 16, 16)}],
    )


class Recurrent(torch.nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(4, 5, num_layers=2, batch_first=True, bidirectional=True)

    def forward(self, x):
        output, state = self.rnn(x)
        return output.sum(-1), state


@pytest.mark.parametrize("cell", [torch.nn.LSTM, torch.nn.GRU])
def test_recurrent_leaves_keep_dynamic_sizes(cell):
    tracer, graph, _ = check_trace(
        Recurrent(cell).eval(),
        {"x": torch.randn(2, 7, 4)},
        {"x": {0: "batch", 1: "seq"}},
        other_inputs=[{"x": torch.randn(3, 11, 4)}, {"x": torch.randn(5, 2, 4)}],
    )
    rnn = next(n for n in graph.nodes if n.op == "call_module")
    output = rnn.meta["val"][0]
    assert tracer.dims.render(output.shape[0]) == "batch"
    assert tracer.dims.render(output.shape[1]) == "seq"
    assert tracer.guards == []


class Pooling1d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 6, 3, padding=1)
        self.pool = torch.nn.MaxPool1d(3, 2)

    def forward(self, x):
        y = torch.nn.functional.max_pool1d(self.conv(x), 2, ceil_mode=True)
        return self.pool(y), torch.nn.functional.avg_pool1d(y, 2)


def test_pooling_1d_keeps_length_symbolic():
    # MaxPool1d(3, 2) on ceil(length / 2) needs an input of at least 3, which short
    # lengths do not give: the length must be declared >= 5 to be provable.
    dyn = {"x": {0: "batch", 2: Dim("length", min=5)}}
    tracer, graph, _ = check_trace(
        Pooling1d().eval(),
        {"x": torch.randn(2, 4, 16)},
        dyn,
        other_inputs=[{"x": torch.randn(3, 4, 29)}, {"x": torch.randn(1, 4, 5)}],
    )
    pool = next(n for n in graph.nodes if n.op == "call_module" and n.target == "pool")
    assert "length" in tracer.dims.render(pool.meta["val"].shape[-1])
    assert tracer.constraints == []
    with pytest.raises(TraceError, match="length"):
        trace_module(
            Pooling1d().eval(), {"x": torch.randn(2, 4, 16)}, {"x": {0: "batch", 2: Dim("length")}}
        )
    # a string name adopts the bound the pooling needs, and the graph checks it
    tracer, _, gm = check_trace(
        Pooling1d().eval(),
        {"x": torch.randn(2, 4, 16)},
        {"x": {0: "batch", 2: "length"}},
        other_inputs=[{"x": torch.randn(3, 4, 29)}],
    )
    assert [c.kind for c in tracer.constraints] == ["range"]
    with pytest.raises(ConstraintViolationError, match="length"):
        gm(torch.randn(2, 4, 3))


class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, grad):
        return grad


class AlibiAttention(torch.nn.Module):
    """BLOOM's pattern: an autograd.Function and baddbmm on a broadcast bias."""

    def forward(self, query, key, bias):
        scores = bias.baddbmm(batch1=query, batch2=key.transpose(-1, -2), beta=1.0, alpha=0.5)
        both = torch.baddbmm(scores, query, key.transpose(-1, -2), beta=0.0)
        return _Gelu.apply(scores) + both


def _alibi_inputs(batch, seq):
    return {
        "query": torch.randn(batch, seq, 8),
        "key": torch.randn(batch, seq, 8),
        "bias": torch.randn(batch, 1, seq),
    }


def test_autograd_function_and_baddbmm_with_dynamic_sizes():
    dims = {0: "batch", 1: "seq"}
    tracer, graph, _ = check_trace(
        AlibiAttention(),
        _alibi_inputs(2, 5),
        {"query": dims, "key": dims, "bias": {0: "batch", 2: "seq"}},
        other_inputs=[_alibi_inputs(3, 7), _alibi_inputs(4, 2)],
    )
    # the Function's forward is traced through: its operations are in the graph
    assert any(n.target is torch.tanh for n in graph.nodes)
    assert tracer.guards == []
    # the patched baddbmm only lives inside tracing
    assert "baddbmm" not in vars(torch.Tensor)
