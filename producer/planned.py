"""One job the client is about to enqueue: validated, with its id and queue chosen."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.jobs import SynthesisRequest


@dataclass(frozen=True)
class PlannedJob:
    index: int  # position in the caller's request list
    job_id: str
    queue: str
    request: SynthesisRequest
    meta: dict[str, Any] = field(default_factory=dict)  # more job.meta (a document's segment)


OnSubmitted = Callable[[list[tuple[int, str]]], None]  # (request index, job id) per chunk
