"""The error hierarchy shared by producer and workers.

Three kinds matter operationally: a bad request (permanent, never retried), a model that cannot
be loaded (start-up, the worker exits non-zero before taking a job), and a transient fault
(storage or Redis unreachable: retried with backoff). Code raises these with `from e`; only the
job boundary catches broadly.
"""

from __future__ import annotations


class CosyqError(Exception):
    """Base class for every error cosyq raises on purpose."""


class InvalidRequestError(CosyqError):
    """The request can never succeed as written (bad field, unknown voice, unreadable prompt)."""


class ModelLoadError(CosyqError):
    """A model directory, checkpoint or converted package is missing, corrupt or mismatched."""


class TransientError(CosyqError):
    """A fault outside the request that may pass (storage or Redis unreachable)."""


class WorkerModelFailedError(TransientError):
    """The worker's model failed (its batch session's model thread crashed) before this job
    could run on it: nothing is wrong with the job, which is retried on a fresh worker."""

    def __init__(self, message: str = "this worker's model failed before the job ran on it"):
        super().__init__(message)


class SettingsError(CosyqError):
    """The deployment settings are wrong (unknown COSYQ_ variable, bad value): fix and restart."""


class StorageError(CosyqError):
    """Storage refused an operation for a reason that retrying will not fix (no such bucket)."""


class StorageUnavailableError(TransientError):
    """Storage failed in a way that may pass (timeout, reset, HTTP 5xx, SlowDown, disk full)."""


class QualityError(CosyqError):
    """The audio was judged suspect and the request said `on_suspect: fail` (or every retry
    was suspect too): permanent, never retried by the queue. `reasons` are the check's."""

    def __init__(self, message: str, *, reasons: tuple[str, ...] = ()):
        super().__init__(message)
        self.reasons = reasons


class ObjectNotFoundError(InvalidRequestError):
    """A URI names an object or file that does not exist (a prompt audio URI, a result)."""


class SubmitInterruptedError(TransientError):
    """`submit_many` stopped part way (Redis out of memory, or unreachable): `submitted` holds
    the ids of the requests that went in before it, in request order, so a caller resumes with
    the rest instead of submitting them twice."""

    def __init__(self, message: str, *, submitted: tuple[str, ...] = ()):
        super().__init__(message)
        self.submitted = submitted


class QueueFullError(TransientError):
    """A queue holds `max_queue_depth` jobs already: submit later or slower.

    `submitted` holds the job ids a `submit_many` call enqueued before the queue filled, in
    request order, so a caller can resume with the rest.
    """

    def __init__(self, message: str, *, queue: str, depth: int, submitted: tuple[str, ...] = ()):
        super().__init__(message)
        self.queue = queue
        self.depth = depth
        self.submitted = submitted


class TenantQuotaError(TransientError):
    """A tenant is at one of its quotas (`quota`: max_queued_jobs or requests_per_minute).

    `retry_after_s` is when asking again may succeed; `submitted` holds the ids a
    `submit_many` call enqueued before the quota was reached, as QueueFullError's does.
    """

    def __init__(
        self,
        message: str,
        *,
        tenant: str,
        quota: str,
        retry_after_s: int,
        submitted: tuple[str, ...] = (),
    ):
        super().__init__(message)
        self.tenant = tenant
        self.quota = quota
        self.retry_after_s = retry_after_s
        self.submitted = submitted


class JobNotFoundError(CosyqError):
    """No job with this id exists in Redis (never submitted, or expired after its TTL)."""


class InvalidJobIdError(InvalidRequestError):
    """A string that cannot be a job id (a path, an empty string): no job can have it."""


class JobFailedError(CosyqError):
    """A job ended without a result; `kind` is the worker's reason kind (invalid_request, ...)."""

    def __init__(self, job_id: str, kind: str, message: str):
        super().__init__(f"job {job_id} failed ({kind}): {message}")
        self.job_id = job_id
        self.kind = kind
        self.reason = message


class StillRunningError(CosyqError):
    """An erasure found its job (or a document's segment or assembly) still running after its
    cancel: it stops at its next step; nothing was erased (erase it again once it has)."""


class JobCanceledError(JobFailedError):
    """The job was canceled (`cosyq cancel`, `DELETE /v1/jobs/{id}`): it has no result."""

    def __init__(self, job_id: str, message: str = "canceled before it finished"):
        super().__init__(job_id, "canceled", message)


class ResultTimeoutError(CosyqError, TimeoutError):
    """A job did not finish within the time the caller was willing to wait."""


class AudioDecodeError(InvalidRequestError):
    """Bytes that no audio decoder accepts (an unreadable or truncated prompt file)."""


class EmptyTextError(InvalidRequestError):
    """Nothing speakable is left of the text after normalisation (only spaces or punctuation)."""


class UnknownVoiceError(InvalidRequestError):
    """A request or command names a voice that is not registered."""


class UnknownTenantError(InvalidRequestError):
    """A tenant name that is malformed or that this deployment does not configure."""


class VoiceQuotaError(InvalidRequestError):
    """A tenant already keeps its max_voices voices: a new one is refused until one is removed
    (waiting does not help, so it is no TransientError, unlike the other quotas)."""


class VoiceMismatchError(InvalidRequestError):
    """A voice profile was computed with other model weights than the worker runs."""


class PromptAudioError(InvalidRequestError):
    """Prompt audio that cannot make a voice; the subclasses say why."""


class PromptUnreadableError(PromptAudioError, AudioDecodeError):
    """Prompt audio bytes that no decoder reads (or that hold no samples)."""


class PromptTooLongError(PromptAudioError):
    """Prompt audio longer than max_prompt_seconds (the speech tokenizer takes at most 30 s)."""


class PromptSilentError(PromptAudioError):
    """Prompt audio with no signal in it (all zeros, or quieter than the silence threshold)."""


class PromptSampleRateError(PromptAudioError):
    """Prompt audio recorded below 16 kHz (the prompt models work at 16 kHz, never upsampled)."""


class StreamNotRequestedError(CosyqError):
    """The job did not ask for an audio stream (submit it with `stream: true`)."""


class StreamExpiredError(CosyqError):
    """The job's audio stream is gone (kept as long as results, COSYQ_RESULT_TTL_S)."""


class StreamTimeoutError(CosyqError, TimeoutError):
    """A stream's final chunk did not arrive within the time the caller was willing to wait."""


class StreamFailedError(JobFailedError):
    """The streamed job failed: its stream ended with the worker's error kind and message."""
