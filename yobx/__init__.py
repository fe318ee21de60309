"""yobx: capture PyTorch models as clean torch.fx graphs and export them to ONNX."""

__version__ = "0.1.0"
