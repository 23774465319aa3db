"""Device and dtype choice, no-copy loading, and the engine on accelerators where present."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from shared.errors import ModelLoadError
from workers.engine import devices
from workers.engine.api import SynthesisInput
from workers.engine.pipeline import build_engine
from workers.model.checkpoint import read_state_dict
from workers.model.directory import ModelDirectory
from workers.model.flow.model import build_flow
from workers.model.llm.model import build_llm
from workers.model.loader import ModelConfigs

MPS = torch.backends.mps.is_available()
CUDA = torch.cuda.is_available()


def test_auto_prefers_mps_then_cuda_then_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "mps_available", lambda: True)
    monkeypatch.setattr(devices, "cuda_available", lambda: True)
    assert devices.resolve_device("auto") == torch.device("mps")
    monkeypatch.setattr(devices, "mps_available", lambda: False)
    assert devices.resolve_device("auto") == torch.device("cuda")
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert devices.resolve_device("cpu") == torch.device("cpu")


def test_missing_devices_are_start_up_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "mps_available", lambda: False)
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    with pytest.raises(
        ModelLoadError, match="COSYQ_DEVICE=mps: mps is not available on this machine"
    ):
        devices.resolve_device("mps")
    with pytest.raises(
        ModelLoadError,
        match=r"COSYQ_DEVICE=cuda: cuda is not available on this machine \(available: cpu\)",
    ):
        devices.resolve_device("cuda")
    with pytest.raises(ModelLoadError, match="COSYQ_DEVICE=gpu: not a torch device"):
        devices.resolve_device("gpu")
    with pytest.raises(ModelLoadError, match="COSYQ_DTYPE=fp64: use one of fp32, fp16, bf16"):
        devices.resolve_dtype("fp64")
    assert devices.resolve_dtype("bf16") is torch.bfloat16
    with pytest.raises(ModelLoadError, match="COSYQ_DEVICE=cuda:1: cuda is not available"):
        devices.resolve_device("cuda:1", available={"cpu"})
    assert devices.resolve_device("cuda:1", available={"cpu", "cuda"}) == torch.device("cuda:1")


def test_cpu_fp32_loading_keeps_the_mapped_weights(tiny_model_dir: Path) -> None:
    """mmap + assign: parameters ARE the checkpoint's tensors (no second copy in memory)."""
    directory = ModelDirectory(tiny_model_dir)
    configs = ModelConfigs.from_directory(directory)
    llm_state = read_state_dict(directory.checkpoint("llm"))
    llm = build_llm(configs.llm, llm_state, source="llm.pt")
    key = "llm.model.model.layers.0.mlp.up_proj.weight"
    assert llm.backbone.layers[0].mlp.up_proj.weight.data_ptr() == llm_state[key].data_ptr()
    flow_state = read_state_dict(directory.checkpoint("flow"))
    flow = build_flow(configs.flow, flow_state)
    assert flow.input_embedding.weight.data_ptr() == flow_state["input_embedding.weight"].data_ptr()


def _engine_runs_on(device: str, tiny_model_dir: Path) -> None:
    engine = build_engine(tiny_model_dir, device=device)
    assert engine.identity.device.startswith(device)
    prompt = engine.extract_voice(
        (0.3 * np.sin(np.arange(24000) / 24000 * 2 * np.pi * 150)).astype(np.float32), 24000, "Hi."
    )
    request = SynthesisInput(text="Hello there.", prompt=prompt, seed=5)
    first, again = engine.synthesize(request), engine.synthesize(request)
    assert first.speech_tokens > 0 and np.isfinite(first.samples).all()
    assert np.array_equal(first.samples, again.samples)


@pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")
def test_engine_on_cuda(tiny_model_dir: Path) -> None:
    _engine_runs_on("cuda", tiny_model_dir)


@pytest.mark.macos
@pytest.mark.skipif(not MPS, reason="no MPS device (Apple silicon with macOS) on this machine")
def test_engine_on_mps(tiny_model_dir: Path) -> None:
    _engine_runs_on("mps", tiny_model_dir)
