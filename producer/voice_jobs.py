"""Producer side of voices: upload a prompt, enqueue the add-voice job, wait for its summary.

Producers have no model: `cosyq voices add` checks the recording with the same rules the worker
applies (readable, >= 16 kHz, not too long, not silent) so mistakes show at once, stores it under
`voices/<owner>/<name>/` in the configured storage (where every worker can read it; the owner
is the tenant, or `_shared`), and enqueues `workers.tasks.add_voice(name, prompt_audio=<uri>,
transcript, owner)` on the tenant's queue of its highest priority (`high`, unless
COSYQ_TENANT_MAX_PRIORITY holds it to `default`), tagged with the tenant. The worker
computes the features and stores the profile in the owner's registry; the job returns its
summary.
"""

from __future__ import annotations

import io
import time
import uuid

import redis
import soundfile as sf
from rq import Queue
from rq.job import Job
from rq.queue import EnqueueData
from rq.results import Result
from rq.serializers import JSONSerializer

from producer.room import Room, refusal_of_one
from producer.tracking import JobTracker, failure_of
from shared import keys, tenants
from shared.errors import JobFailedError, QueueFullError, TenantQuotaError, UnknownVoiceError
from shared.jobs import DEFAULT_VOICE
from shared.settings import Settings
from shared.storage import open_storage
from shared.submitted import record_submitted
from shared.voice_uploads import UPLOAD_FILE_RE, VoiceUpload, forget_upload, note_upload
from shared.voices import (
    VoiceRegistry,
    VoiceSummary,
    check_owner,
    check_prompt_audio,
    check_transcript,
    check_voice_name,
    decode_prompt_audio,
    upload_folders,
    upload_key,
)

UPLOAD_CONTENT_TYPE = "application/octet-stream"  # any format soundfile reads
# soundfile's major format names -> the suffix an upload is stored with
_SUFFIX_OF_FORMAT = {
    "WAV": "wav",
    "WAVEX": "wav",
    "RF64": "wav",
    "W64": "w64",
    "FLAC": "flac",
    "OGG": "ogg",
    "MP3": "mp3",
    "AIFF": "aiff",
    "CAF": "caf",
    "AU": "au",
}


def new_upload_key(owner: str, name: str, audio: bytes) -> str:
    """voices/<owner>/<name>/<random>.<suffix>: a new object per upload, never an overwrite.
    The suffix is the format soundfile detected in the bytes, never the uploader's file name."""
    folder = upload_folders(owner, name)[0]
    return f"{folder}/{uuid.uuid4().hex}.{audio_suffix(audio)}"


def audio_suffix(audio: bytes) -> str:
    """The file suffix of the audio format in `audio` (wav, flac, ogg, mp3, ...); "audio" when
    soundfile names none it knows."""
    try:
        detected = sf.info(io.BytesIO(audio)).format
    except (sf.SoundFileError, RuntimeError, TypeError):
        return "audio"
    return _SUFFIX_OF_FORMAT.get(detected, "audio")


def enqueue_add_voice(
    connection: redis.Redis,
    settings: Settings,
    *,
    name: str,
    audio: bytes,
    transcript: str,
    filename: str,
    function: str,
    tenant: str,
    owner: str,
) -> str:
    """Check, upload, enqueue (in `tenant`'s highest queue, for `owner`: the tenant, or
    keys.SHARED_VOICES, within the tenant's quota); returns the job id. Refused for room
    (TenantQuotaError, QueueFullError), the upload is deleted again. A new name past the
    owner's max_voices is refused (VoiceQuotaError) before anything is uploaded."""
    check_voice_name(name)
    check_owner(owner)
    transcript = check_transcript(transcript, settings.max_text_chars)
    samples, rate = decode_prompt_audio(
        audio, where=filename, max_seconds=settings.max_prompt_seconds
    )
    check_prompt_audio(samples, rate, settings.max_prompt_seconds)
    if owner != keys.SHARED_VOICES:  # the worker checks again as it stores the voice
        VoiceRegistry(connection, owner).check_room(name, settings.max_voices(owner))
    storage = open_storage(settings)
    key = new_upload_key(owner, name, audio)
    # noted first: a process killed before its job is in leaves a recording housekeeping finds
    upload = VoiceUpload(owner, name, storage.uri_for(key), uuid.uuid4().hex)
    note_upload(connection, upload, at=time.time() + settings.voice_upload_grace_s)
    stored = storage.put(key, audio, UPLOAD_CONTENT_TYPE, {"voice": name})
    data = Queue.prepare_data(
        function,
        kwargs={"name": name, "prompt_audio": stored.uri, "transcript": transcript, "owner": owner},
        job_id=upload.job_id,
        timeout=settings.job_timeout_s,
        result_ttl=settings.result_ttl_s,
        failure_ttl=settings.failure_ttl_s,
        description=f"add voice {name}",
        meta={
            keys.SUBMIT_META_KEY: {"voice": name, "kind": "add_voice"},
            tenants.TENANT_META_KEY: tenant,
        },
    )
    try:
        return _enqueue_in_room(connection, settings, tenant, data)
    except (QueueFullError, TenantQuotaError):
        storage.delete(key)  # nothing will ever read it
        forget_upload(connection, upload)
        raise


def _enqueue_in_room(
    connection: redis.Redis, settings: Settings, tenant: str, data: EnqueueData
) -> str:
    """The add-voice job into `tenant`'s highest queue, in a MULTI/EXEC that WATCHes the tenant's
    queues and checks their depths first (as `CosyqClient._take_room`): an upload is a queued
    job like any other, within the tenant's max_queued_jobs and the queue's depth."""
    room = Room.for_tenant(settings, tenant)
    queues = {
        name: Queue(name, connection=connection, serializer=JSONSerializer)
        for name in tenants.tenant_queues(tenant)
    }
    # its highest priority: a tenant held to `default` (COSYQ_TENANT_MAX_PRIORITY) would hold
    # back every tenant's default jobs with uploads in `high`, workers' first queue
    target = tenants.queue_name(keys.queue_for(settings.max_priority(tenant)), tenant)
    with connection.pipeline() as pipe:
        while True:
            pipe.watch(*(queue.key for queue in queues.values()))
            depths = {name: int(pipe.llen(queue.key)) for name, queue in queues.items()}
            refusal = refusal_of_one(room, target, depths)
            if refusal is not None:
                pipe.reset()
                raise refusal
            pipe.multi()
            record_submitted(pipe, [data.job_id])
            queues[target].enqueue_many([data], pipeline=pipe)
            try:
                pipe.execute()
            except redis.WatchError:
                # a queue changed meanwhile: read the depths again; unless the job is in (the
                # connection was lost after Redis applied it: redis-py says WatchError too)
                if not connection.exists(Job.key_for(str(data.job_id))):
                    continue
            return str(data.job_id)


def remove_voice(connection: redis.Redis, settings: Settings, name: str, owner: str) -> None:
    """Unregister `owner`'s voice and delete the recording `cosyq voices add` uploaded for it
    (UnknownVoiceError when that owner has none: another owner's voice is never touched)."""
    if name == DEFAULT_VOICE:
        raise UnknownVoiceError(
            f"voice: {DEFAULT_VOICE!r} is the model's built-in voice (the model directory's "
            "prompt.wav), not a registered one: it cannot be removed"
        )
    removed = VoiceRegistry(connection, owner).remove(name)
    located = upload_location(owner, name, removed.source_uri)
    if located is not None:
        base, key = located
        open_storage(settings.model_copy(update={"storage_url": base})).delete(key)
        return
    storage = open_storage(settings)
    own = upload_key(storage.uri_for, owner, name, removed.source_uri)
    if own is not None:
        storage.delete(own)


def upload_location(owner: str, name: str, uri: str | None) -> tuple[str, str] | None:
    """(storage base URI, key) of a recording uploaded for `owner`'s voice `name`: a URI
    ending in voices/<owner>/<name>/<32 hex>.<suffix> (or, for "default", voices/<name>/...).
    Read from the URI itself, not from this process's COSYQ_STORAGE_URL, so `rm` finds the
    recording wherever `add` stored it (the default storage folder follows the working
    directory). None for any other URI."""
    if not uri:
        return None
    for folder in upload_folders(owner, name):
        base, marker, file = uri.rpartition(f"/{folder}/")
        if marker and base and UPLOAD_FILE_RE.fullmatch(file):
            return base, f"{folder}/{file}"
    return None


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
