"""Every Redis key and queue name cosyq uses, in one place.

RQ owns its own `rq:*` keys; ours live under `cosyq:`. Workers listen on the three queues in
priority order, so a `high` job is always taken before a waiting `default` one.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from shared.errors import InvalidJobIdError

Priority = Literal["high", "default", "low"]

QUEUE_HIGH = "cosyq-high"
QUEUE_DEFAULT = "cosyq-default"
QUEUE_LOW = "cosyq-low"
QUEUE_BY_PRIORITY: dict[str, str] = {
    "high": QUEUE_HIGH,
    "default": QUEUE_DEFAULT,
    "low": QUEUE_LOW,
}
QUEUES_IN_PRIORITY_ORDER: tuple[str, ...] = (QUEUE_HIGH, QUEUE_DEFAULT, QUEUE_LOW)

PREFIX = "cosyq:"
DEFAULT_TENANT = "default"  # shared.tenants.DEFAULT_TENANT (that module imports this one)
# + [tenant ":"] sha256(key) -> "<job id> <reserved at>[ <enqueued at>]"
# (TTL; producer/idempotency.py; tenant_digest)
IDEMPOTENCY_PREFIX = PREFIX + "idem:"
# Voices, per owner: a tenant, or SHARED_VOICES (an operator's, usable by every tenant). The
# tenant "default" keeps the keys voices had before tenants (`cosyq:voice:<name>`, the set
# `cosyq:voices`), so voices stored then stay its own; every other owner adds ":<owner>".
VOICE_PREFIX = PREFIX + "voice:"  # + [owner ":"] voice name -> the voice profile (JSON)
VOICES_SET = PREFIX + "voices"  # [+ ":" owner]: set of an owner's voice names
SHARED_VOICES = "_shared"  # the owner of shared voices: no tenant name starts with "_"
DEFAULT_VOICE_OWNER = "default"  # shared.tenants.DEFAULT_TENANT (which imports this module)
JOB_HEARTBEAT_PREFIX = PREFIX + "job-heartbeat:"  # + job id, refreshed while a job runs
# The orphan sweep's index (workers/service/orphans.py): every submitted job id, scored by its
# submit time, then by when the sweep last found it where it belongs.
SUBMITTED_JOBS = PREFIX + "submitted"
ORPHAN_SUSPECTS = PREFIX + "orphan-suspects"  # job id -> when first seen queued in no list
ORPHAN_SWEEP_LOCK = PREFIX + "orphan-sweep-lock"  # one sweeper per housekeeping tick
WORKER_STATS_PREFIX = PREFIX + "worker-stats:"  # + worker name -> hash of the worker's WorkerStats
WORKER_STATES = ("starting", "loading", "idle", "busy", "retiring", "stopping")  # its "state"
START_FAILURE_PREFIX = PREFIX + "start-failure:"  # + host:slot -> why workers there cannot start
CANCEL_PREFIX = PREFIX + "cancel:"  # + job id -> the cancel's token (result TTL): stop it
# + job id -> set of the digests of its keyed cancels (result TTL): what an erasure deletes
CANCEL_RECORDS_PREFIX = PREFIX + "cancel-records:"
# the job hash's field naming the cancel (its token) a canceled job is told to: the one whose
# flag the worker read, or whose own transaction canceled it (producer/cancel.py)
CANCELED_BY_FIELD = "cosyq_canceled_by"
# Voice uploads in flight (shared/voice_uploads.py): sorted set of upload JSON (owner, name,
# recording URI, add-voice job id) scored by when housekeeping looks at it; and its lock.
VOICE_UPLOADS = PREFIX + "voice-uploads"
VOICE_UPLOAD_SWEEP_LOCK = PREFIX + "voice-upload-sweep-lock"  # one sweeper per tick
CANCELED_SWEEP_LOCK = PREFIX + "canceled-sweep-lock"  # one expired-cancel sweeper per tick
AUDIO_STREAM_PREFIX = PREFIX + "audio:"  # + job id -> Redis Stream of a streamed job's audio chunks
# A job's stored audio, deleted once the job has expired (workers/service/audio_expiry.py):
AUDIO_RECORDS = PREFIX + "audio-records"  # hash: job id -> JSON {key, tenant}
AUDIO_DUE = PREFIX + "audio-due"  # sorted set: job id -> when to look at its job again
AUDIO_EXPIRY_LOCK = PREFIX + "audio-expiry-lock"  # one deleter per housekeeping tick
# Webhooks (shared/webhooks.py, producer/webhooks/): the workers' outbox (a Redis Stream read by the
# dispatchers' consumer group), deliveries waiting for their next try, and dead letters.
WEBHOOK_OUTBOX = PREFIX + "webhooks:outbox"
WEBHOOK_GROUP = "cosyq-webhooks"  # the dispatchers' consumer group on the outbox
WEBHOOK_RETRY = PREFIX + "webhooks:retry"  # sorted set: delivery JSON scored by its next try
WEBHOOK_DEAD = PREFIX + "webhooks:dead"  # hash: webhook id -> delivery JSON with why it died
WEBHOOK_DEAD_AT = PREFIX + "webhooks:dead-at"  # sorted set: webhook id -> when it died
WEBHOOK_EVENT_SEEN_PREFIX = PREFIX + "webhooks:seen:"  # + webhook id: its event was appended
WEBHOOK_BODY_PREFIX = PREFIX + "webhooks:body:"  # + webhook id: a job event's body, kept
WEBHOOK_UNKEPT = PREFIX + "webhooks:unkept"  # sorted set: a job event with no body kept yet ->
# when to look at it (appended with the event; producer/webhooks/bodies.py removes it)
WEBHOOK_UNKEPT_LOCK = PREFIX + "webhooks:unkept-lock"  # one keeper per housekeeping tick
# The operator's page (shared/job_index.py): jobs and documents by submit time, all and per
# tenant (+ ":" tenant), suspect results waiting for a judgement, judgements, throughput per minute
JOB_INDEX = PREFIX + "index:jobs"  # [+ ":" tenant]: sorted set, job id -> submit time
DOCUMENT_INDEX = PREFIX + "index:documents"  # [+ ":" tenant]: document id -> submit time
INDEX_TRIM_CURSORS = PREFIX + "index:trim-cursors"  # hash: an index's key -> where its trim goes on
SUSPECT_INDEX = PREFIX + "index:suspects"  # [+ ":" tenant]: suspect job id -> when it finished
JOB_SUMMARY_PREFIX = PREFIX + "index:summary:"  # + job id -> JSON: verdict, audio s (result TTL)
JUDGEMENT_PREFIX = PREFIX + "judgement:"  # + job id -> JSON: accepted/regenerated/failed, by, at
STOPPED_WORKERS = PREFIX + "index:workers-stopped"  # sorted set: worker name -> when it stopped
STOPPED_WORKER_STATS = PREFIX + "index:workers-stopped-stats"  # hash: name -> its last stats JSON
UI_SESSION_PREFIX = PREFIX + "ui-session:"  # + sha256(session id) -> JSON: who signed in, csrf
THROUGHPUT_PREFIX = (
    PREFIX + "throughput:"
)  # + [tenant ":"] unix minute -> hash: jobs, audio_s, failed
QUOTA_PREFIX = PREFIX + "quota"  # + ":" + the `limits` library's key: a tenant's request window
AUTH_FAILURE_PREFIX = PREFIX + "auth-failures"  # + ":" + `limits` key: an address's wrong keys

# Dotted paths of the job functions (RQ JSON serializer: the producer never imports them).
SYNTHESIZE_FUNCTION = "workers.tasks.synthesize"
ADD_VOICE_FUNCTION = "workers.tasks.add_voice"

# job.meta keys
ERROR_META_KEY = "cosyq_error"  # {"kind": ..., "message": ...} written by the worker on failure
LAST_ERROR_META_KEY = "cosyq_last_error"  # why the previous attempt of a retried job failed
ATTEMPT_META_KEY = "cosyq_attempt"  # set by the worker before each attempt (1-based)
RUN_META_KEY = "cosyq_run"  # 2, 3, ...: a job that ended and was requeued by hand runs again
SUBMIT_META_KEY = "cosyq_submit"  # what the producer recorded at submit time (no text)


# What a job id may be: ours are uuid4 hex; RQ's own rule is letters, digits, '_' and '-'.
JOB_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
JOB_ID_RULE = "1-64 letters, digits, '_' or '-'"


def check_job_id(job_id: str) -> str:
    """The id if it can name a job; InvalidJobIdError (never RQ's ValueError) otherwise."""
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        raise InvalidJobIdError(f"job id {job_id!r}: a job id is {JOB_ID_RULE}")
    return job_id


def queue_for(priority: str) -> str:
    """The RQ queue name for a request priority."""
    return QUEUE_BY_PRIORITY[priority]


def idempotency_key(key: str, tenant: str) -> str:
    """The Redis key guarding one tenant's idempotency key (`tenant_digest`)."""
    return IDEMPOTENCY_PREFIX + tenant_digest(key, tenant)


def cancel_idempotency_key(job_id: str, digest: str) -> str:
    """Where a keyed cancel of `job_id` keeps its verdict for its retries (producer/cancel.py);
    `digest` is the key's `tenant_digest`. Two ':' at least after the prefix: never a submit's."""
    return f"{IDEMPOTENCY_PREFIX}cancel:{job_id}:{digest}"


def tenant_digest(key: str, tenant: str) -> str:
    """A caller's key as one tenant's Redis name: sha256 (any length, no odd characters),
    after `<tenant>:` for a named tenant, so two tenants' equal keys are two names. The default
    tenant's is the bare digest, the form from before tenants: its keys claimed then still
    dedupe. No digest holds ':', so the two forms never meet."""
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    return digest if tenant == DEFAULT_TENANT else f"{tenant}:{digest}"


def voice_key(name: str, owner: str) -> str:
    """One owner's voice `name` (voice names hold no ':', so owners never collide)."""
    return VOICE_PREFIX + _owned(owner) + name


def voices_set(owner: str) -> str:
    """The set of one owner's voice names."""
    return VOICES_SET + (":" + owner if _owned(owner) else "")


def _owned(owner: str) -> str:
    return "" if owner == DEFAULT_VOICE_OWNER else owner + ":"


def default_voice_key(checkpoint_hash: str, prompt_digest: str) -> str:
    """The default voice's features for one model and one prompt.wav/prompt.txt pair."""
    return f"{PREFIX}default-voice:{checkpoint_hash}:{prompt_digest}"


def job_heartbeat_key(job_id: str) -> str:
    return JOB_HEARTBEAT_PREFIX + job_id


def cancel_key(job_id: str) -> str:
    """The flag a running job's worker checks at each piece or LLM step (shared/cancels)."""
    return CANCEL_PREFIX + job_id


def cancel_records_key(job_id: str) -> str:
    """The digests of `job_id`'s keyed cancels (`cancel_idempotency_key`): an erasure finds
    their verdicts here, as it cannot make a caller's key from the job."""
    return CANCEL_RECORDS_PREFIX + job_id


def audio_stream_key(job_id: str) -> str:
    """The Redis Stream a job with `stream: true` appends its audio chunks to."""
    return AUDIO_STREAM_PREFIX + job_id


def worker_stats_key(worker_name: str) -> str:
    return WORKER_STATS_PREFIX + worker_name
