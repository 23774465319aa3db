"""Core ML predictors run by PyTorch: the `Predictor` protocol over our traced graphs.

Linux cannot run Core ML packages, so runtime tests hand `CoreMLFlow`/`CoreMLHiFT` these
instead: same input and output names, numpy in and out, computed by the graph that was (or
would be) converted. They test the runtime's packing, padding, cropping and noise handling.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from workers.coreml.convert.llm_graph import StatefulLLMGraph
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


class TorchStatefulPredictor:
    """One function of the stateful LLM package, run by the graph it is converted from.

    A "state" is a dict of cache tensors (zeros, as Core ML's `make_state` gives); `predict`
    loads it into the graph's buffers, runs, and stores the updated buffers back, so two
    requests with two states never see each other's keys and values.
    """

    def __init__(self, graph: StatefulLLMGraph, spec: StageSpec) -> None:
        self.graph = graph.eval()
        self.spec = spec
        self.calls = 0

    def make_state(self) -> dict[str, torch.Tensor]:
        return {name: torch.zeros_like(buffer) for name, buffer in self._buffers().items()}

    def _buffers(self) -> dict[str, torch.Tensor]:
        return {"k_cache": self.graph.k_cache, "v_cache": self.graph.v_cache}

    @torch.no_grad()
    def predict(
        self, data: dict[str, np.ndarray], state: dict[str, torch.Tensor] | None = None
    ) -> dict[str, np.ndarray]:
        if state is None:
            raise ValueError(f"{self.spec.name}: a stateful function needs a state")
        for tensor in self.spec.inputs:
            fixed = [d for d in tensor.shape if isinstance(d, int)]
            got = [d for d, s in zip(data[tensor.name].shape, tensor.shape, strict=True)
                   if isinstance(s, int)]  # fmt: skip
            if got != fixed:
                raise ValueError(
                    f"{tensor.name}: shape {data[tensor.name].shape} != {tensor.shape}"
                )
        self.calls += 1
        for name, buffer in self._buffers().items():
            buffer.copy_(state[name])
        logits = self.graph(*(torch.from_numpy(data[t.name]) for t in self.spec.inputs))
        for name, buffer in self._buffers().items():
            state[name].copy_(buffer)
        return {"logits": logits.numpy()}


class RecordingPredictor:
    """Any predictor, with the input shapes of every call recorded (which batch size ran)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[dict[str, tuple[int, ...]]] = []

    def predict(self, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append({name: tuple(value.shape) for name, value in data.items()})
        return self.inner.predict(data)  # type: ignore[no-any-return]
