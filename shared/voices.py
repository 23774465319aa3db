"""Voice profiles: a prompt's features computed once by a worker, stored in Redis, named by jobs.

A profile holds what the engine needs from a prompt recording (speech tokens, 24 kHz mel,
speaker embedding, transcript) plus where it came from (source rate and length, the model's
checkpoint hash: a profile made with other weights is refused, not silently misused).

Storage: one Redis hash per voice (`shared.keys.voice_key`: per owner, a tenant or the shared
voices) with two JSON fields, "meta" (small: what `voices list` reads) and "arrays" (each array
as {"dtype", "shape", "data": base64 of its little-endian bytes}), plus a set of names per
owner. Never pickle. This module needs numpy and redis only, so the producer lists and removes
voices without torch.

Voices are per tenant: a tenant lists, uses, replaces and removes only its own. Shared voices
(owner `keys.SHARED_VOICES`) are published by an operator and usable by every tenant;
`load_voice` is the one place a job's voice name is resolved: the tenant's own, then shared.

`check_prompt_audio` is the one set of rules for prompt recordings, run by the producer before
uploading and by the worker before extracting.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import redis

from shared import keys
from shared.audio import audio_header, decode_audio
from shared.errors import (
    AudioDecodeError,
    InvalidRequestError,
    PromptAudioError,
    PromptSampleRateError,
    PromptSilentError,
    PromptTooLongError,
    PromptUnreadableError,
    UnknownTenantError,
    UnknownVoiceError,
    VoiceQuotaError,
)
from shared.jobs import DEFAULT_VOICE, VOICE_NAME_RE
from shared.tenants import DEFAULT_TENANT, check_tenant_name
from shared.text_markup import MarkupError, parse_markup

PROFILE_FORMAT = 1  # bump when the stored layout changes
MIN_PROMPT_SAMPLE_RATE = 16000  # the prompt models work at 16 kHz; nothing is upsampled
MAX_PROMPT_SAMPLE_RATE = 192000  # no microphone records more; bounds what a prompt decodes to
MIN_PROMPT_SECONDS = 0.5  # shorter gives at most a dozen speech tokens: too little voice to copy
PROMPT_SILENCE_DBFS = -60.0  # RMS below this (re full scale) counts as silence
_ARRAY_DTYPES = {"float32": np.dtype("<f4"), "int32": np.dtype("<i4")}


VOICE_UPLOAD_PREFIX = "voices"  # recordings: voices/<owner>/<name>/<random>.<suffix>


def upload_folders(owner: str, name: str) -> tuple[str, ...]:
    """Where an owner's uploads for voice `name` live: voices/<owner>/<name>, and for the
    tenant "default" also voices/<name> (its uploads from before tenants)."""
    folder = f"{VOICE_UPLOAD_PREFIX}/{owner}/{name}"
    if owner == DEFAULT_TENANT:
        return folder, f"{VOICE_UPLOAD_PREFIX}/{name}"
    return (folder,)


def upload_key(
    storage_uri_for: Callable[[str], str], owner: str, name: str, uri: str | None
) -> str | None:
    """The storage key of `uri` when it is one of `owner`'s uploads for voice `name` (what
    replacing or removing the voice may delete); None for anything else (a URI the user gave,
    another owner's upload)."""
    if not uri:
        return None
    marker = "upload"
    for folder in upload_folders(owner, name):
        prefix = storage_uri_for(f"{folder}/{marker}")[: -len(marker)]
        rest = uri[len(prefix) :] if uri.startswith(prefix) else ""
        if rest and "/" not in rest:
            return f"{folder}/{rest}"
    return None


def check_owner(owner: str) -> str:
    """A voice owner: a tenant's name, or keys.SHARED_VOICES."""
    if owner != keys.SHARED_VOICES:
        try:
            check_tenant_name(owner)
        except UnknownTenantError as e:
            raise InvalidRequestError(f"voice owner: {e}") from e
    return owner


def check_transcript(transcript: str, limit: int) -> str:
    """A voice's transcript: at most `limit` characters, control tags only (no special tokens,
    no pauses); the producer checks it before uploading and the add-voice job again."""
    transcript = transcript.strip()
    try:
        transcript.encode("utf-8")
    except UnicodeEncodeError as e:  # bytes that were not UTF-8, smuggled in as surrogates
        raise InvalidRequestError(
            f"transcript: not valid UTF-8 (unpaired surrogate at character {e.start})"
        ) from None
    if len(transcript) > limit:
        raise InvalidRequestError(f"transcript: {len(transcript):,} characters, limit {limit:,}")
    try:
        parse_markup(transcript, allow_breaks=False)
    except MarkupError as e:
        raise InvalidRequestError(f"transcript: {e}") from e
    return transcript


def check_voice_name(name: str) -> str:
    """A name jobs can use: the request contract's rule, and not the reserved "default"."""
    if not VOICE_NAME_RE.fullmatch(name):
        raise InvalidRequestError(
            f"voice name {name!r}: 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    if name == DEFAULT_VOICE:
        raise InvalidRequestError(
            f"voice name {name!r} is reserved for the model directory's built-in prompt"
        )
    return name


def decode_prompt_audio(
    data: bytes, where: str = "prompt audio", *, max_seconds: float
) -> tuple[np.ndarray, int]:
    """Any file soundfile reads -> (mono float32 samples, rate); PromptUnreadableError if not.

    A prompt is at most `max_seconds` long at MAX_PROMPT_SAMPLE_RATE, so nothing past that is
    decoded: a header saying longer, or not saying, or a rate above it, is refused before
    decoding, and a file holding more than its header said stops decoding there. A small upload
    that decompresses to gigabytes (a FLAC of silence: about 2,000 times) costs no more memory
    than a real prompt."""
    try:
        rate, frames = audio_header(data)
        check_prompt_rate(rate)
        if frames is None:  # soundfile cannot read past the first block of such a file
            raise AudioDecodeError(
                "the file does not state its length (a FLAC from a streaming encoder?); "
                "export it again as WAV or FLAC"
            )
        if frames / rate > max_seconds:
            raise PromptTooLongError(_too_long(f"{frames / rate:.1f} s", max_seconds))
        samples, rate = decode_audio(data, max_seconds=max_seconds)
    except AudioDecodeError as e:
        raise PromptUnreadableError(f"{where}: {e}") from e
    if samples.shape[0] > max_seconds * rate:
        raise PromptTooLongError(_too_long(f"more than {max_seconds:g} s", max_seconds))
    return samples, rate


def check_prompt_rate(sample_rate: int) -> None:
    """PromptSampleRateError for a rate below MIN_PROMPT_SAMPLE_RATE or above the maximum."""
    if sample_rate < MIN_PROMPT_SAMPLE_RATE:
        raise PromptSampleRateError(
            f"prompt audio: {sample_rate} Hz, need at least {MIN_PROMPT_SAMPLE_RATE} Hz "
            "(record or export at 16 kHz or more; upsampling adds no voice detail)"
        )
    if sample_rate > MAX_PROMPT_SAMPLE_RATE:
        raise PromptSampleRateError(
            f"prompt audio: {sample_rate} Hz, at most {MAX_PROMPT_SAMPLE_RATE} Hz "
            "(the prompt models work at 16 kHz)"
        )


def _too_long(length: str, max_seconds: float) -> str:
    return f"prompt audio: {length}, limit {max_seconds:g} s (COSYQ_MAX_PROMPT_SECONDS)"


def check_prompt_audio(samples: np.ndarray, sample_rate: int, max_seconds: float) -> None:
    """Raise the PromptAudioError subclass naming what is wrong with a mono recording."""
    check_prompt_rate(sample_rate)
    seconds = samples.shape[-1] / sample_rate
    if seconds > max_seconds:
        raise PromptTooLongError(_too_long(f"{seconds:.1f} s", max_seconds))
    if seconds < MIN_PROMPT_SECONDS:
        raise PromptAudioError(
            f"prompt audio: {seconds:.2f} s, need at least {MIN_PROMPT_SECONDS} s"
        )
    if not np.isfinite(samples).all():
        raise PromptAudioError("prompt audio: contains NaN or infinite samples")
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
    level = 20 * math.log10(rms) if rms > 0 else -math.inf
    if level < PROMPT_SILENCE_DBFS:
        shown = "digital silence" if rms == 0 else f"RMS {level:.0f} dBFS"
        raise PromptSilentError(
            f"prompt audio: silent ({shown}; speech needs more than {PROMPT_SILENCE_DBFS:g} dBFS)"
        )
    sound = float(np.std(samples, dtype=np.float64))  # what is left with the offset taken out
    if sound == 0 or 20 * math.log10(sound) < PROMPT_SILENCE_DBFS:
        offset = float(np.mean(samples, dtype=np.float64))
        raise PromptSilentError(
            f"prompt audio: silent apart from a constant offset (DC {offset:+.2f} of full scale; "
            f"speech needs more than {PROMPT_SILENCE_DBFS:g} dBFS once the offset is removed)"
        )


def encode_array(array: np.ndarray) -> dict[str, Any]:
    """float32/int32 array -> {"dtype", "shape", "data": base64 little-endian bytes}."""
    name = str(array.dtype)
    if name not in _ARRAY_DTYPES:
        raise ValueError(f"only float32 and int32 arrays are stored, got {name}")
    data = np.ascontiguousarray(array, dtype=_ARRAY_DTYPES[name]).tobytes()
    return {"dtype": name, "shape": list(array.shape), "data": base64.b64encode(data).decode()}


def decode_array(doc: Mapping[str, Any], where: str) -> np.ndarray:
    """The inverse of `encode_array`; a malformed entry raises ValueError naming `where`."""
    try:
        dtype = _ARRAY_DTYPES[doc["dtype"]]
        shape = tuple(int(n) for n in doc["shape"])
        data = base64.b64decode(doc["data"], validate=True)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: malformed array entry ({e})") from e
    if any(n < 0 for n in shape) or math.prod(shape) * dtype.itemsize != len(data):
        raise ValueError(f"{where}: {len(data)} bytes do not hold {doc['dtype']}{list(shape)}")
    return np.frombuffer(data, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


@dataclass(frozen=True)
class VoiceSummary:
    """What `cosyq voices list` shows: a profile without its arrays."""

    name: str
    transcript: str
    speech_tokens: int
    source_sample_rate: int
    source_seconds: float
    model_name: str
    checkpoint_hash: str
    created_at: str
    source_uri: str | None = None
    format: int = PROFILE_FORMAT
    replaced: bool = False  # in the add-voice job's answer: the name had a voice before
    shared: bool = False  # a shared voice (an operator's), usable by every tenant
    # the model family it was extracted for (profiles from before CosyVoice 3: cosyvoice2)
    family: str = "cosyvoice2"

    def to_dict(self) -> dict[str, Any]:
        return {field: getattr(self, field) for field in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> VoiceSummary:
        try:
            return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})
        except TypeError as e:
            raise ValueError(f"voice summary: {e}") from e


@dataclass(frozen=True)
class VoiceProfile:
    """A stored voice: the engine's prompt arrays plus their summary.

    speech_tokens (n,) int32; mel (2n, 80) float32, time-major; embedding (192,) float32.
    """

    summary: VoiceSummary
    speech_tokens: np.ndarray
    mel: np.ndarray
    embedding: np.ndarray

    @property
    def name(self) -> str:
        return self.summary.name

    def arrays_json(self) -> str:
        return json.dumps(
            {
                "speech_tokens": encode_array(self.speech_tokens),
                "mel": encode_array(self.mel),
                "embedding": encode_array(self.embedding),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_fields(cls, meta: str | bytes, arrays: str | bytes) -> VoiceProfile:
        """Parse the two stored JSON fields; ValueError (with the field) when malformed."""
        try:
            summary = VoiceSummary.from_dict(json.loads(meta))
            docs = json.loads(arrays)
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as e:
            raise ValueError(f"voice profile: unreadable JSON ({e})") from e
        if summary.format != PROFILE_FORMAT:
            raise ValueError(f"voice profile: format {summary.format}, expected {PROFILE_FORMAT}")
        if not isinstance(docs, dict):
            raise ValueError("voice profile: arrays must be a JSON object")
        values = {name: decode_array(docs.get(name, {}), name) for name in _ARRAY_NAMES}
        profile = cls(summary=summary, **values)
        profile.check_shapes()
        return profile

    def check_shapes(self) -> None:
        n = self.speech_tokens.shape
        if len(n) != 1 or self.mel.ndim != 2 or self.mel.shape[0] != 2 * n[0]:
            raise ValueError(
                f"voice {self.name!r}: tokens {n} and mel {self.mel.shape} are not 1:2"
            )
        if self.embedding.ndim != 1 or self.speech_tokens.dtype != np.int32:
            raise ValueError(f"voice {self.name!r}: embedding must be 1-D, tokens int32")


_ARRAY_NAMES = ("speech_tokens", "mel", "embedding")


def _stored_fields(profile: VoiceProfile) -> tuple[str, str]:
    """The hash fields "meta" and "arrays" of a stored profile."""
    return json.dumps(profile.summary.to_dict(), ensure_ascii=False), profile.arrays_json()


def _unreadable(name: str) -> VoiceSummary:
    return VoiceSummary(
        name=name,
        transcript="",
        speech_tokens=0,
        source_sample_rate=0,
        source_seconds=0.0,
        model_name="(unreadable)",
        checkpoint_hash="-",
        created_at="-",
    )


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class VoiceRegistry:
    """One owner's voice profiles in Redis (a tenant's, or the shared ones): save (replacing),
    load, list, remove."""

    def __init__(self, connection: redis.Redis, owner: str = DEFAULT_TENANT) -> None:
        self.connection = connection
        self.owner = check_owner(owner)

    def _key(self, name: str) -> str:
        """The owner's Redis key of voice `name`; UnknownVoiceError for a name no voice can
        have: the tenant "default" keys its voices with no owner part, so `alpha:alice` would
        name alpha's (the one check that keeps an owner's keys its own)."""
        if not VOICE_NAME_RE.fullmatch(name):
            raise UnknownVoiceError(f"voice: no voice named {name!r} is registered")
        return keys.voice_key(name, self.owner)

    def save(self, profile: VoiceProfile, *, max_voices: int | None = None) -> VoiceSummary | None:
        """Store (replacing) a profile; the summary of the one it replaced, read in the same
        transaction (two concurrent adds of one name: the second sees the first). With
        `max_voices`, a new name is refused (VoiceQuotaError) once the owner has that many:
        the count is read under WATCH in the same transaction, so concurrent saves never
        pass it together."""
        check_voice_name(profile.name)
        profile.check_shapes()
        meta, arrays = _stored_fields(profile)
        names = keys.voices_set(self.owner)
        with self.connection.pipeline() as pipe:  # MULTI: the hash and the set change together
            while True:
                try:
                    pipe.watch(names)
                    if max_voices is not None:
                        self._check_room(pipe, profile.name, max_voices)
                    pipe.multi()
                    pipe.hget(self._key(profile.name), "meta")
                    pipe.hset(self._key(profile.name), mapping={"meta": meta, "arrays": arrays})
                    pipe.sadd(names, profile.name)
                    previous = pipe.execute()[0]
                except redis.WatchError:
                    continue  # another save or removal changed the names: count again
                return None if previous is None else _summary_or_unreadable(profile.name, previous)

    def _check_room(self, connection: Any, name: str, max_voices: int) -> None:
        """VoiceQuotaError when `name` would be a new voice past `max_voices`."""
        names = keys.voices_set(self.owner)
        if connection.sismember(names, name):
            return  # replacing one: the count stays
        count = int(connection.scard(names))
        if count >= max_voices:
            raise VoiceQuotaError(
                f"voices: tenant {self.owner} has {count:,} voices (quota max_voices "
                f"{max_voices:,}, COSYQ_TENANT_MAX_VOICES, COSYQ_TENANT_QUOTAS); remove one "
                "(DELETE /v1/audio/voices/{name}, cosyq voices rm) or replace one by its name"
            )

    def check_room(self, name: str, max_voices: int) -> None:
        """VoiceQuotaError now when storing `name` would pass `max_voices` (the producer's
        early answer; `save` checks again atomically)."""
        self._check_room(self.connection, name, max_voices)

    def cache(self, key: str, profile: VoiceProfile, ttl_s: int) -> None:
        """Keep an unlisted profile (the default voice) under `key` for `ttl_s` seconds."""
        profile.check_shapes()
        meta, arrays = _stored_fields(profile)
        pipe = self.connection.pipeline()
        pipe.hset(key, mapping={"meta": meta, "arrays": arrays})
        pipe.expire(key, ttl_s)
        pipe.execute()

    def cached(self, key: str) -> VoiceProfile | None:
        """The profile kept under `key`, or None if absent or unreadable (then recompute)."""
        meta, arrays = self.connection.hmget(key, ["meta", "arrays"])
        if meta is None or arrays is None:
            return None
        try:
            return VoiceProfile.from_fields(meta, arrays)
        except ValueError:
            return None

    def load(self, name: str) -> VoiceProfile:
        """The profile; UnknownVoiceError when none is registered under `name`."""
        meta, arrays = self.connection.hmget(self._key(name), ["meta", "arrays"])
        if meta is None or arrays is None:
            raise UnknownVoiceError(
                f"voice: no voice named {name!r} is registered (cosyq voices list)"
            )
        try:
            return VoiceProfile.from_fields(meta, arrays)
        except ValueError as e:
            raise InvalidRequestError(f"voice {name!r}: stored profile is unusable: {e}") from e

    def names(self) -> list[str]:
        members = self.connection.smembers(keys.voices_set(self.owner))
        return sorted(n.decode() if isinstance(n, bytes) else str(n) for n in members)

    def summaries(self) -> list[VoiceSummary]:
        """Every registered voice's summary (one round trip). A name whose profile is gone or
        unreadable is listed as such (model "(unreadable)"), so it can be seen and removed."""
        names = self.names()
        pipe = self.connection.pipeline(transaction=False)
        for name in names:
            pipe.hget(self._key(name), "meta")
        shared = self.owner == keys.SHARED_VOICES
        return [
            dataclasses.replace(_summary_or_unreadable(name, meta), shared=shared)
            for name, meta in zip(names, pipe.execute(), strict=True)
        ]

    def remove(self, name: str) -> VoiceSummary:
        """Delete a voice; its summary (for its upload); UnknownVoiceError when there was none."""
        pipe = self.connection.pipeline()
        pipe.hget(self._key(name), "meta")
        pipe.delete(self._key(name))
        pipe.srem(keys.voices_set(self.owner), name)
        meta, deleted, unlisted = pipe.execute()
        if not deleted and not unlisted:
            raise UnknownVoiceError(f"voice: no voice named {name!r} is registered")
        return _summary_or_unreadable(name, meta)


def load_voice(connection: redis.Redis, tenant: str, name: str) -> VoiceProfile:
    """The one place a job's voice name is resolved: the tenant's own voice, else a shared one;
    UnknownVoiceError when neither has it (another tenant's voice is never found)."""
    for owner in (tenant, keys.SHARED_VOICES):
        try:
            return VoiceRegistry(connection, owner).load(name)
        except UnknownVoiceError:
            continue
    raise unknown_voice(tenant, name)


def unknown_voice(tenant: str, name: str) -> UnknownVoiceError:
    """The error for a voice `load_voice` cannot find (the producer's and the worker's)."""
    return UnknownVoiceError(
        f"voice: no voice named {name!r} is registered for tenant {tenant} or shared "
        "(cosyq voices list, GET /v1/audio/voices)"
    )


def voice_exists(connection: redis.Redis, tenant: str, name: str) -> bool:
    """Whether `load_voice` would find `name` for `tenant` (one round trip)."""
    return not missing_voices(connection, tenant, [name])


def missing_voices(connection: redis.Redis, tenant: str, names: Iterable[str]) -> set[str]:
    """The names `load_voice` would not find for `tenant`, all looked up in one round trip."""
    wanted = sorted(set(names))
    missing = {name for name in wanted if not VOICE_NAME_RE.fullmatch(name)}
    wanted = [name for name in wanted if name not in missing]  # `alpha:alice`: alpha's key
    if wanted:
        pipe = connection.pipeline(transaction=False)
        for name in wanted:
            pipe.exists(*(keys.voice_key(name, owner) for owner in (tenant, keys.SHARED_VOICES)))
        found = pipe.execute()
        missing.update(name for name, seen in zip(wanted, found, strict=True) if not seen)
    return missing


def _summary_or_unreadable(name: str, meta: Any) -> VoiceSummary:
    try:
        return VoiceSummary.from_dict(json.loads(meta))
    except (ValueError, TypeError):
        return _unreadable(name)
