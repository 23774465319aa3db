"""Which prompt a request speaks with: a request's voice choice -> the engine's VoicePrompt.

Three kinds: the voice named "default" (the model directory's prompt.wav + prompt.txt,
extracted once per model and prompt and shared through Redis, so recycled workers skip the
prompt models), an inline prompt (`prompt_audio` read through storage, with
`prompt_text`; extracted per job), and registered voices (`cosyq voices add`: profiles in
Redis, the job's tenant's own first, then the shared ones; refused when computed with other
weights). The prompt-audio rules (readable, >= 16 kHz, not too
long, not silent) are checked here before the engine sees a recording.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from shared import keys
from shared.errors import InvalidRequestError
from shared.jobs import SynthesisRequest
from shared.logs import get_logger
from shared.storage import Storage
from shared.tenants import DEFAULT_TENANT
from shared.voices import DEFAULT_VOICE, VoiceRegistry, check_prompt_audio, decode_prompt_audio
from workers.engine.api import SynthesisEngine, VoicePrompt
from workers.model.directory import PROMPT_AUDIO, PROMPT_TEXT
from workers.voices.profiles import RegisteredVoices, profile_from_prompt, prompt_from_profile

log = get_logger(__name__)


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
        cache_ttl_s: int = 0,
    ) -> None:
        self.engine = engine
        self.storage = storage
        self.model_dir = model_dir
        self.registered_voices = RegisteredVoices(registry, engine.identity)
        self.max_prompt_seconds = max_prompt_seconds
        self.cache_ttl_s = cache_ttl_s
        self._default: VoicePrompt | None = None

    def resolve(self, request: SynthesisRequest, tenant: str = DEFAULT_TENANT) -> VoicePrompt:
        """The request's prompt; a registered voice is `tenant`'s own, else a shared one."""
        if request.prompt_audio is not None:
            return self.inline(request.prompt_audio, request.prompt_text or "")
        name = request.voice or DEFAULT_VOICE
        if name == DEFAULT_VOICE:
            return self.default()
        return self.registered(name, tenant)

    def default(self) -> VoicePrompt:
        if self._default is None:
            self._default = self._load_default()
        return self._default

    def prepare_default(self) -> None:
        """Resolve the default voice before the first job; a broken one only fails its jobs."""
        if self.model_dir is None:
            return
        try:
            self.default()
        except InvalidRequestError as e:
            log.warning("default_voice_unavailable", error=str(e))

    def inline(self, uri: str, transcript: str) -> VoicePrompt:
        """Read prompt audio from storage and extract its features (per job: not cached)."""
        return self._extract(self.storage.get(uri), transcript, field="prompt_audio")

    def registered(self, name: str, tenant: str = DEFAULT_TENANT) -> VoicePrompt:
        """UnknownVoiceError if neither the tenant nor the shared voices have it,
        VoiceMismatchError if made by other weights."""
        return self.registered_voices.resolve(tenant, name)

    def _load_default(self) -> VoicePrompt:
        if self.model_dir is None:
            raise InvalidRequestError(
                "voice: the default voice needs COSYQ_MODEL_DIR (its prompt.wav and prompt.txt); "
                "name a voice or pass prompt_audio instead"
            )
        audio = self.model_dir / PROMPT_AUDIO
        text = self.model_dir / PROMPT_TEXT
        for path in (audio, text):
            if not path.is_file():
                raise InvalidRequestError(f"voice 'default': {path} is missing")
        transcript = text.read_text(encoding="utf-8").strip()
        data = audio.read_bytes()
        digest = hashlib.sha256(data + transcript.encode()).hexdigest()[:16]
        key = keys.default_voice_key(self.engine.identity.checkpoint_hash, digest)
        registry = self.registered_voices.registry
        if self.cache_ttl_s and (cached := registry.cached(key)) is not None:
            return prompt_from_profile(cached, self.engine.identity)
        prompt = self._extract(data, transcript, field=f"voice 'default' ({audio})")
        if self.cache_ttl_s:
            samples, rate = decode_prompt_audio(data, max_seconds=self.max_prompt_seconds)
            profile = profile_from_prompt(
                DEFAULT_VOICE,
                prompt,
                identity=self.engine.identity,
                source_sample_rate=rate,
                source_seconds=samples.shape[0] / rate,
                source_uri=audio.resolve().as_uri(),
            )
            registry.cache(key, profile, self.cache_ttl_s)
        return prompt

    def _extract(self, data: bytes, transcript: str, *, field: str) -> VoicePrompt:
        """Decode and check here (the worker never trusts the queue, whatever the engine)."""
        samples, rate = decode_prompt_audio(data, where=field, max_seconds=self.max_prompt_seconds)
        check_prompt_audio(samples, rate, self.max_prompt_seconds)
        return self.engine.extract_voice(samples, rate, transcript)
