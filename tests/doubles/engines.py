"""Test engines: the SynthesisEngine Protocol with behaviour scripted by the request text.

Workers in the tests load one of these through `COSYQ_ENGINE=tests.doubles.engines:<factory>`.
The text carries directives (words with a colon) that the engine obeys before returning a
short sine, so one worker can be made slow, leaky, transiently failing or dead per job:

    sleep:<s>        sleep before answering           kill            SIGKILL this process
    leak:<MiB>       allocate and keep memory          exit:<code>     os._exit(code) mid-job
    transient:<path> TransientError unless <path> exists (then creates it: fails once)
    refuse:<path>    InvalidRequestError (fails for good) until <path> exists
    invalid          InvalidRequestError               boom            RuntimeError (a bug)
    seconds:<s>      length of the returned audio (default 0.25 s)
    fail:<reason>    RuntimeError(<reason>), the reason being the rest of the text (spaces kept)
    once:<path>      the directives after it only while <path> does not exist (then creates
                     it): a job slow on its first attempt, quick when run again

Factories: `fast` (loads instantly), `per_char` (audio length follows the text:
SECONDS_PER_CHAR per character, at least MIN_PER_CHAR_SECONDS, as speech does), `slow_load`
(TESTENGINE_LOAD_S seconds to load, for the stagger test), `failing` (ModelLoadError),
`broken` (a plain exception while loading), `batching` (a tone that depends on text and seed,
batched across requests by the engine's own batch session over a decoder that steps every
TESTENGINE_STEP_S seconds; each step asks the request's `should_stop`, so a job can be
canceled mid-run, alone or as one row: tests/doubles/stepped.py), `crashing_batch` (the same, its
model loop failing at step TESTENGINE_CRASH_AT_STEP: tests/doubles/crashing.py).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shared.errors import InvalidRequestError, ModelLoadError, TransientError
from shared.text_markup import parse_markup, text_of
from workers.engine.api import (
    ModelIdentity,
    PieceSpan,
    SynthesisInput,
    SynthesisOutput,
    VoicePrompt,
)

SAMPLE_RATE = 24000
TONE_HZ = 220.0
DEFAULT_SECONDS = 0.25
SECONDS_PER_CHAR = 0.01
MIN_PER_CHAR_SECONDS = 0.1
FAIL_DIRECTIVE = "fail:"
_LEAKED: list[np.ndarray] = []  # kept alive on purpose by `leak:<MiB>`


class ScriptedEngine:
    """Obeys the directives in the text; otherwise returns a short sine at 24 kHz."""

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        *,
        name: str = "test-scripted",
        warm_up_s: float = 0.0,
        seconds_for: Callable[[str], float] = lambda text: DEFAULT_SECONDS,
    ) -> None:
        self.identity = ModelIdentity(
            name=name, checkpoint_hash="0" * 16, backend="test", device="cpu"
        )
        self.warm_up_s = warm_up_s
        self.warmed_up = False
        self.seconds_for = seconds_for

    def warm_up(self) -> None:
        time.sleep(self.warm_up_s)
        self.warmed_up = True

    def synthesize(self, request: SynthesisInput) -> SynthesisOutput:
        started = time.perf_counter()
        seconds = self.seconds_for(request.text)
        directives, failing, reason = request.text.partition(FAIL_DIRECTIVE)
        for word in directives.split():
            name, _, value = word.partition(":")
            if name == "once" and value:
                if Path(value).exists():
                    break
                Path(value).touch()
                continue
            seconds = _obey(name, value, seconds)
        if failing:
            raise RuntimeError(reason.strip())
        samples = _tone(seconds)
        elapsed = time.perf_counter() - started
        return SynthesisOutput(
            samples=samples,
            sample_rate=SAMPLE_RATE,
            stage_seconds={"frontend": 0.0, "llm": elapsed, "flow": 0.0, "hift": 0.0},
            speech_tokens=int(seconds * 25),
            pieces=[PieceSpan(text_of(parse_markup(request.text)), 0, samples.shape[0])],
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
    elif name == "refuse":
        if not Path(value).exists():
            raise InvalidRequestError(f"text: the test engine refuses it until {value} exists")
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


def per_char_seconds(text: str) -> float:
    """The `per_char` engine's audio length for `text`."""
    return max(MIN_PER_CHAR_SECONDS, SECONDS_PER_CHAR * len(text))


def per_char(settings: Any) -> ScriptedEngine:
    return ScriptedEngine(name="test-per-char", seconds_for=per_char_seconds)


def slow_load(settings: Any) -> ScriptedEngine:
    """Takes TESTENGINE_LOAD_S seconds to load (default 1), like a model compiling."""
    time.sleep(float(os.environ.get("TESTENGINE_LOAD_S", "1")))
    return ScriptedEngine(name="test-slow-load", warm_up_s=0.1)


def failing(settings: Any) -> ScriptedEngine:
    raise ModelLoadError("test engine: no model files in /nonexistent (llm.pt missing)")


def broken(settings: Any) -> ScriptedEngine:
    raise RuntimeError("test engine crashed while loading")


def batching(settings: Any) -> Any:
    """BatchingScriptedEngine (tests/doubles/stepped.py): the real batch session over a
    scripted model step; it loads torch, as the session does, so only its workers pay."""
    from tests.doubles.stepped import BatchingScriptedEngine  # noqa: PLC0415

    return BatchingScriptedEngine()


def crashing_batch(settings: Any) -> Any:
    """`batching` whose model loop itself fails at its step TESTENGINE_CRASH_AT_STEP (default
    1), as when the device is lost (tests/doubles/crashing.py)."""
    from tests.doubles.crashing import CrashingBatchEngine  # noqa: PLC0415

    return CrashingBatchEngine(crash_at=int(os.environ.get("TESTENGINE_CRASH_AT_STEP", "1")))


def tiny(settings: Any) -> Any:
    """The real torch engine from the worker's settings, its flow in TESTENGINE_FLOW_STEPS
    Euler steps (`tiny_torch_engine`): for tests of what happens around synthesis."""
    return tiny_torch_engine(settings)


def tiny_forced(settings: Any) -> Any:
    """The real torch engine from the worker's settings, every piece forced to
    TESTENGINE_FORCED_TOKENS speech tokens (default 40): the random tiny LLM would otherwise
    run to its cap of 20 tokens per text token, minutes on a busy test machine."""
    forced = int(os.environ.get("TESTENGINE_FORCED_TOKENS", "40"))
    return tiny_torch_engine(settings, forced_speech_tokens=forced)


def tiny_torch_engine(settings: Any, *, dtype: str = "fp32", **options: Any) -> Any:
    """The real torch engine on the worker's settings (cpu) with these EngineOptions changed.
    The flow solves in TESTENGINE_FLOW_STEPS Euler steps (default 2, the model's 10 when
    "model"): the flow is most of a tiny piece's time, and these tests check the service, not
    the audio."""
    import dataclasses  # noqa: PLC0415

    from workers.engine.pipeline import build_engine  # noqa: PLC0415 (torch only when used)
    from workers.service.default_engine import engine_options  # noqa: PLC0415

    steps = os.environ.get("TESTENGINE_FLOW_STEPS", "2")
    chosen = dataclasses.replace(
        engine_options(settings),
        flow_steps=None if steps == "model" else int(steps),
        **options,
    )
    return build_engine(
        settings.model_dir,
        device="cpu",
        dtype=dtype,
        options=chosen,
        hash_cache_dir=settings.hash_cache_dir,
    )


def tiny_as_configured(settings: Any) -> Any:
    """`tiny` with the default engine's choices for this host (`engine_from_settings`):
    COSYQ_DTYPE and COSYQ_LLM_PRECISION resolved as it resolves them (auto may pick the int8
    LLM), only the flow in TESTENGINE_FLOW_STEPS Euler steps."""
    from workers.service.default_engine import dtype_for, llm_precision_for  # noqa: PLC0415

    precision = llm_precision_for(settings, "cpu", "torch")
    return tiny_torch_engine(settings, dtype=dtype_for(settings, "cpu"), llm_precision=precision)


def runaway_tiny(settings: Any) -> Any:
    """The real engine on the tiny model (COSYQ_MODEL_DIR) whose LLM never samples a stop id:
    every piece babbles to its length bound, the runaway the quality check must catch."""
    import torch  # noqa: PLC0415 (torch only for the tests that load a model)

    engine = tiny_torch_engine(settings)
    model = engine.llm.model  # type: ignore[attr-defined]  # the torch pipeline's Qwen2LM
    with torch.no_grad():
        model.llm_decoder.bias[list(model.config.stop_tokens)] = -1e9
    return engine


class DirectedEngine:
    """The real engine behind the test directives: `transient:` and `refuse:` words are
    obeyed (see the module docstring) and removed, and the rest of the text is synthesized."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.identity = inner.identity
        self.sample_rate = inner.sample_rate

    def warm_up(self) -> None:
        self.inner.warm_up()

    def extract_voice(self, samples: np.ndarray, sample_rate: int, transcript: str) -> VoicePrompt:
        return self.inner.extract_voice(samples, sample_rate, transcript)

    def synthesize(self, request: SynthesisInput) -> SynthesisOutput:
        import dataclasses  # noqa: PLC0415

        kept = []
        for word in request.text.split(" "):
            name, _, value = word.partition(":")
            if name in ("transient", "refuse") and value:
                _obey(name, value, DEFAULT_SECONDS)
            else:
                kept.append(word)
        return self.inner.synthesize(dataclasses.replace(request, text=" ".join(kept)))


def tiny_directed(settings: Any) -> DirectedEngine:
    """`tiny_forced` behind the test directives (documents: a segment made to fail)."""
    return DirectedEngine(tiny_forced(settings))
