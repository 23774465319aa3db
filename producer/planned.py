"""One job the client is about to enqueue: validated, with its id and queue chosen; and the
checks that need Redis before it is (its voice is registered)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import redis

from shared.errors import UnknownVoiceError
from shared.jobs import DEFAULT_VOICE, SynthesisRequest, voice_label
from shared.voices import missing_voices, unknown_voice


@dataclass(frozen=True)
class PlannedJob:
    index: int  # position in the caller's request list
    job_id: str
    queue: str
    request: SynthesisRequest
    meta: dict[str, Any] = field(default_factory=dict)  # more job.meta (a document's segment)


class Prelude(Protocol):
    """What a submit's first transaction carries besides its jobs (a document's plan)."""

    def check(self, pipe: Any) -> None:
        """Before the MULTI, on the pipeline WATCHing the queues: WATCH and read what the
        writes depend on; raise to submit nothing."""

    def write(self, pipe: Any) -> None:
        """Queue the writes in the transaction."""


OnSubmitted = Callable[[list[tuple[int, str]]], None]  # (request index, job id) per chunk


def submit_meta(request: SynthesisRequest) -> dict[str, Any]:
    """What the producer records on the job for status displays: sizes and names, no text."""
    return {
        "submitted_at": datetime.now(UTC).isoformat(),
        "text_chars": len(request.text),
        "voice": voice_label(request),
        "mode": request.mode,
        "priority": request.priority,
        "idempotency_key": request.idempotency_key,
    }


def require_voices(
    connection: redis.Redis, tenant: str, planned: Sequence[PlannedJob], *, indexed: bool
) -> None:
    """UnknownVoiceError, before anything is enqueued, for the first job naming a voice the
    tenant has not registered and no shared voice has (the worker checks again: a voice may
    be removed while its jobs wait). Another tenant's voice is never found."""
    names = {job.request.voice for job in planned} - {None, DEFAULT_VOICE}
    missing = missing_voices(connection, tenant, [name for name in names if name])
    for job in planned:
        if job.request.voice in missing:
            error = unknown_voice(tenant, job.request.voice)
            if indexed:
                error = UnknownVoiceError(f"requests[{job.index}]: {error}")
            raise error
