"""Documents from the producer's side: status, result, cancel, retry (submit: document_submit).

`submit_document` (producer/document_submit.py) validates and splits the document
(`shared.documents`), then writes its plan, its jobs hash and every segment as an ordinary
synthesize job in one transaction through the client's own submit path (the tenant's quota and
queue depth, the orphan sweep's index), each job carrying `cosyq_document` {id, index} in its
meta: the document goes in whole or not at all. Its idempotency key and its storage keys are
the tenant's (a named tenant's under `tenants/<tenant>/`, shared/output_keys.py). From then on
the workers carry it to the end; this process may exit. `retry_document` re-enqueues only the
segments that failed or whose job is gone (a new job id per segment; a finished segment is
never synthesized again), in the document's own tenant's queues (the plan records its tenant),
whoever asks.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import redis

from producer.cancel import CancelOutcome
from producer.planned import OnSubmitted, PlannedJob, Prelude
from producer.tracking import JobTracker
from shared.document_state import (
    DOCUMENT_META_KEY,
    DocumentFailedError,
    DocumentPlanRecord,
    DocumentResult,
    SegmentPlan,
    document_key,
    document_verdict,
    done_segments,
    enqueue_assembly,
    event_guard_key,
    job_ids,
    load_plan,
    load_result,
    new_assembly_job_id,
    revive,
)
from shared.errors import InvalidRequestError, JobNotFoundError, ResultTimeoutError
from shared.jobs import RequestLimits, validate_request
from shared.plurals import counted
from shared.settings import Settings


class CosyqClient(Protocol):
    """What a document needs of `producer.client.CosyqClient` (named here, so the client can
    import this module without the two importing each other)."""

    connection: redis.Redis
    settings: Settings
    tracker: JobTracker
    tenant: str

    def for_tenant(self, tenant: str) -> CosyqClient: ...

    def submit_planned(
        self,
        planned: list[PlannedJob],
        *,
        on_submitted: OnSubmitted | None = None,
        whole: bool = False,
        prelude: Prelude | None = None,
    ) -> list[str]: ...

    def queue_for(self, priority: str) -> str: ...

    def cancel(
        self, job_id: str, *, tell: bool = True, idempotency_key: str | None = None
    ) -> CancelOutcome: ...


QUEUED_STATES = frozenset({"queued", "deferred", "scheduled"})
FAILED_STATES = frozenset({"failed", "stopped", "canceled"})
ENDED_UNASSEMBLED = frozenset({"failed", "incomplete", "canceled"})  # waits end with an error
ASSEMBLY_GRACE_S = 10.0  # an assembly job missing this long is enqueued again by a waiter
SHOWN_WORDS = 8  # a failed segment is named by its index and its text's first words


@dataclass(frozen=True)
class SegmentFailure:
    index: int
    words: str  # the segment's first words
    job_id: str | None
    reason: str


@dataclass(frozen=True)
class DocumentStatus:
    """Where a document stands: segment counts, audio so far, time left, failures."""

    document_id: str
    state: str  # running, failed, incomplete, assembling, assembled
    segments: int
    queued: int
    running: int
    done: int
    failed: int
    missing: int  # jobs gone (expired, deleted) or audio gone: `retry` redoes them
    audio_s: float
    eta_s: float | None
    failures: list[SegmentFailure] = field(default_factory=list)
    result: DocumentResult | None = None
    message: str = ""
    verdict: str | None = None  # suspect when any segment done so far is (quality check)
    verdicts: list[str | None] = field(default_factory=list)  # per segment (None: not yet)

    def as_json(self) -> dict[str, Any]:
        record = {name: getattr(self, name) for name in self.__dataclass_fields__}
        record["failures"] = [vars(f) for f in self.failures]
        record["result"] = self.result.model_dump(mode="json") if self.result else None
        return record


def first_words(text: str, count: int = SHOWN_WORDS) -> str:
    words = text.split()
    return " ".join(words[:count]) + (" ..." if len(words) > count else "")


def document_status(client: CosyqClient, document_id: str) -> DocumentStatus:
    """Counts per state, audio seconds so far, an estimate of the time left, and failures."""
    connection = client.connection
    plan = load_plan(connection, document_id)
    result = load_result(connection, document_id)
    done = done_segments(connection, document_id)
    jobs = job_ids(connection, document_id)
    pending = [s for s in plan.segments if s.index not in done]
    states = client.tracker.states([jobs.get(s.index, "-") for s in pending])
    if "finished" in states:
        # A segment job records its audio before RQ marks it finished: one that finished after
        # `done` was read is done now, not "missing" (read again, as its state was read after).
        done = done_segments(connection, document_id)
        kept = [(s, st) for s, st in zip(pending, states, strict=True) if s.index not in done]
        pending, states = [s for s, _ in kept], [st for _, st in kept]
    counts = {"queued": 0, "running": 0, "failed": 0, "missing": 0}
    failures: list[SegmentFailure] = []
    for segment, state in zip(pending, states, strict=True):
        kind = _kind(state)
        counts[kind] += 1
        if kind in ("failed", "missing"):
            failures.append(_failure(client, segment, jobs.get(segment.index), state))
    state = _document_state(result, counts, len(done), len(plan.segments))
    if state == "failed" and all(st == "canceled" for st in states if _kind(st) == "failed"):
        state = "canceled"  # every failure is a cancel (cancel_document): not a fault
    if state == "assembling":
        failure = _assembly_failure(client, document_id)
        if failure is not None:
            state = "failed"
            failures.append(SegmentFailure(-1, "(assembly)", failure[0], failure[1]))
    return DocumentStatus(
        document_id=document_id,
        state=state,
        segments=len(plan.segments),
        done=len(done),
        audio_s=sum(d.duration_s for d in done.values()),
        eta_s=_eta(plan, done, state),
        failures=failures,
        result=result,
        message=_message(document_id, state, failures),
        verdict=document_verdict(done)[0],
        verdicts=[done[s.index].verdict if s.index in done else None for s in plan.segments],
        **counts,
    )


def _assembly_failure(client: CosyqClient, document_id: str) -> tuple[str, str] | None:
    """(job id, reason) when the document's assembly job failed for good."""
    current = client.connection.get(document_key(document_id, "assembly"))
    if current is None:
        return None
    job_id = current.decode() if isinstance(current, bytes) else str(current)
    try:
        status = client.tracker.status(job_id)  # state and reason from one read of its hash
    except JobNotFoundError:
        return None
    if status.state not in FAILED_STATES:
        return None
    failure = status.failure
    return job_id, f"{failure.kind}: {failure.message}" if failure else status.state


def _kind(state: str | None) -> str:
    if state is None or state == "finished":  # gone, or finished without its audio recorded
        return "missing"
    if state in QUEUED_STATES:
        return "queued"
    if state in FAILED_STATES:
        return "failed"
    return "running"


def _failure(
    client: CosyqClient, segment: SegmentPlan, job_id: str | None, state: str | None
) -> SegmentFailure:
    words = first_words(segment.plain)
    if state is None or job_id is None:
        reason = "its job is gone (expired or deleted)"
    elif state == "finished":
        reason = "its audio is gone (deleted before assembly)"
    else:
        failure = client.tracker.status(job_id).failure
        reason = f"{failure.kind}: {failure.message}" if failure else state
    return SegmentFailure(segment.index, words, job_id, reason)


def _document_state(
    result: DocumentResult | None, counts: dict[str, int], done: int, total: int
) -> str:
    if result is not None:
        return "assembled"
    if counts["failed"]:
        return "failed"
    if counts["missing"] and not (counts["queued"] or counts["running"]):
        return "incomplete"
    return "assembling" if done == total else "running"


def _eta(plan: DocumentPlanRecord, done: Mapping[int, Any], state: str) -> float | None:
    """Time left at the pace so far, weighted by characters; None before the first segment."""
    if state != "running" or not done:
        return None
    elapsed = (datetime.now(UTC) - datetime.fromisoformat(plan.created_at)).total_seconds()
    chars = {s.index: len(s.plain) for s in plan.segments}
    finished = sum(chars[i] for i in done) or 1
    return max(0.0, elapsed * (sum(chars.values()) - finished) / finished)


def _message(document_id: str, state: str, failures: list[SegmentFailure]) -> str:
    if not failures:
        return ""
    if state == "canceled":
        return (
            f"document {document_id}: canceled ({counted(len(failures), 'segment')} did not run); "
            f"`cosyq document retry {document_id}` runs them after all"
        )
    first = failures[0]
    if first.index < 0:
        return (
            f"document {document_id}: the assembly failed: {first.reason}; "
            f"`cosyq document retry {document_id}` runs it again"
        )
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    return (
        f"document {document_id}: segment {first.index} ({first.words!r}) failed: "
        f"{first.reason}{more}; `cosyq document retry {document_id}` reruns only those"
    )


def retry_document(client: CosyqClient, document_id: str) -> list[int]:
    """Re-enqueue the failed or lost segments (new job ids); the indices re-enqueued. The
    assembly marker goes with them, so the last of them enqueues the assembly afresh (a failed
    assembly's marker would otherwise stop it, and its error stay): one retry suffices. When
    every segment is done but no assembly is alive, enqueue the assembly again. The new job ids
    and the jobs go in one transaction, whole or not at all (a retry killed midway leaves the
    document as it was). Of two retries at once one redoes the segments; the other finds its
    read outdated and redoes nothing. A document of nobody's is refused: its new jobs would be
    "default"'s, to read."""
    connection = client.connection
    plan = load_plan(connection, document_id)
    if plan.tenant is None:  # planned before tenants
        raise InvalidRequestError(f"document {document_id} has no tenant (nobody's): not retried")
    client = client.for_tenant(plan.tenant)  # its queues, whoever retries
    read = job_ids(connection, document_id)  # before the status: a retry after it shows
    status = document_status(client, document_id)
    planned = _redo(client, plan, [f.index for f in status.failures if f.index >= 0])
    if planned:
        writes = RetryWrites(plan, read, planned, client.settings.result_ttl_s)
        try:
            client.submit_planned(planned, whole=True, prelude=writes)
        except RetriedMeanwhile:
            return []  # a retry at the same moment redid them
    elif status.done == status.segments and status.result is None:
        connection.delete(event_guard_key(document_id))
        ensure_assembly(client, plan)
    return [job.index for job in planned]


class RetriedMeanwhile(Exception):
    """Another retry rewrote the document's job ids after this one read them."""


@dataclass(frozen=True)
class RetryWrites:
    """A retry's writes in its jobs' transaction (producer.planned.Prelude)."""

    plan: DocumentPlanRecord
    read: dict[int, str]  # the jobs hash as the retry read it
    planned: list[PlannedJob]
    ttl_s: int

    def check(self, pipe: Any) -> None:
        jobs = document_key(self.plan.document_id, "jobs")
        pipe.watch(jobs)
        if {int(k): v for k, v in _decoded(pipe.hgetall(jobs)).items()} != self.read:
            raise RetriedMeanwhile(self.plan.document_id)

    def write(self, pipe: Any) -> None:
        """The new job ids; the last redone segment enqueues a new assembly."""
        document_id = self.plan.document_id
        jobs = {str(job.index): job.job_id for job in self.planned}
        pipe.hset(document_key(document_id, "jobs"), mapping=jobs)
        pipe.delete(document_key(document_id, "assembly"))  # a failed one's stale marker
        pipe.delete(event_guard_key(document_id))  # its end is a new webhook event
        revive(pipe, self.plan, self.ttl_s)  # a TTL from now, and longer


def _decoded(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {_str(k): _str(v) for k, v in raw.items()}


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _redo(client: CosyqClient, plan: DocumentPlanRecord, redo: list[int]) -> list[PlannedJob]:
    """A new job (new id) for each of these segments, checked with the deployment's limits
    (its webhook allow-list)."""
    limits = RequestLimits.from_settings(client.settings)
    planned = []
    for index in redo:
        segment = plan.segments[index]
        request = validate_request(
            {**plan.job, "text": segment.text, "seed": segment.seed, "output_key": segment.key},
            limits,
        )
        meta = {DOCUMENT_META_KEY: {"id": plan.document_id, "index": index}}
        planned.append(
            PlannedJob(index, uuid.uuid4().hex, client.queue_for(plan.priority), request, meta)
        )
    return planned


def cancel_document(
    client: CosyqClient, document_id: str, idempotency_key: str | None = None
) -> dict[int, CancelOutcome]:
    """Cancel every segment not done yet, each as `client.cancel` cancels a job (queued: never
    runs; running or in a batch: stops at its next step); done segments and a running assembly
    are left as they are. The outcome per segment index; the document then reads `canceled`.
    The first queued segment canceled tells `document.canceled` in its cancel's own transaction
    (shared/document_events.py: once per outcome, the other segments' cancels tell nothing), so
    a process killed before it canceled the rest has told the document's end all the same.
    `idempotency_key`: each segment's cancel's (a retry answers as the first try did)."""
    connection = client.connection
    load_plan(connection, document_id)  # DocumentNotFoundError for an unknown id
    done = done_segments(connection, document_id)
    return {
        index: client.cancel(job_id, idempotency_key=idempotency_key)
        for index, job_id in sorted(job_ids(connection, document_id).items())
        if index not in done
    }


def _assembly_lost(client: CosyqClient, document_id: str, seen: list[float]) -> bool:
    """True once the assembly job has been missing for ASSEMBLY_GRACE_S (the worker that
    claimed the last segment died before enqueueing it); a moment's absence is that worker
    between its claim and its enqueue."""
    current = client.connection.get(document_key(document_id, "assembly"))
    job_id = current.decode() if isinstance(current, bytes) else current
    if job_id is not None and client.tracker.states([str(job_id)])[0] is not None:
        seen.clear()
        return False
    if not seen:
        seen.append(time.monotonic())
    return time.monotonic() - seen[0] >= ASSEMBLY_GRACE_S


def ensure_assembly(client: CosyqClient, plan: DocumentPlanRecord) -> bool:
    """Enqueue the assembly again unless a live one exists; True when it did."""
    connection = client.connection
    marker = document_key(plan.document_id, "assembly")
    current = connection.get(marker)
    if current is not None:
        job_id = current.decode() if isinstance(current, bytes) else str(current)
        state = client.tracker.states([job_id])[0]
        if state is not None and state not in FAILED_STATES and state != "finished":
            return False
    job_id = new_assembly_job_id(plan.document_id)
    connection.set(marker, job_id, ex=client.settings.result_ttl_s)
    enqueue_assembly(
        connection, client.settings, plan.document_id, job_id, plan.priority, tenant=plan.tenant
    )
    return True


def document_result(
    client: CosyqClient,
    document_id: str,
    timeout: float,
    on_progress: Callable[[DocumentStatus], None] | None = None,
) -> DocumentResult:
    """Wait up to `timeout` s for the assembled document. JobFailedError when a segment failed
    for good (naming it), ResultTimeoutError at the deadline."""
    deadline = time.monotonic() + timeout
    lost: list[float] = []  # when the assembly job was first seen missing
    while True:
        try:
            status = document_status(client, document_id)
        except redis.ConnectionError:
            status = None  # an outage: wait it out until the deadline
        if status is not None:
            if on_progress is not None:
                on_progress(status)
            if status.result is not None:
                return status.result
            if status.state in ENDED_UNASSEMBLED:
                raise DocumentFailedError(document_id, status.message)
            if status.state == "assembling" and _assembly_lost(client, document_id, lost):
                ensure_assembly(client, load_plan(client.connection, document_id))
        if time.monotonic() >= deadline:
            raise ResultTimeoutError(
                f"document {document_id}: not assembled after {timeout:g} s "
                f"(`cosyq document status {document_id}`)"
            )
        time.sleep(
            min(client.settings.result_poll_interval_s, max(0.0, deadline - time.monotonic()))
        )
