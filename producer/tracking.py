"""Reading jobs back: status, a single result with a timeout, and many results with progress.

RQ keeps a job's state in the hash `rq:job:<id>` and its return value in the stream
`rq:results:<id>`; both are read with the JSON serializer. A failure's reason is what the worker
wrote to `job.meta["cosyq_error"]`, else the last line of RQ's exception text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
from pydantic import ValidationError
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer

from shared.connection import REDIS_OUTAGE, misconfiguration
from shared.errors import (
    JobCanceledError,
    JobFailedError,
    JobNotFoundError,
    ResultTimeoutError,
)
from shared.keys import ERROR_META_KEY, SUBMIT_META_KEY, check_job_id
from shared.plurals import counted
from shared.results import JobFailure, SynthesisResult
from shared.settings import Settings
from shared.tenants import DEFAULT_TENANT, TENANT_META_KEY

# A job's hash for one reader in one round trip, read past its tenant tag only for its owner (or
# an operator key): another tenant's job answers nil, as an id never made does, its hash's size
# and its result unread. KEYS[1]: the job's hash; ARGV: the reader's tenant, "1" for an
# operator key, the meta key of the tenant tag. The tag is in RQ's meta, JSON (JSONSerializer).
OWNED_JOB_SCRIPT = """
if ARGV[2] ~= '1' then
  local meta = redis.call('HGET', KEYS[1], 'meta')
  if not meta then return false end
  local ok, decoded = pcall(cjson.decode, meta)
  if not ok or type(decoded) ~= 'table' or decoded[ARGV[3]] ~= ARGV[1] then return false end
end
return redis.call('HGETALL', KEYS[1])
"""
TERMINAL_STATES = frozenset({"finished", "failed", "stopped", "canceled"})
FIRST_POLL_S = 0.05  # polls start fast and back off to settings.result_poll_interval_s
OUTAGE_RETRY_FIRST_S, OUTAGE_RETRY_MAX_S = 0.5, 10.0  # as the worker waits for Redis
PENDING_KIND = "pending"  # wait_many: still queued or running when the wait ended
CANCELED_KIND = "canceled"  # the failure kind of a canceled job
JobOutcome = SynthesisResult | JobFailure


@dataclass(frozen=True)
class JobStatus:
    """A job as `cosyq status`/`result` show it. `result` is set once finished, `failure` once
    failed; `submitted` is what the producer recorded (sizes and names, never text)."""

    job_id: str
    state: str  # queued, started, finished, failed, scheduled (retry pending), ...
    queue: str | None
    enqueued_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    worker_name: str | None
    retries_left: int | None
    submitted: dict[str, Any]
    result: SynthesisResult | None = None
    failure: JobFailure | None = None
    tenant: str | None = DEFAULT_TENANT  # who submitted it; None: no tenant tag (nobody's)


def failure_of(job: Job, state: str) -> JobFailure:
    """Why a job has no result: the worker's reason, else RQ's last exception line."""
    if state == "canceled":  # whatever an earlier attempt left in its meta
        return JobFailure(kind=CANCELED_KIND, message="canceled before it finished")
    reason = JobFailure.from_meta(job.meta.get(ERROR_META_KEY))
    if reason is not None:
        return reason
    if state == "stopped":
        return JobFailure(kind="internal", message=f"job was {state}")
    latest = job.latest_result()
    text = (latest.exc_string or "") if latest is not None else ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return JobFailure(kind="internal", message=lines[-1] if lines else "failed (no reason kept)")


def result_of(job: Job) -> SynthesisResult | JobFailure:
    """The parsed return value of a finished job."""
    latest = job.latest_result()
    if latest is None or latest.type != Result.Type.SUCCESSFUL:
        return JobFailure(kind="internal", message="finished but its result has expired")
    try:
        return SynthesisResult.model_validate(latest.return_value)
    except ValidationError as e:
        return JobFailure(
            kind="internal", message=f"unreadable result: {counted(e.error_count(), 'error')}"
        )


def tenant_of_job(job: Job) -> str | None:
    """The tenant tag of a job's meta; None without one (a hash re-created without its meta):
    such a job belongs to nobody, never to "default"."""
    tenant = job.meta.get(TENANT_META_KEY)
    return tenant if isinstance(tenant, str) else None


def job_status(job: Job) -> JobStatus:
    """A fetched job's status, read from its hash and its results."""
    raw_state = job.get_status(refresh=False)
    state = raw_state.value if raw_state is not None else "unknown"
    outcome: JobOutcome | None = None
    if state == "finished":
        outcome = result_of(job)
    elif state in TERMINAL_STATES:
        outcome = failure_of(job, state)
    return JobStatus(
        job_id=job.id,
        state=state,
        queue=job.origin or None,
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        ended_at=job.ended_at,
        worker_name=job.worker_name,
        retries_left=job.retries_left,
        submitted=dict(job.meta.get(SUBMIT_META_KEY) or {}),
        result=outcome if isinstance(outcome, SynthesisResult) else None,
        failure=outcome if isinstance(outcome, JobFailure) else None,
        tenant=tenant_of_job(job),
    )


def status_record(status: JobStatus) -> dict[str, Any]:
    """A job's status as plain JSON (`GET /v1/jobs/{id}`, `cosyq result`, a job's webhook)."""
    record: dict[str, Any] = {"job_id": status.job_id, "state": status.state}
    record["queue"] = status.queue
    record["tenant"] = status.tenant
    for name in ("enqueued_at", "started_at", "ended_at"):
        value = getattr(status, name)
        record[name] = value.isoformat() if value is not None else None
    record["worker_name"] = status.worker_name
    record["submitted"] = status.submitted
    if status.result is not None:
        record["result"] = status.result.model_dump(mode="json")
    if status.failure is not None:
        record["error"] = status.failure.as_meta()
    return record


class JobTracker:
    """Status and result reads for one connection."""

    def __init__(self, connection: redis.Redis, settings: Settings) -> None:
        self.connection = connection
        self.settings = settings
        self._owned_job = connection.register_script(OWNED_JOB_SCRIPT)

    def fetch(self, job_id: str) -> Job:
        check_job_id(job_id)  # InvalidJobIdError for "../x", never RQ's ValueError
        try:
            return Job.fetch(job_id, connection=self.connection, serializer=JSONSerializer)
        except NoSuchJobError as e:
            raise JobNotFoundError(f"no job {job_id} (never submitted, or expired)") from e

    def fetch_owned(self, job_id: str, tenant: str, *, operator: bool = False) -> Job:
        """The job if `tenant` owns it (any job for an operator); JobNotFoundError alike for an
        id never made and for another tenant's job, whose hash is read no further than its
        tenant tag, inside Redis (the reply, and the time, are an unknown id's)."""
        check_job_id(job_id)
        key = Job.key_for(job_id)
        fields = self._owned_job(
            keys=[key], args=[tenant, "1" if operator else "0", TENANT_META_KEY]
        )
        if not fields:
            raise JobNotFoundError(f"no job {job_id} (never submitted, or expired)")
        job = Job(job_id, connection=self.connection, serializer=JSONSerializer)
        job.restore(dict(zip(fields[::2], fields[1::2], strict=True)))
        return job

    def status(self, job_id: str) -> JobStatus:
        return job_status(self.fetch(job_id))

    def outcome(self, job_id: str) -> JobOutcome:
        """The result or failure of a job in a terminal state."""
        status = self.status(job_id)
        if status.result is not None:
            return status.result
        if status.failure is not None:
            return status.failure
        return JobFailure(kind="internal", message=f"job is {status.state}, not done")

    def states(self, job_ids: Sequence[str]) -> list[str | None]:
        """Each job's state in one round trip; None for a job that does not exist."""
        for job_id in job_ids:
            check_job_id(job_id)
        pipe = self.connection.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(Job.key_for(job_id), "status")
        return [state.decode() if state else None for state in pipe.execute()]

    def wait_until_done(self, job_id: str, timeout: float, what: str = "job") -> str:
        """Poll (backing off to result_poll_interval_s) until the job ends; its final state."""
        deadline = time.monotonic() + timeout
        delay = FIRST_POLL_S
        while True:
            (state,) = self.states([job_id])
            if state is None:
                raise JobNotFoundError(f"no job {job_id} (never submitted, or expired)")
            if state in TERMINAL_STATES:
                return state
            if time.monotonic() >= deadline:
                raise ResultTimeoutError(f"{what} {job_id} is {state} after {timeout:g} s")
            time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
            delay = min(delay * 2, self.settings.result_poll_interval_s)

    def result(self, job_id: str, timeout: float) -> SynthesisResult:
        self.wait_until_done(job_id, timeout)
        outcome = self.outcome(job_id)
        if isinstance(outcome, JobFailure):
            if outcome.kind == CANCELED_KIND:
                raise JobCanceledError(job_id, outcome.message)
            raise JobFailedError(job_id, outcome.kind, outcome.message)
        return outcome

    def wait_many(
        self,
        job_ids: Sequence[str],
        timeout: float,
        on_progress: Callable[[int, int], None] | None = None,
        *,
        on_outcome: Callable[[str, JobOutcome], None] | None = None,
        on_outage: Callable[[str], None] | None = None,
    ) -> dict[str, JobOutcome]:
        """Each id's outcome; a job still queued or running at the deadline gets a JobFailure
        of kind "pending" (it stays queued and runs later). `on_outcome` sees each outcome as
        it arrives. A lost connection is waited out until the deadline, with backoff, reported
        once to `on_outage` when it is lost and once when Redis is back; a misconfiguration
        (password, ACL) is raised."""
        deadline = time.monotonic() + timeout
        outcomes: dict[str, JobOutcome] = {}
        pending = list(dict.fromkeys(job_ids))  # the same id twice (idempotency) waits once
        delay = FIRST_POLL_S
        outage = _Outage(on_outage)
        while pending:
            try:
                self._collect(pending, outcomes, on_outcome)
                outage.recovered()
            except redis.RedisError as e:
                if misconfiguration(e) is not None or not isinstance(e, REDIS_OUTAGE):
                    raise
                outage.lost(e)
            pending = [job_id for job_id in pending if job_id not in outcomes]
            if on_progress is not None:
                on_progress(len(outcomes), len(outcomes) + len(pending))
            if pending and time.monotonic() >= deadline:
                for job_id in pending:
                    outcomes[job_id] = JobFailure(
                        kind=PENDING_KIND, message=f"not finished after {timeout:g} s"
                    )
                break
            if pending:
                pause = outage.delay if outage.down else delay
                time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
                delay = min(delay * 2, self.settings.result_poll_interval_s)
        return outcomes

    def _collect(
        self,
        pending: Sequence[str],
        outcomes: dict[str, JobOutcome],
        on_outcome: Callable[[str, JobOutcome], None] | None,
    ) -> None:
        """One poll: record the outcome of every pending job that has ended."""
        for job_id, state in zip(pending, self.states(pending), strict=True):
            if state is None:
                outcome: JobOutcome = JobFailure(kind="not_found", message="job expired")
            elif state in TERMINAL_STATES:
                outcome = self.outcome(job_id)
            else:
                continue
            outcomes[job_id] = outcome
            if on_outcome is not None:
                on_outcome(job_id, outcome)


class _Outage:
    """Redis lost while waiting: told once when it goes, once when it is back; the backoff."""

    def __init__(self, report: Callable[[str], None] | None) -> None:
        self.report = report or (lambda message: None)
        self.down = False
        self.since = 0.0
        self.delay = OUTAGE_RETRY_FIRST_S

    def lost(self, error: redis.RedisError) -> None:
        if not self.down:
            self.down, self.since = True, time.monotonic()
            self.report(
                f"Redis unreachable ({error}); waiting for it, retrying every "
                f"{OUTAGE_RETRY_FIRST_S:g}-{OUTAGE_RETRY_MAX_S:g} s"
            )
        else:
            self.delay = min(self.delay * 2, OUTAGE_RETRY_MAX_S)

    def recovered(self) -> None:
        if self.down:
            self.report(f"Redis is back after {time.monotonic() - self.since:.1f} s")
            self.down, self.delay = False, OUTAGE_RETRY_FIRST_S
