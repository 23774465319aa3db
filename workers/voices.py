"""Which prompt a request speaks with: a request's voice choice -> the engine's VoicePrompt.

Today: the voice named "default" (the model directory's prompt.wav + prompt.txt, extracted once
per worker process) and an inline prompt (`prompt_audio` read through storage, with
`prompt_text`). Registered voices (`cosyq voices add`, issue "Synthesis pipeline") plug in at
`VoiceBook.registered`.
"""

from __future__ import annotations

from pathlib import Path

from shared.audio import decode_audio
from shared.errors import InvalidRequestError
from shared.jobs import SynthesisRequest
from shared.storage import Storage
from workers.engine_api import SynthesisEngine, VoicePrompt

DEFAULT_VOICE = "default"
DEFAULT_PROMPT_AUDIO = "prompt.wav"  # in the model directory, as the official layout ships it
DEFAULT_PROMPT_TEXT = "prompt.txt"
MIN_PROMPT_RATE = 16000  # the speech tokenizer and speaker encoder work at 16 kHz


class VoiceBook:
    """Resolves voices for one worker process; the default voice is computed once."""

    def __init__(
        self,
        engine: SynthesisEngine,
        storage: Storage,
        *,
        model_dir: Path | None,
        max_prompt_seconds: float,
    ) -> None:
        self.engine = engine
        self.storage = storage
        self.model_dir = model_dir
        self.max_prompt_seconds = max_prompt_seconds
        self._default: VoicePrompt | None = None

    def resolve(self, request: SynthesisRequest) -> VoicePrompt:
        if request.prompt_audio is not None:
            return self.inline(request.prompt_audio, request.prompt_text or "")
        name = request.voice or DEFAULT_VOICE
        if name == DEFAULT_VOICE:
            return self.default()
        return self.registered(name)

    def default(self) -> VoicePrompt:
        if self._default is None:
            self._default = self._load_default()
        return self._default

    def inline(self, uri: str, transcript: str) -> VoicePrompt:
        """Read prompt audio from storage and extract its features (per job: not cached)."""
        return self._extract(self.storage.get(uri), transcript, field="prompt_audio")

    def registered(self, name: str) -> VoicePrompt:
        raise InvalidRequestError(f"voice: no voice named {name!r} is registered")

    def _load_default(self) -> VoicePrompt:
        if self.model_dir is None:
            raise InvalidRequestError(
                "voice: the default voice needs COSYQ_MODEL_DIR (its prompt.wav and prompt.txt); "
                "name a voice or pass prompt_audio instead"
            )
        audio = self.model_dir / DEFAULT_PROMPT_AUDIO
        text = self.model_dir / DEFAULT_PROMPT_TEXT
        for path in (audio, text):
            if not path.is_file():
                raise InvalidRequestError(f"voice 'default': {path} is missing")
        transcript = text.read_text(encoding="utf-8").strip()
        return self._extract(audio.read_bytes(), transcript, field=f"voice 'default' ({audio})")

    def _extract(self, data: bytes, transcript: str, *, field: str) -> VoicePrompt:
        samples, rate = decode_audio(data)
        seconds = samples.shape[0] / rate
        if seconds > self.max_prompt_seconds:
            raise InvalidRequestError(
                f"{field}: {seconds:.1f} s of audio, limit {self.max_prompt_seconds:g} s"
            )
        if rate < MIN_PROMPT_RATE:
            raise InvalidRequestError(f"{field}: {rate} Hz, need at least {MIN_PROMPT_RATE} Hz")
        return self.engine.extract_voice(samples, rate, transcript)
