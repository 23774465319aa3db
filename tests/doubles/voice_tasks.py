"""Job functions for the voices tests: the real engine (the model in COSYQ_MODEL_DIR) and the
real voice code, called the way the worker's `workers.tasks` job functions call them.

`add_voice` is what `workers.tasks.add_voice` runs; `speak` stands in for the synthesize job's
voice resolution + synthesis (it returns a digest of the samples instead of storing audio).
The engine is loaded once per process and kept (as a worker keeps it).
"""

from __future__ import annotations

import hashlib
from typing import Any

from rq import get_current_job

from shared.settings import load_settings
from shared.storage import open_storage
from shared.voices import VoiceRegistry
from workers.engine_api import SynthesisInput
from workers.pipeline import SynthesisPipeline, load_engine
from workers.voice_profiles import RegisteredVoices
from workers.voice_profiles import add_voice as run_add_voice

_engines: dict[str, SynthesisPipeline] = {}


def _engine() -> SynthesisPipeline:
    settings = load_settings(env_file=None)
    key = str(settings.model_dir)
    if key not in _engines:
        _engines[key] = load_engine(settings)
    return _engines[key]


def _registry() -> VoiceRegistry:
    job = get_current_job()
    if job is None:
        raise RuntimeError("runs only as an RQ job")
    return VoiceRegistry(job.connection)


def add_voice(name: str, prompt_audio: str, transcript: str) -> dict[str, Any]:
    storage = open_storage(load_settings(env_file=None))
    return run_add_voice(
        _engine(), storage, _registry(), name=name, prompt_audio=prompt_audio, transcript=transcript
    )


def speak(voice: str, text: str, seed: int) -> dict[str, Any]:
    engine = _engine()
    prompt = RegisteredVoices(_registry(), engine.identity).resolve(voice)
    out = engine.synthesize(SynthesisInput(text=text, prompt=prompt, seed=seed))
    digest = hashlib.sha256(out.samples.tobytes()).hexdigest()
    return {"samples": int(out.samples.shape[0]), "sha256": digest}
