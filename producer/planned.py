"""One job the client is about to enqueue: validated, with its id and queue chosen."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.jobs import SynthesisRequest, voice_label


@dataclass(frozen=True)
class PlannedJob:
    index: int  # position in the caller's request list
    job_id: str
    queue: str
    request: SynthesisRequest
    meta: dict[str, Any] = field(default_factory=dict)  # more job.meta (a document's segment)


Prelude = Callable[[Any], None]  # adds writes to a submit's first transaction (a pipeline)
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
