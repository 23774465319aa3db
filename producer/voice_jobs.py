"""Producer side of voices: upload a prompt, enqueue the add-voice job, wait for its summary.

Producers have no model: `cosyq voices add` checks the recording with the same rules the worker
applies (readable, >= 16 kHz, not too long, not silent) so mistakes show at once, stores it under
`voices/<name>/` in the configured storage (where every worker can read it), and enqueues
`workers.tasks.add_voice(name, prompt_audio=<uri>, transcript)` on the high-priority queue. The
worker computes the features and stores the profile in Redis; the job returns its summary.
"""

from __future__ import annotations

import uuid
from pathlib import PurePath

import redis
from rq import Queue
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer

from producer.tracking import JobTracker, failure_of
from shared import keys
from shared.errors import (
    JobFailedError,
)
from shared.settings import Settings
from shared.storage import open_storage
from shared.submitted import record_submitted
from shared.voices import (
    VOICE_UPLOAD_PREFIX,
    VoiceSummary,
    check_prompt_audio,
    check_transcript,
    check_voice_name,
    decode_prompt_audio,
)

UPLOAD_CONTENT_TYPE = "application/octet-stream"  # any format soundfile reads


def new_upload_key(name: str, filename: str) -> str:
    """voices/<name>/<random>.<suffix>: a new object per upload, never an overwrite."""
    suffix = PurePath(filename).suffix.lstrip(".").lower()
    suffix = suffix if suffix.isalnum() else "audio"
    return f"{VOICE_UPLOAD_PREFIX}/{name}/{uuid.uuid4().hex}.{suffix or 'audio'}"


def enqueue_add_voice(
    connection: redis.Redis,
    settings: Settings,
    *,
    name: str,
    audio: bytes,
    transcript: str,
    filename: str,
    function: str,
) -> str:
    """Check, upload, enqueue; returns the job id."""
    check_voice_name(name)
    transcript = check_transcript(transcript, settings.max_text_chars)
    samples, rate = decode_prompt_audio(audio, where=filename)
    check_prompt_audio(samples, rate, settings.max_prompt_seconds)
    stored = open_storage(settings).put(
        new_upload_key(name, filename), audio, UPLOAD_CONTENT_TYPE, {"voice": name}
    )
    queue = Queue(keys.QUEUE_HIGH, connection=connection, serializer=JSONSerializer)
    job_id = uuid.uuid4().hex
    record_submitted(connection, [job_id])  # first: an id with no job is simply forgotten
    job = queue.enqueue(
        function,
        kwargs={"name": name, "prompt_audio": stored.uri, "transcript": transcript},
        job_id=job_id,
        job_timeout=settings.job_timeout_s,
        result_ttl=settings.result_ttl_s,
        failure_ttl=settings.failure_ttl_s,
        description=f"add voice {name}",
        meta={keys.SUBMIT_META_KEY: {"voice": name, "kind": "add_voice"}},
    )
    return str(job.id)


def wait_for_voice(tracker: JobTracker, job_id: str, timeout: float) -> VoiceSummary:
    """The added voice's summary; JobFailedError with the worker's reason when it failed."""
    state = tracker.wait_until_done(job_id, timeout, what="add-voice job")
    return _summary(tracker.fetch(job_id), state)


def _summary(job: Job, state: str) -> VoiceSummary:
    latest = job.latest_result() if state == "finished" else None
    if latest is None or latest.type != Result.Type.SUCCESSFUL:
        failure = failure_of(job, state)
        raise JobFailedError(job.id, failure.kind, failure.message)
    value = latest.return_value
    try:
        if not isinstance(value, dict):
            raise TypeError(f"expected a JSON object, got {type(value).__name__}")
        return VoiceSummary.from_dict(value)
    except (ValueError, TypeError) as e:
        raise JobFailedError(job.id, "internal", f"unreadable add-voice result ({e})") from e
