"""Worker side of voices: the `cosyq voices add` job body, and registered voices for jobs.

`add_voice` reads the uploaded prompt through storage, has the engine compute its features
(the shared prompt rules apply: readable, >= 16 kHz, not too long, not silent) and stores the
profile in Redis, in its owner's registry (a tenant, or the shared voices).
`RegisteredVoices.resolve(tenant, name)` finds the tenant's own voice, else a shared one
(`shared.voices.load_voice`), and turns it back into the engine's `VoicePrompt`, refusing one
computed with other model weights (its speech tokens and features would not match this model)
with a message that says how to fix it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from shared import keys
from shared.errors import InvalidRequestError, VoiceMismatchError, VoiceQuotaError
from shared.storage import Storage
from shared.voices import (
    VoiceProfile,
    VoiceRegistry,
    VoiceSummary,
    check_transcript,
    check_voice_name,
    decode_prompt_audio,
    load_voice,
    upload_key,
    utc_now,
)
from workers.engine.api import ModelIdentity, SynthesisEngine, VoicePrompt
from workers.model.directory import FAMILY_NAMES


def profile_from_prompt(
    name: str,
    prompt: VoicePrompt,
    *,
    identity: ModelIdentity,
    source_sample_rate: int,
    source_seconds: float,
    source_uri: str | None = None,
    shared: bool = False,
) -> VoiceProfile:
    """A storable profile of `prompt`, stamped with the model that computed it."""
    summary = VoiceSummary(
        name=name,
        transcript=prompt.transcript,
        speech_tokens=int(prompt.speech_tokens.shape[0]),
        source_sample_rate=source_sample_rate,
        source_seconds=round(source_seconds, 3),
        model_name=identity.name,
        checkpoint_hash=identity.checkpoint_hash,
        created_at=utc_now(),
        source_uri=source_uri,
        shared=shared,
        family=identity.family,
    )
    return VoiceProfile(
        summary=summary,
        speech_tokens=np.asarray(prompt.speech_tokens, dtype=np.int32),
        mel=np.asarray(prompt.mel, dtype=np.float32),
        embedding=np.asarray(prompt.embedding, dtype=np.float32),
    )


def prompt_from_profile(profile: VoiceProfile, identity: ModelIdentity) -> VoicePrompt:
    """The engine's prompt; VoiceMismatchError for a profile made for the other model family
    or with other weights."""
    family = profile.summary.family
    if family != identity.family:
        raise VoiceMismatchError(
            f"voice {profile.name!r} was extracted for {FAMILY_NAMES.get(family, family)} "
            f"(model {profile.summary.model_name}); this worker serves "
            f"{FAMILY_NAMES.get(identity.family, identity.family)} ({identity.name}): its speech "
            "tokens and prompt mel do not fit this model. Send the job to a worker of that "
            f"family, or add the voice again for this one (`cosyq voices add {profile.name} ...` "
            "under another name while the other family's workers still use it)"
        )
    made_with = profile.summary.checkpoint_hash
    if made_with != identity.checkpoint_hash:
        raise VoiceMismatchError(
            f"voice {profile.name!r} was computed with model {profile.summary.model_name} "
            f"(checkpoint {made_with}); this worker runs {identity.name} (checkpoint "
            f"{identity.checkpoint_hash}): add it again with `cosyq voices add {profile.name} ...`"
        )
    return VoicePrompt(
        speech_tokens=profile.speech_tokens,
        mel=profile.mel,
        embedding=profile.embedding,
        transcript=profile.summary.transcript,
    )


def check_job_owner(owner: object, tenant: str) -> None:
    """An add-voice job of `tenant` stores that tenant's voices, or shared ones; never another
    tenant's (the producer never asks for that; a hand-made job is refused)."""
    if owner not in {keys.SHARED_VOICES, tenant}:
        raise InvalidRequestError(
            f"voice owner {owner!r}: an add-voice job of tenant {tenant} stores only its own "
            "tenant's voices, or shared ones"
        )


def add_voice(
    engine: SynthesisEngine,
    storage: Storage,
    registry: VoiceRegistry,
    *,
    name: str,
    prompt_audio: str,
    transcript: str,
    max_transcript_chars: int = 2000,
    max_prompt_seconds: float,
    max_voices: int | None = None,
) -> dict[str, Any]:
    """The add-voice job: check, read, extract, store in `registry` (its owner's, holding at
    most `max_voices`: None for the shared voices); returns the profile's summary as JSON."""
    check_voice_name(name)
    owner = registry.owner
    own_upload = upload_key(storage.uri_for, owner, name, prompt_audio)
    try:
        transcript = check_transcript(transcript, max_transcript_chars)
        samples, rate = decode_prompt_audio(
            storage.get(prompt_audio), where=prompt_audio, max_seconds=max_prompt_seconds
        )
        prompt = engine.extract_voice(samples, rate, transcript)
    except InvalidRequestError:
        if own_upload is not None:  # refused for good: the recording is of no further use
            storage.delete(own_upload)
        raise
    profile = profile_from_prompt(
        name,
        prompt,
        identity=engine.identity,
        source_sample_rate=rate,
        source_seconds=samples.shape[0] / rate,
        source_uri=prompt_audio,
        shared=owner == keys.SHARED_VOICES,
    )
    try:
        previous = registry.save(profile, max_voices=max_voices)
    except VoiceQuotaError:
        if own_upload is not None:  # refused for good, as above
            storage.delete(own_upload)
        raise
    if previous is not None and previous.source_uri != prompt_audio:
        replaced_upload = upload_key(storage.uri_for, owner, name, previous.source_uri)
        if replaced_upload is not None:  # keep exactly the current recording
            storage.delete(replaced_upload)
    return dataclasses.replace(profile.summary, replaced=previous is not None).to_dict()


class RegisteredVoices:
    """Stored voices as this worker's engine can use them."""

    def __init__(self, registry: VoiceRegistry, identity: ModelIdentity) -> None:
        self.registry = registry  # its connection; the default voice's cache
        self.identity = identity

    def resolve(self, tenant: str, name: str) -> VoicePrompt:
        """The tenant's own voice `name`, else the shared one; UnknownVoiceError if neither is
        registered, VoiceMismatchError if made by other weights."""
        profile = load_voice(self.registry.connection, tenant, name)
        return prompt_from_profile(profile, self.identity)

    def registry_of(self, owner: str) -> VoiceRegistry:
        """The registry an add-voice job stores into (a tenant's, or the shared voices)."""
        return VoiceRegistry(self.registry.connection, owner)
