"""The producer side of cosyq: `CosyqClient` (Python API) and the `cosyq` command line.

Depends only on `shared/`; never imports torch, onnxruntime or coremltools (a test checks).
"""

from producer.client import CosyqClient
from producer.tracking import JobOutcome, JobStatus
from shared.audio_stream import AudioChunk
from shared.errors import (
    InvalidRequestError,
    JobCanceledError,
    JobFailedError,
    JobNotFoundError,
    QueueFullError,
    ResultTimeoutError,
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

__all__ = [
    "AudioChunk",
    "CosyqClient",
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
