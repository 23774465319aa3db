"""Which prompt a request speaks with: a request's voice choice -> the engine's VoicePrompt.

Three kinds: the voice named "default" (the model directory's prompt.wav + prompt.txt,
extracted once per worker process), an inline prompt (`prompt_audio` read through storage, with
`prompt_text`; extracted per job), and registered voices (`cosyq voices add`: profiles in Redis,
refused when computed with other weights). The prompt-audio rules (readable, >= 16 kHz, not too
long, not silent) are checked here before the engine sees a recording.
"""

from __future__ import annotations

from pathlib import Path

from shared.errors import InvalidRequestError
from shared.jobs import SynthesisRequest
from shared.storage import Storage
from shared.voices import DEFAULT_VOICE, VoiceRegistry, check_prompt_audio, decode_prompt_audio
from workers.engine_api import SynthesisEngine, VoicePrompt
from workers.voice_profiles import RegisteredVoices

DEFAULT_PROMPT_AUDIO = "prompt.wav"  # in the model directory, as the official layout ships it
DEFAULT_PROMPT_TEXT = "prompt.txt"


class VoiceBook:
    """Resolves voices for one worker process; the default voice is computed once."""

    def __init__(
        self,
        engine: SynthesisEngine,
        storage: Storage,
        *,
        model_dir: Path | None,
        registry: VoiceRegistry,
        max_prompt_seconds: float,
    ) -> None:
        self.engine = engine
        self.storage = storage
        self.model_dir = model_dir
        self.registered_voices = RegisteredVoices(registry, engine.identity)
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
        """UnknownVoiceError if not registered, VoiceMismatchError if made by other weights."""
        return self.registered_voices.resolve(name)

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
        """Decode and check here (the worker never trusts the queue, whatever the engine)."""
        samples, rate = decode_prompt_audio(data, where=field)
        check_prompt_audio(samples, rate, self.max_prompt_seconds)
        return self.engine.extract_voice(samples, rate, transcript)
