"""Core ML predictors run by PyTorch: the `Predictor` protocol over our traced graphs.

Linux cannot run Core ML packages, so runtime tests hand `CoreMLFlow`/`CoreMLHiFT` these
instead: same input and output names, numpy in and out, computed by the graph that was (or
would be) converted. They test the runtime's packing, padding, cropping and noise handling.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from workers.coreml.stages import StageSpec


class TorchPredictor:
    """`predict` a stage with the torch graph it is converted from."""

    def __init__(self, graph: nn.Module, spec: StageSpec) -> None:
        self.graph = graph.eval()
        self.spec = spec
        self.calls: list[dict[str, tuple[int, ...]]] = []  # input shapes, per call

    @torch.no_grad()
    def predict(self, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append({name: tuple(value.shape) for name, value in data.items()})
        expected = [tensor.name for tensor in self.spec.inputs]
        if sorted(data) != sorted(expected):
            raise KeyError(f"{self.spec.name}: inputs {sorted(data)} != {sorted(expected)}")
        args = [torch.from_numpy(data[name]) for name in expected]
        outputs = self.graph(*args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return {t.name: out.numpy() for t, out in zip(self.spec.outputs, outputs, strict=True)}
