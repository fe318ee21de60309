"""Small built-in demo models besides ``tiny-llm``: a CNN, recurrent networks and a
``nn.TransformerEncoder``. Each factory returns ``(model, args, kwargs, dynamic_shapes)``.
"""

from __future__ import annotations

import torch
from torch import nn


def _seeded(factory):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return factory().eval()


class TinyCNN(nn.Module):
    """Convolutions, batch norm, pooling and a classifier head."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
        )
        self.conv1d = nn.Conv1d(16, 16, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Linear(16, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.features(images)
        # A 1-D convolution over the flattened pixels keeps conv1d covered too.
        batch, channels, height, width = x.shape
        x = self.conv1d(x.flatten(2)).view(batch, channels, height, width)
        x = torch.flatten(self.pool(x), 1)
        return torch.log_softmax(self.classifier(x), dim=-1)


def tiny_cnn(batch: int = 2, size: int = 16):
    """The ``tiny-cnn`` demo: images ``[batch, 3, size, size]``, dynamic batch."""
    model = _seeded(TinyCNN)
    # Running statistics different from the defaults make batch norm visible.
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5, generator=generator)
                module.running_var.uniform_(0.5, 1.5, generator=generator)
    images = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))
    return model, (images,), {}, {"images": {0: "batch"}}


class TinyRNN(nn.Module):
    """Embedding, a two-layer recurrent network and a linear head."""

    def __init__(self, cell: str = "lstm", bidirectional: bool = False):
        super().__init__()
        self.embed = nn.Embedding(32, 8)
        rnn_class = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn_class(8, 12, num_layers=2, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(12 * (2 if bidirectional else 1), 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        output, _ = self.rnn(self.embed(tokens))
        return self.head(output)


def tiny_lstm(batch: int = 2, seq: int = 5):
    """The ``tiny-lstm`` demo: token ids ``[batch, seq]``, dynamic batch and sequence."""
    model = _seeded(lambda: TinyRNN("lstm"))
    tokens = torch.randint(0, 32, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, (tokens,), {}, {"tokens": {0: "batch", 1: "seq"}}


def tiny_gru(batch: int = 2, seq: int = 5):
    """The ``tiny-gru`` demo: a bidirectional GRU, dynamic batch and sequence."""
    model = _seeded(lambda: TinyRNN("gru", bidirectional=True))
    tokens = torch.randint(0, 32, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, (tokens,), {}, {"tokens": {0: "batch", 1: "seq"}}


def transformer_encoder(batch: int = 2, seq: int = 5):
    """The ``transformer-encoder`` demo: ``nn.TransformerEncoder`` on ``[batch, seq, 16]``."""

    def make():
        layer = nn.TransformerEncoderLayer(
            d_model=16, nhead=2, dim_feedforward=32, batch_first=True, dropout=0.1
        )
        return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    model = _seeded(make)
    x = torch.randn(batch, seq, 16, generator=torch.Generator().manual_seed(1))
    return model, (x,), {}, {"src": {0: "batch", 1: "seq"}}
