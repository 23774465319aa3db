"""Test engines: the SynthesisEngine Protocol with behaviour scripted by the request text.

Workers in the tests load one of these through `COSYQ_ENGINE=tests.doubles.engines:<factory>`.
The text carries directives (words with a colon) that the engine obeys before returning a
short sine, so one worker can be made slow, leaky, transiently failing or dead per job:

    sleep:<s>        sleep before answering           kill            SIGKILL this process
    leak:<MiB>       allocate and keep memory          exit:<code>     os._exit(code) mid-job
    transient:<path> TransientError unless <path> exists (then creates it: fails once)
    invalid          InvalidRequestError               boom            RuntimeError (a bug)
    seconds:<s>      length of the returned audio (default 0.25 s)

Factories: `fast` (loads instantly), `slow_load` (TESTENGINE_LOAD_S seconds to load, for the
stagger test), `failing` (ModelLoadError), `broken` (a plain exception while loading).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

from shared.errors import InvalidRequestError, ModelLoadError, TransientError
from workers.engine.api import ModelIdentity, SynthesisInput, SynthesisOutput, VoicePrompt

SAMPLE_RATE = 24000
TONE_HZ = 220.0
DEFAULT_SECONDS = 0.25
_LEAKED: list[np.ndarray] = []  # kept alive on purpose by `leak:<MiB>`


class ScriptedEngine:
    """Obeys the directives in the text; otherwise returns a short sine at 24 kHz."""

    sample_rate = SAMPLE_RATE

    def __init__(self, *, name: str = "test-scripted", warm_up_s: float = 0.0) -> None:
        self.identity = ModelIdentity(
            name=name, checkpoint_hash="0" * 16, backend="test", device="cpu"
        )
        self.warm_up_s = warm_up_s
        self.warmed_up = False

    def warm_up(self) -> None:
        time.sleep(self.warm_up_s)
        self.warmed_up = True

    def synthesize(self, request: SynthesisInput) -> SynthesisOutput:
        started = time.perf_counter()
        seconds = DEFAULT_SECONDS
        for word in request.text.split():
            name, _, value = word.partition(":")
            seconds = _obey(name, value, seconds)
        samples = _tone(seconds)
        elapsed = time.perf_counter() - started
        return SynthesisOutput(
            samples=samples,
            sample_rate=SAMPLE_RATE,
            stage_seconds={"frontend": 0.0, "llm": elapsed, "flow": 0.0, "hift": 0.0},
            speech_tokens=int(seconds * 25),
        )

    def extract_voice(self, samples: np.ndarray, sample_rate: int, transcript: str) -> VoicePrompt:
        tokens = max(1, int(samples.shape[0] / sample_rate * 25))
        return VoicePrompt(
            speech_tokens=np.zeros(tokens, dtype=np.int32),
            mel=np.zeros((2 * tokens, 80), dtype=np.float32),
            embedding=np.zeros(192, dtype=np.float32),
            transcript=transcript,
        )


def _obey(name: str, value: str, seconds: float) -> float:
    if name == "sleep":
        time.sleep(float(value))
    elif name == "leak":
        block = np.ones(int(float(value) * 1024 * 1024) // 8, dtype=np.float64)  # touched pages
        _LEAKED.append(block)
    elif name == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif name == "exit":
        os._exit(int(value))
    elif name == "transient":
        marker = Path(value)
        if not marker.exists():
            marker.touch()
            raise TransientError(f"test engine: transient fault (marker {marker.name} created)")
    elif name == "invalid":
        raise InvalidRequestError("text: the test engine refuses this text")
    elif name == "boom":
        raise RuntimeError("test engine bug")
    elif name == "seconds":
        return float(value)
    return seconds


def _tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE), dtype=np.float32) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)


def fast(settings: Any) -> ScriptedEngine:
    return ScriptedEngine()


def slow_load(settings: Any) -> ScriptedEngine:
    """Takes TESTENGINE_LOAD_S seconds to load (default 1), like a model compiling."""
    time.sleep(float(os.environ.get("TESTENGINE_LOAD_S", "1")))
    return ScriptedEngine(name="test-slow-load", warm_up_s=0.1)


def failing(settings: Any) -> ScriptedEngine:
    raise ModelLoadError("test engine: no model files in /nonexistent (llm.pt missing)")


def broken(settings: Any) -> ScriptedEngine:
    raise RuntimeError("test engine crashed while loading")
