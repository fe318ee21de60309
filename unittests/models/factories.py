"""Factories used by the tests of ``load_model``."""

import torch


def two():
    return torch.nn.Linear(3, 2), (torch.randn(1, 3),)


def not_a_model():
    return "model", ()


def fails():
    raise ValueError("no weights")
