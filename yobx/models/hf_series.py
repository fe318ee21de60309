"""Inputs of time-series forecasters (the ``time-series`` family of
:mod:`yobx.models.hf_families`).

transformers' forecasters read a window of past values and predict the next ones:

* the probabilistic forecasters (Time Series Transformer, Informer, Autoformer) read
  ``context_length`` values plus as many before them as their largest lag
  (``lags_sequence``), ``past_time_features`` (calendar features, one vector per step),
  ``past_observed_mask``, static features when the configuration has some, and in
  training mode ``future_values`` with their ``future_time_features``: the decoder reads
  those, teacher-forced, so they are inputs of ``forward`` too;
* the patching forecasters (PatchTST, PatchTSMixer) read ``context_length`` steps of
  ``num_input_channels`` series;
* TimesFM reads a window of any length with its padding mask.

The window length is set by the configuration (static); the batch is dynamic, and the
length of a window of free length (TimesFM's) too.
"""

from __future__ import annotations

from typing import Any

import torch


class SeriesInputs:
    """The inputs a forecaster's ``forward`` takes, from its configuration."""

    def __init__(self, config: Any, parameters: set[str]):
        self.parameters = parameters
        self.prediction = int(getattr(config, "prediction_length", None) or 4)
        context = getattr(config, "context_length", None) or self.prediction
        lags = getattr(config, "lags_sequence", None) or [0]
        #: steps read per series: the context and the largest lag before it
        self.history = int(context) + max(lags)
        self.input_size = int(getattr(config, "input_size", None) or 1)
        self.channels = getattr(config, "num_input_channels", None)
        self.time_features = int(getattr(config, "num_time_features", None) or 0)
        self.categorical = int(getattr(config, "num_static_categorical_features", None) or 0)
        self.real = int(getattr(config, "num_static_real_features", None) or 0)
        #: a window of free length (TimesFM): its length is a dimension of its own
        self.free_length = "past_values_padding" in parameters
        #: TimesFM cuts the window in patches: its length is a multiple of theirs
        self.patch = int(getattr(config, "patch_length", None) or 1)

    def sizes(self) -> dict[str, int]:
        sizes = {"batch": 2}
        if self.free_length:
            sizes["steps"] = 2 * self.patch
        return sizes

    def other_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        """One patch more in a window of free length."""
        return {"steps": sizes["steps"] + self.patch} if "steps" in sizes else {}

    def _values(self, batch: int, steps: int) -> tuple[int, ...]:
        if self.channels is not None:
            return (batch, steps, int(self.channels))
        return (batch, steps) if self.input_size == 1 else (batch, steps, self.input_size)

    def make(self, sizes: dict[str, int], generator: torch.Generator) -> dict[str, torch.Tensor]:
        batch = sizes["batch"]
        steps = sizes.get("steps", self.history)
        values = torch.randn(self._values(batch, steps), generator=generator)
        inputs = {"past_values": values}
        wanted = {
            "past_time_features": lambda: torch.randn(
                (batch, steps, self.time_features), generator=generator
            ),
            "past_observed_mask": lambda: torch.ones_like(values),
            "future_values": lambda: torch.randn(
                self._values(batch, self.prediction), generator=generator
            ),
            "future_time_features": lambda: torch.randn(
                (batch, self.prediction, self.time_features), generator=generator
            ),
            "past_values_padding": lambda: torch.zeros((batch, steps)),
            # TimesFM's frequency class of each series (0: high frequency)
            "freq": lambda: torch.zeros((batch, 1), dtype=torch.int64),
        }
        if self.categorical:
            wanted["static_categorical_features"] = lambda: torch.zeros(
                (batch, self.categorical), dtype=torch.int64
            )
        if self.real:
            wanted["static_real_features"] = lambda: torch.randn(
                (batch, self.real), generator=generator
            )
        for name, build in wanted.items():
            if name in self.parameters:
                inputs[name] = build()
        return inputs

    def axes(self) -> dict[str, dict[int, str]]:
        """Every input's batch, and the window's steps where their number is free."""
        names = (
            "past_values",
            "past_time_features",
            "past_observed_mask",
            "future_values",
            "future_time_features",
            "past_values_padding",
            "freq",
            "static_categorical_features",
            "static_real_features",
        )
        axes: dict[str, dict[int, str]] = {name: {0: "batch"} for name in names}
        if self.free_length:
            axes["past_values"] = {0: "batch", 1: "steps"}
            axes["past_values_padding"] = {0: "batch", 1: "steps"}
        return axes
