"""`EngineOptions.flow_steps`: the torch flow solves in that many Euler steps, the model's 10
otherwise; the same request and seed give the same audio either way, and fewer steps
change it (the option is used, not ignored)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from workers.engine.api import SynthesisInput, VoicePrompt
from workers.engine.pipeline import EngineOptions, SynthesisPipeline, build_engine
from workers.model.directory import ModelDirectory
from workers.model.loader import ModelConfigs


def estimator_calls(engine: SynthesisPipeline, request: SynthesisInput) -> tuple[int, np.ndarray]:
    """(estimator forward calls, samples) of one synthesis."""
    estimator = engine.flow.model.decoder.estimator  # type: ignore[attr-defined]
    calls: list[int] = []
    handle = estimator.register_forward_hook(lambda *_: calls.append(1))
    try:
        samples = engine.synthesize(request).samples
    finally:
        handle.remove()
    return len(calls), samples


def voice_of(engine: SynthesisPipeline, model_dir: Path) -> VoicePrompt:
    samples, rate = soundfile.read(model_dir / "prompt.wav", dtype="float32")
    return engine.extract_voice(samples, int(rate), "a test prompt")


def test_the_flow_solves_in_the_steps_asked_and_is_deterministic(tiny_model_dir: Path) -> None:
    options = EngineOptions(forced_speech_tokens=6)
    model_steps = build_engine(tiny_model_dir, device="cpu", options=options)
    two_steps = build_engine(
        tiny_model_dir, device="cpu", options=dataclasses.replace(options, flow_steps=2)
    )
    voice = voice_of(model_steps, tiny_model_dir)
    request = SynthesisInput(text="Hello there.", prompt=voice, seed=3)
    torch.manual_seed(0)
    calls_10, audio_10 = estimator_calls(model_steps, request)
    calls_2, audio_2 = estimator_calls(two_steps, request)
    _, again_2 = estimator_calls(two_steps, request)
    assert (calls_10, calls_2) == (10, 2)  # one piece: one estimator call per Euler step
    assert np.array_equal(audio_2, again_2)
    assert audio_2.shape == audio_10.shape and not np.array_equal(audio_2, audio_10)


def test_flow_steps_below_one_are_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="flow_steps"):
        EngineOptions(flow_steps=0)
    configs = ModelConfigs.from_directory(ModelDirectory(tiny_model_dir))
    assert configs.with_flow_steps(3).flow.cfm.n_timesteps == 3
    with pytest.raises(ValueError, match="flow steps"):
        configs.with_flow_steps(0)
