"""`CosyqClient`: what a backend service calls to enqueue speech jobs and collect results.

This module is the one place jobs are enqueued. A job is RQ's JSON-serialized call of the dotted
path `workers.tasks.synthesize` with `request=<request dict>`: the producer never imports the
worker code, and no pickle crosses Redis.

Round trips: `submit_many` sends each chunk of up to `submit_chunk_size` jobs in one
transaction (MULTI/EXEC) that WATCHes the tenant's queues whose depths it read (one LLEN each)
to choose the chunk: the quota and depth check and the enqueue are one atomic step, retried when
another producer or a worker changed a queue meanwhile. A chunk holding idempotency keys WATCHes
them too and costs one more round trip, to read who holds them (`producer.idempotency`, keys
per tenant); the enqueue transaction claims them: the first submitter of a key in a tenant wins,
later ones get the first job's id while that job exists, and a submitter killed at any moment
leaves the job and its key or neither. Once a job is deleted (`rq empty`) its key is free. A
request's output_key is placed under the tenant's storage prefix here (shared/output_keys.py).
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import redis
from redis.client import Pipeline
from rq import Queue, Retry
from rq.job import Job
from rq.serializers import JSONSerializer

from producer import document_submit, documents
from producer.cancel import CancelOutcome, cancel_job, idempotency_digest
from producer.erasure import Erasing
from producer.idempotency import claim as claim_idempotency_keys
from producer.idempotency import holders as idempotency_holders
from producer.planned import OnSubmitted, PlannedJob, Prelude, require_voices, submit_meta
from producer.room import Room, check_priority, interrupted
from producer.streaming import read_stream
from producer.tracking import JobOutcome, JobStatus, JobTracker
from producer.voice_jobs import enqueue_add_voice, remove_voice, wait_for_voice
from shared import keys, tenants
from shared.audio_stream import AudioChunk
from shared.connection import follow_master, redis_connection
from shared.document_state import DocumentResult
from shared.errors import (
    InvalidRequestError,
    UnknownTenantError,
)
from shared.job_events import WebhookPolicy
from shared.job_index import index_jobs
from shared.jobs import (
    RequestLimits,
    SynthesisRequest,
    retry_intervals,
    validate_request,
    wire_request,
)
from shared.output_keys import place_output_key
from shared.results import SynthesisResult
from shared.settings import Settings
from shared.submitted import record_submitted
from shared.voices import VoiceRegistry, VoiceSummary

RequestLike = SynthesisRequest | Mapping[str, Any]


_PlannedJob = PlannedJob  # the name this module has always used
_DEPTHS_SCRIPT = (
    "local n = {} for i, key in ipairs(KEYS) do n[i] = redis.call('LLEN', key) end return n"
)


class CosyqClient(Erasing):
    """Submit synthesis jobs and read their results; built from Settings.

    Options (keyword-only): `tenant` is whose jobs these are ("default"; one of
    settings.tenant_names(), else UnknownTenantError): its own queues, its quota, its name on
    each job; `connection` reuses a Redis client (else one from settings.redis_url);
    `job_function` and `voice_function` are the dotted paths enqueued (tests point them at
    test doubles; the product always uses workers.tasks.synthesize and workers.tasks.add_voice).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        tenant: str = tenants.DEFAULT_TENANT,
        connection: redis.Redis | None = None,
        job_function: str = keys.SYNTHESIZE_FUNCTION,
        voice_function: str = keys.ADD_VOICE_FUNCTION,
    ) -> None:
        self.settings = settings
        self.tenant = _known_tenant(settings, tenant)
        self.connection = connection if connection is not None else redis_connection(settings)
        self.job_function = job_function
        self.voice_function = voice_function
        self.limits = RequestLimits.from_settings(settings, resolve_names=True)
        self._queues = self._tenant_queues()
        self.tracker = JobTracker(self.connection, settings)

    def _tenant_queues(self) -> dict[str, Queue]:
        return {
            name: Queue(name, connection=self.connection, serializer=JSONSerializer)
            for name in tenants.tenant_queues(self.tenant)
        }

    def for_tenant(self, tenant: str) -> CosyqClient:
        """This client (same connection, same settings) submitting as another tenant."""
        if tenant == self.tenant:
            return self
        bound = copy.copy(self)
        bound.tenant = _known_tenant(self.settings, tenant)
        bound._queues = bound._tenant_queues()
        return bound

    def queue_for(self, priority: str) -> str:
        """The queue this client's jobs of one priority wait in; InvalidRequestError above the
        tenant's max_priority (`producer.room.check_priority`)."""
        check_priority(self.settings, self.tenant, priority)
        return tenants.queue_name(keys.queue_for(priority), self.tenant)

    def __enter__(self) -> CosyqClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.connection.close()

    # ---- submitting

    def submit(self, request: RequestLike) -> str:
        """Validate and enqueue one request; returns its job id (the first job's id when the
        idempotency key was seen before). Raises InvalidRequestError ("field: rule", no
        request index) or QueueFullError."""
        return self._submit(self._plan([request], indexed=False), None)[0]

    def submit_many(
        self, requests: Iterable[RequestLike], *, on_submitted: OnSubmitted | None = None
    ) -> list[str]:
        """Validate all, then enqueue in pipelined chunks; job ids in request order.

        Nothing is enqueued if any request is invalid (the error names its index). Each chunk
        goes in whole or not at all; `on_submitted` gets its (index, job id) pairs as soon as it
        is in Redis. When a queue is full, QueueFullError carries the ids already submitted (or,
        with backpressure "block", this waits up to backpressure_timeout_s for room); when
        Redis refuses a chunk (out of memory, unreachable), SubmitInterruptedError does.
        """
        return self._submit(self._plan(requests), on_submitted)

    def submit_planned(
        self,
        planned: list[_PlannedJob],
        *,
        on_submitted: OnSubmitted | None = None,
        whole: bool = False,
        prelude: Prelude | None = None,
    ) -> list[str]:
        """Enqueue already validated jobs (`submit_many`'s second half; documents use it).

        `whole`: all of them in one transaction or none (a document's segments), refused at
        once when they could never fit; `prelude` adds its writes (a document's plan) to the
        first chunk's transaction, so they exist exactly when the jobs do."""
        require_voices(self.connection, self.tenant, planned, indexed=False)
        return self._submit(planned, on_submitted, whole=whole, prelude=prelude)

    def _submit(
        self,
        planned: list[_PlannedJob],
        on_submitted: OnSubmitted | None,
        *,
        whole: bool = False,
        prelude: Prelude | None = None,
    ) -> list[str]:
        job_ids: list[str] = [job.job_id for job in planned]
        follow_master(self.connection)  # Sentinel: never write to a demoted master
        room = Room.for_tenant(self.settings, self.tenant)
        if room.never_fits(planned, whole=whole):
            raise room.refusal(planned, 0, self.queue_depths(), [], whole=True)
        position = 0
        while position < len(planned):
            chunk = self._take_room(
                planned, position, job_ids, room=room, whole=whole, prelude=prelude
            )
            prelude = None
            position += len(chunk)
            if on_submitted is not None:
                on_submitted([(job.index, job_ids[job.index]) for job in chunk])
        return job_ids

    def _plan(self, requests: Iterable[RequestLike], *, indexed: bool = True) -> list[_PlannedJob]:
        """Validate each request and its voice; errors name its index (`requests[3]`) if indexed."""
        planned = []
        for index, raw in enumerate(requests):
            try:
                request = self._placed(validate_request(raw, self.limits))
                queue = self.queue_for(request.priority)
            except InvalidRequestError as e:
                if not indexed:
                    raise
                raise InvalidRequestError(f"requests[{index}]: {e}") from e
            planned.append(_PlannedJob(index, uuid.uuid4().hex, queue, request))
        require_voices(self.connection, self.tenant, planned, indexed=indexed)
        return planned

    def _placed(self, request: SynthesisRequest) -> SynthesisRequest:
        """The request with its output_key under this tenant's prefix (shared/output_keys.py)."""
        if request.output_key is None:
            return request
        limit = self.limits.max_output_key_chars
        try:
            key = place_output_key(self.tenant, request.output_key, limit)
        except ValueError as e:
            raise InvalidRequestError(f"output_key: {e}") from e
        return request.model_copy(update={"output_key": key})

    def _take_room(
        self,
        planned: Sequence[_PlannedJob],
        start: int,
        job_ids: list[str],
        *,
        room: Room,
        whole: bool,
        prelude: Prelude | None,
    ) -> list[_PlannedJob]:
        """Enqueue the next chunk in the transaction that checks there is room for it.

        WATCH this tenant's queues (and the idempotency keys the chunk may hold), read their
        depths, choose the chunk that fits (producer/room.py), read who holds its keys, then
        MULTI, enqueue and claim the keys, EXEC. When one of those queues or keys changed
        meanwhile (another producer's enqueue or claim, a worker's pop), EXEC refuses and they
        are read again: producers submitting at once never pass the quota, nor both take a key.
        """
        deadline = time.monotonic() + self.settings.backpressure_timeout_s
        end = len(planned) if whole else start + room.chunk_size  # the chunk is within
        claimed = [key for key, _ in _claims(planned[start:end], self.tenant)]
        queue_keys = [queue.key for queue in self._queues.values()]
        with self.connection.pipeline() as pipe:
            while True:
                pipe.watch(*queue_keys, *claimed)
                depths = self._watched_depths(pipe, queue_keys)
                chunk = room.fitting(planned, start, depths, whole=whole)
                if not chunk:
                    pipe.reset()
                    blocked = self.settings.backpressure == "raise"
                    if blocked or time.monotonic() >= deadline:
                        raise room.refusal(planned, start, depths, job_ids[:start], whole=whole)
                    time.sleep(self.settings.backpressure_poll_s)
                    continue
                try:
                    self._enqueue_chunk(pipe, chunk, job_ids, prelude)
                except redis.WatchError:
                    continue
                except redis.RedisError as e:
                    raise interrupted(e, chunk, len(planned), job_ids[:start]) from e
                return chunk

    def _watched_depths(self, pipe: Pipeline, queue_keys: list[str]) -> dict[str, int]:
        """The depth of each of this tenant's queues, read in one round trip on the pipeline
        that WATCHes them."""
        lengths = pipe.eval(_DEPTHS_SCRIPT, len(queue_keys), *queue_keys)
        return {name: int(n) for name, n in zip(self._queues, lengths, strict=True)}

    def _enqueue_chunk(
        self,
        pipe: Pipeline,
        chunk: list[_PlannedJob],
        job_ids: list[str],
        prelude: Prelude | None,
    ) -> None:
        """Read who holds the chunk's idempotency keys (WATCHed with the queues), then enqueue
        it and claim its keys in one MULTI/EXEC on `pipe`: a key is never claimed without its
        job, whenever this process dies. Writes the final id of each request into job_ids."""
        if prelude is not None:
            prelude.check(pipe)
        fresh = self._fresh(pipe, chunk, job_ids)
        pipe.multi()
        if prelude is not None:
            prelude.write(pipe)
        record_submitted(pipe, [job.job_id for job in fresh])
        keep_s = max(self.settings.result_ttl_s, self.settings.failure_ttl_s)  # RQ's TTLs
        index_jobs(pipe, self.tenant, [job.job_id for job in fresh], keep_s=keep_s)
        ttl_s = self.settings.idempotency_ttl_s
        claim_idempotency_keys(pipe, _claims(fresh, self.tenant), ttl_s=ttl_s)
        for name, queue in self._queues.items():
            datas = [self._enqueue_data(job) for job in fresh if job.queue == name]
            if datas:
                queue.enqueue_many(datas, pipeline=pipe)
        try:
            pipe.execute()  # WatchError: a queue or key changed; the caller reads them again
        except redis.WatchError:
            if not fresh or not self.connection.exists(Job.key_for(fresh[0].job_id)):
                raise
            # redis-py says WatchError for a connection lost under WATCH too: this one was
            # lost after Redis applied the transaction (its first job is in), not again

    def _fresh(
        self, pipe: Pipeline, chunk: list[_PlannedJob], job_ids: list[str]
    ) -> list[_PlannedJob]:
        """The chunk's jobs whose idempotency key no live job holds; each other's id is the
        holder's in job_ids."""
        keyed = [job for job in chunk if job.request.idempotency_key is not None]
        grace_s = self.settings.idempotency_claim_grace_s
        found = idempotency_holders(pipe, _claims(keyed, self.tenant), grace_s=grace_s)
        taken: set[int] = set()
        for job, holder in zip(keyed, found, strict=True):
            job_ids[job.index] = holder or job.job_id  # a try before may have found one
            if holder is not None:
                taken.add(job.index)
        return [job for job in chunk if job.index not in taken]

    def _enqueue_data(self, job: _PlannedJob) -> Any:
        request = job.request
        retries = self.settings.max_retries
        backoff = self.settings.retry_backoff_s
        retry = None
        if retries > 0:
            retry = Retry(max=retries, interval=retry_intervals(retries, backoff))
        return Queue.prepare_data(
            self.job_function,
            kwargs={"request": wire_request(request)},
            job_id=job.job_id,
            timeout=self.settings.job_timeout_s,
            result_ttl=self.settings.result_ttl_s,
            failure_ttl=self.settings.failure_ttl_s,
            description=f"synthesize {len(request.text)} chars",  # never the text itself
            meta={
                keys.SUBMIT_META_KEY: submit_meta(request),
                tenants.TENANT_META_KEY: self.tenant,
                **job.meta,
            },
            retry=retry,
        )

    # ---- documents (producer.documents: split, fan out, status, retry)

    def submit_document(self, document: Mapping[str, Any]) -> str:
        """Validate and split a long text into segments, enqueue each as an ordinary job;
        returns the document id (the first one's for an idempotency key seen before)."""
        return document_submit.submit_document(self, document)

    def document_status(self, document_id: str) -> documents.DocumentStatus:
        """Segments queued / running / done / failed, audio seconds so far, time left."""
        return documents.document_status(self, document_id)

    def document_result(
        self, document_id: str, timeout: float | None = None, on_progress: Any = None
    ) -> DocumentResult:
        """Wait for the assembled document; DocumentFailedError names a failed segment."""
        wait = self.settings.wait_timeout_s if timeout is None else timeout
        return documents.document_result(self, document_id, wait, on_progress)

    def cancel_document(
        self, document_id: str, *, idempotency_key: str | None = None
    ) -> dict[int, CancelOutcome]:
        """Cancel the segments not done yet (outcome per index); the document reads canceled."""
        return documents.cancel_document(self, document_id, idempotency_key)

    def retry_document(self, document_id: str) -> list[int]:
        """Rerun only the failed or lost segments (or the assembly); their indices."""
        return documents.retry_document(self, document_id)

    # ---- reading back

    def queue_depths(self) -> dict[str, int]:
        """Jobs waiting in each of this tenant's queues (high, default, low), one round trip."""
        pipe = self.connection.pipeline(transaction=False)
        for queue in self._queues.values():
            pipe.llen(queue.key)
        return {name: int(n) for name, n in zip(self._queues, pipe.execute(), strict=True)}

    def status(self, job_id: str) -> JobStatus:
        """Where a job is now (state, queue, times, worker, failure or result).
        Raises JobNotFoundError for an unknown or expired id."""
        return self.tracker.status(job_id)

    def cancel(
        self, job_id: str, *, tell: bool = True, idempotency_key: str | None = None
    ) -> CancelOutcome:
        """Cancel a job: a waiting one never runs (its `job.canceled` webhook event told here,
        unless `tell` is False; a document's segment tells its document's), a running one stops
        at its next piece or LLM step (nothing stored), one that already ended is left as it is
        (the outcome says which). A retry with the first try's `idempotency_key` answers as it
        did. Raises JobNotFoundError for an unknown or expired id."""
        hooks = WebhookPolicy.from_settings(self.settings) if tell else None
        key, wait_s = idempotency_key, self.settings.cancel_lost_answer_wait_s
        idempotency = None if key is None else idempotency_digest(key, self.tenant)
        return cancel_job(
            self.connection, self.tracker, job_id, flag_ttl_s=self.settings.result_ttl_s,
            webhooks=hooks, lost_answer_wait_s=wait_s, idempotency=idempotency,
        )  # fmt: skip

    def result(self, job_id: str, timeout: float | None = None) -> SynthesisResult:
        """Wait up to `timeout` seconds (default settings.wait_timeout_s; 0: do not wait) for
        the job's result. Raises JobFailedError (JobCanceledError for a canceled job),
        ResultTimeoutError or JobNotFoundError."""
        wait = self.settings.wait_timeout_s if timeout is None else timeout
        return self.tracker.result(job_id, wait)

    def stream(self, job_id: str, *, timeout: float | None = None) -> Iterator[AudioChunk]:
        """The audio chunks of a job submitted with `stream: true`, as they arrive (blocking
        XREAD), up to and including the final one (which carries the stored file's URI).
        Works before, during and after the job runs. `timeout` (default
        settings.stream_timeout_s) bounds the whole wait. Raises JobNotFoundError,
        StreamNotRequestedError, StreamExpiredError, StreamFailedError, StreamTimeoutError."""
        wait = self.settings.stream_timeout_s if timeout is None else timeout
        return read_stream(
            self.connection,
            self.tracker,
            job_id,
            timeout=wait,
            block_ms=self.settings.stream_block_ms,
        )

    def wait_many(
        self,
        job_ids: Sequence[str],
        timeout: float | None = None,
        on_progress: Any = None,
        *,
        on_outcome: Any = None,
        on_outage: Any = None,
    ) -> dict[str, JobOutcome]:
        """Wait for many jobs; each id maps to its outcome (result or failure, kind "pending"
        for jobs still queued or running at the deadline). on_progress(done, total) is called
        after each poll, on_outcome(job_id, outcome) as each arrives; a Redis outage is waited
        out (until the deadline) and reported to on_outage(message) when lost and when back."""
        wait = self.settings.wait_timeout_s if timeout is None else timeout
        return self.tracker.wait_many(
            job_ids, wait, on_progress, on_outcome=on_outcome, on_outage=on_outage
        )

    # ---- voices

    def add_voice(
        self,
        name: str,
        audio: bytes,
        transcript: str = "",
        *,
        filename: str = "prompt.wav",
        shared: bool = False,
    ) -> str:
        """Check the recording, upload it and enqueue the add-voice job for this tenant's
        voice `name` (`shared`: a shared voice, for every tenant; the caller decides who may);
        returns its job id (wait with `wait_for_voice`). Raises InvalidRequestError (bad name,
        unreadable, < 16 kHz, too long, silent) before anything is stored. `filename` only
        names the recording in those errors; the upload's suffix is its detected format."""
        return enqueue_add_voice(
            self.connection,
            self.settings,
            name=name,
            audio=audio,
            transcript=transcript,
            filename=filename,
            function=self.voice_function,
            tenant=self.tenant,
            owner=keys.SHARED_VOICES if shared else self.tenant,
        )

    def wait_for_voice(self, job_id: str, timeout: float | None = None) -> VoiceSummary:
        """The added voice's summary once its job is done; JobFailedError with the reason."""
        wait = self.settings.wait_timeout_s if timeout is None else timeout
        return wait_for_voice(self.tracker, job_id, wait)

    def list_voices(self) -> list[VoiceSummary]:
        """This tenant's voices, then the shared ones (`shared` set; without the model's
        built-in "default")."""
        own = VoiceRegistry(self.connection, self.tenant).summaries()
        return own + VoiceRegistry(self.connection, keys.SHARED_VOICES).summaries()

    def remove_voice(self, name: str, *, shared: bool = False) -> None:
        """Delete this tenant's voice (`shared`: the shared one) and its uploaded recording;
        UnknownVoiceError when there is none (for "default": the model's built-in)."""
        owner = keys.SHARED_VOICES if shared else self.tenant
        remove_voice(self.connection, self.settings, name, owner)


def _known_tenant(settings: Settings, tenant: str) -> str:
    """The tenant if this deployment names it (COSYQ_API_KEYS, COSYQ_TENANTS)."""
    tenants.check_tenant_name(tenant)
    known = settings.tenant_names()
    if tenant not in known:
        raise UnknownTenantError(
            f"unknown tenant {tenant!r}: known are {', '.join(known)} (COSYQ_API_KEYS, "
            "COSYQ_TENANTS)"
        )
    return tenant


def _claims(jobs: Iterable[_PlannedJob], tenant: str) -> list[tuple[str, str]]:
    """(idempotency key's Redis key in `tenant`, job id) of each job that has a key."""
    return [
        (keys.idempotency_key(job.request.idempotency_key, tenant), job.job_id)
        for job in jobs
        if job.request.idempotency_key is not None
    ]
