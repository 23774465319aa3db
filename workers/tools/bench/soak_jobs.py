"""The soak's job mix: every mode and format, some with a registered voice, some bad on purpose.

Bad jobs pass the producer (or skip it, as a foreign RQ client could) and must fail at the
worker with a clear permanent error, never run twice and never get lost. Four kinds rotate:
an unregistered voice, a prompt file that does not exist, a prompt outside COSYQ_PROMPT_ROOTS,
and a payload enqueued straight through RQ that the worker's gate refuses.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOAK_VOICE = "soak-voice"
BAD_KINDS = ("unknown_voice", "missing_prompt", "prompt_outside_roots", "raw_invalid")
TEXTS = (
    "Your order has shipped and will arrive on Thursday.",
    "Please hold; the next agent will be with you shortly.",
    "The meeting moved to three thirty. Bring the quarterly numbers.",
    "Numbers like 42 and dates like 2026-12-01 are normalised first.",
    "Short.",
    "A longer notice, read in two parts. The first sentence says what happened. The second "
    "sentence says what to do next, and it is long enough to be its own piece.",
)
CROSS_LINGUAL_TEXTS = ("欢迎使用语音合成服务。", "今天天气很好，我们出去走走吧。")
INSTRUCTIONS = ("Speak slowly and warmly.", "Sound cheerful.", "Whisper, please.")
FORMATS: tuple[dict[str, Any], ...] = (
    {"format": "wav"},
    {"format": "wav", "sample_format": "float32"},
    {"format": "flac"},
    {"format": "ogg"},
)
SAMPLE_RATES = (None, 8000, 16000, 22050, 24000, 44100, 48000)
PRIORITIES = ("high", "default", "low")


@dataclass(frozen=True)
class SoakJob:
    """One request and how it must end; `raw` jobs bypass the producer's validation."""

    request: dict[str, Any]
    bad_kind: str | None = None
    raw: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def bad(self) -> bool:
        return self.bad_kind is not None


def soak_jobs(count: int, bad_every: int, model_dir: Path, seed: int = 0) -> list[SoakJob]:
    """`count` jobs; every `bad_every`-th one is bad (0: none), the rest vary as documented."""
    rng = random.Random(seed)
    prompt_uri = (model_dir / "prompt.wav").resolve().as_uri()
    prompt_text = (model_dir / "prompt.txt").read_text(encoding="utf-8").strip()
    jobs = []
    for index in range(count):
        if bad_every and index % bad_every == bad_every - 1:
            kind = BAD_KINDS[(index // bad_every) % len(BAD_KINDS)]
            jobs.append(_bad_job(kind, index, model_dir))
        else:
            jobs.append(SoakJob(_good_request(rng, index, prompt_uri, prompt_text)))
    return jobs


def _good_request(
    rng: random.Random, index: int, prompt_uri: str, prompt_text: str
) -> dict[str, Any]:
    mode = ("zero_shot", "cross_lingual", "instruct2")[index % 3]
    texts = CROSS_LINGUAL_TEXTS if mode == "cross_lingual" else TEXTS
    request: dict[str, Any] = {"text": rng.choice(texts), "mode": mode, "seed": index}
    request.update(FORMATS[index % len(FORMATS)])
    rate = SAMPLE_RATES[index % len(SAMPLE_RATES)]
    if rate is not None:
        request["sample_rate"] = rate
    if mode == "instruct2":
        request["instruction"] = rng.choice(INSTRUCTIONS)
    voice = index % 5
    if voice in (1, 2):
        request["voice"] = SOAK_VOICE
    elif voice == 3:
        request["prompt_audio"] = prompt_uri
        request["prompt_text"] = prompt_text
    if index % 4 == 0:
        request["speed"] = rng.choice((0.8, 1.0, 1.25))
    if index % 6 == 0:
        request["output_key"] = f"soak/{index:05d}.{request['format']}"
    request["priority"] = PRIORITIES[index % len(PRIORITIES)]
    request["metadata"] = {"soak_index": index}
    return request


def _bad_job(kind: str, index: int, model_dir: Path) -> SoakJob:
    base: dict[str, Any] = {"text": f"This job is bad on purpose ({kind}).", "seed": index}
    base["metadata"] = {"soak_index": index, "bad": kind}
    if kind == "unknown_voice":
        # raw: the producer refuses it too; this one tests the worker's check
        return SoakJob({**base, "voice": f"no-such-voice-{index}"}, kind, raw=True)
    if kind == "missing_prompt":
        missing = (model_dir / f"missing-{index}.wav").resolve().as_uri()
        return SoakJob({**base, "prompt_audio": missing, "prompt_text": "gone"}, kind)
    if kind == "prompt_outside_roots":
        return SoakJob({**base, "prompt_audio": "file:///etc/hostname", "prompt_text": "x"}, kind)
    return SoakJob({**base, "speed": 9.0}, kind, raw=True)  # the producer would refuse it
