"""Factories used by the tests of ``load_model``."""

import torch


def two():
    return torch.nn.Linear(3, 2), (torch.randn(1, 3),)


def not_a_model():
    return "model", ()


def fails():
    raise ValueError("no weights")


def five():
    """A factory giving input sets for the validation besides its example."""
    model = torch.nn.Linear(3, 2)
    dims = {"input": {0: "batch"}}
    return model, (), {"input": torch.randn(2, 3)}, dims, [{"input": torch.randn(5, 3)}]
