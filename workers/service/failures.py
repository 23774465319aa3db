"""What a job's exception means: permanent, transient (retry with backoff) or internal.

Permanent comes in two kinds: `invalid_request` (the request's fault) and `storage` (storage
refused the write for a reason retrying will not fix: the deployment's fault, not a bug).

The job boundary is the one place that catches broadly; this module turns whatever was raised
into the short reason stored in job.meta["cosyq_error"] and shown by `cosyq status/failed`.
Messages never carry the request text (validation errors name fields and rules only), nor a
URL's credentials (a library's error quoting an endpoint with user:password@ is masked, the user
name too: the job's tenant reads the reason through the API and its webhook).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from rq.timeouts import JobTimeoutException

from shared.connection import misconfiguration
from shared.errors import InvalidRequestError, QualityError, StorageError, TransientError
from shared.results import JobFailure
from shared.settings_env import redact_urls
from workers.engine.api import SynthesisCanceled
from workers.service.admission import RefusedJobError

CANCELED_KIND = "canceled"
MAX_MESSAGE_CHARS = 500
MAX_INTERNAL_CHARS = 200  # an unexpected error's first line only: the traceback is in the log


@dataclass(frozen=True)
class JobError:
    """One failed attempt, classified."""

    kind: str  # invalid_request, storage, transient, worker_died, internal, quality, canceled
    message: str
    retryable: bool
    timed_out: bool = False

    def as_meta(self) -> dict[str, str]:
        return JobFailure(kind=self.kind, message=self.message).as_meta()

    @property
    def wants_traceback(self) -> bool:
        """Only unexpected errors are worth a traceback in the logs and the failed registry."""
        return self.kind == "internal"


def classify(error: BaseException, *, timeout_s: float | None = None) -> JobError:
    """Map an exception raised by a job to its kind and short message."""
    text = _short(error)
    if isinstance(error, SynthesisCanceled):  # recorded as canceled, never failed or retried
        return JobError(CANCELED_KIND, "canceled before it finished", retryable=False)
    if isinstance(error, InvalidRequestError | RefusedJobError):
        return JobError("invalid_request", text, retryable=False)
    if isinstance(error, QualityError):
        return JobError("quality", text, retryable=False)
    if isinstance(error, JobTimeoutException):
        limit = f" after {timeout_s:g} s" if timeout_s else ""
        return JobError("transient", f"job timed out{limit}", retryable=True, timed_out=True)
    if isinstance(error, StorageError):
        return JobError("storage", text, retryable=False)
    if isinstance(error, TransientError):
        return JobError("transient", text, retryable=True)
    if (refused := misconfiguration(error)) is not None:  # the worker's settings, not an outage
        return JobError("internal", f"Redis refused this worker: {refused}", retryable=False)
    if isinstance(error, redis.ConnectionError | redis.TimeoutError | ConnectionError):
        return JobError("transient", f"{type(error).__name__}: {text}", retryable=True)
    return JobError("internal", _internal(error), retryable=False)


def _internal(error: BaseException) -> str:
    """`Type: first line`, cut short: a bug's reason, not a library's parameter dump."""
    name = type(error).__name__
    lines = redact_urls(str(error), keep_user=False).strip().splitlines()
    text = f"{name}: {' '.join(lines[0].split())}" if lines else name
    if len(text) > MAX_INTERNAL_CHARS:
        text = text[: MAX_INTERNAL_CHARS - 3] + "..."
    return text


def _short(error: BaseException) -> str:
    text = " ".join(redact_urls(str(error), keep_user=False).split()) or type(error).__name__
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 3] + "..."
    return text
