"""The producer side of cosyq: `CosyqClient` (Python API) and the `cosyq` command line.

Depends only on `shared/`; never imports torch, onnxruntime or coremltools (a test checks).

The names below are imported on first use (`from producer import CosyqClient` works as ever):
importing any `producer.` module (the worker's `producer.webhooks.bodies`, `producer.cli`) ran
this file first, and its eager imports cost each of those processes the whole client (redis's
asyncio client, rq, numpy through the voices: 0.1-0.2 CPU s of a 0.7 s start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from producer.client import CosyqClient
    from producer.erasure import Erasure
    from producer.tracking import JobOutcome, JobStatus
    from shared.audio_stream import AudioChunk
    from shared.errors import (
        InvalidRequestError,
        JobCanceledError,
        JobFailedError,
        JobNotFoundError,
        QueueFullError,
        ResultTimeoutError,
        StillRunningError,
        StorageError,
        StreamExpiredError,
        StreamFailedError,
        StreamNotRequestedError,
        StreamTimeoutError,
        UnknownTenantError,
        UnknownVoiceError,
    )
    from shared.jobs import SynthesisRequest
    from shared.results import JobFailure, SynthesisResult
    from shared.settings import Settings, load_settings

# Each public name, and the module it comes from.
_HOMES = {
    "AudioChunk": "shared.audio_stream",
    "CosyqClient": "producer.client",
    "Erasure": "producer.erasure",
    "InvalidRequestError": "shared.errors",
    "JobCanceledError": "shared.errors",
    "JobFailedError": "shared.errors",
    "JobFailure": "shared.results",
    "JobNotFoundError": "shared.errors",
    "JobOutcome": "producer.tracking",
    "JobStatus": "producer.tracking",
    "QueueFullError": "shared.errors",
    "ResultTimeoutError": "shared.errors",
    "Settings": "shared.settings",
    "StillRunningError": "shared.errors",
    "StorageError": "shared.errors",
    "StreamExpiredError": "shared.errors",
    "StreamFailedError": "shared.errors",
    "StreamNotRequestedError": "shared.errors",
    "StreamTimeoutError": "shared.errors",
    "SynthesisRequest": "shared.jobs",
    "SynthesisResult": "shared.results",
    "UnknownTenantError": "shared.errors",
    "UnknownVoiceError": "shared.errors",
    "load_settings": "shared.settings",
}

__all__ = [
    "AudioChunk",
    "CosyqClient",
    "Erasure",
    "InvalidRequestError",
    "JobCanceledError",
    "JobFailedError",
    "JobFailure",
    "JobNotFoundError",
    "JobOutcome",
    "JobStatus",
    "QueueFullError",
    "ResultTimeoutError",
    "Settings",
    "StillRunningError",
    "StorageError",
    "StreamExpiredError",
    "StreamFailedError",
    "StreamNotRequestedError",
    "StreamTimeoutError",
    "SynthesisRequest",
    "SynthesisResult",
    "UnknownTenantError",
    "UnknownVoiceError",
    "load_settings",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module the first time it is asked for (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'producer' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
