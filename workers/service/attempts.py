"""One attempt's books: what every job gets, whether it runs alone or in a batch.

- `begin`: cap the timeout, count the attempt, give the default retry policy, mark the job
  started and claim the heartbeat, in one MULTI/EXEC that a cancel's flag or transaction, come
  first, refuses (workers/service/cancels.claim_start: the job is then recorded canceled and
  never starts), written before RQ registers the job (see reaper.py for why);
- `register` (a batched job; RQ's own execute does it for a lone one): the execution, the
  started registry, `started_at`;
- `succeed` / `fail`: RQ's own finalize steps (result TTL, registries, retries);
- `refuse`: fail a job that must not run (nothing imported, no retry, no callback);
- `end`: the job's one metric, its heartbeat dropped, the recycling count.
A lone job is `run_alone`: begin, RQ's execute, end. RQ's private calls live here and nowhere
else. A Redis outage is never a verdict: a job not yet started goes back to its queue, an
outcome waits for Redis (the worker's handlers do that, workers/service/outcomes.py).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue
from rq.utils import now
from rq.worker import SimpleWorker

from producer.webhooks.bodies import keep_body
from shared import job_events, keys
from shared.job_index import record_failure
from shared.logs import get_logger
from shared.settings import Settings
from shared.tenants import TENANT_META_KEY
from workers.service import admission, cancels, metrics, outcomes
from workers.service.housekeeping import Housekeeper
from workers.service.outage import REDIS_OUTAGE, until_reachable
from workers.service.retries import apply_default_retries

log = get_logger(__name__)

ExcInfo = tuple[Any, Any, Any]


def effective_timeout(job_timeout: int | float | None, limit_s: int) -> int:
    """A job's own timeout, capped at the configured one (a job cannot ask for forever)."""
    if job_timeout is None or job_timeout <= 0:
        return limit_s
    return int(min(job_timeout, limit_s))


@dataclass(eq=False)
class Attempt:
    """One job in this worker's hands, from `begin` to `end`."""

    job: Job
    queue: Queue
    began_at: float = field(default_factory=time.monotonic)
    execution: Execution | None = None


class AttemptBooks:
    """The per-attempt steps of both paths (see the module docstring).

    `worker` is RQ's worker (its execute, finalize and registry steps); `on_end(model_idle)` is the
    worker's recycling count, called once per job that left its hands (`model_idle`: no other job
    of this worker is still on the model).
    """

    def __init__(
        self,
        worker: SimpleWorker,
        housekeeper: Housekeeper,
        settings: Settings,
        *,
        on_end: Callable[[bool], None],
    ) -> None:
        self.worker = worker
        self.housekeeper = housekeeper
        self.settings = settings
        self.on_end = on_end
        self.webhooks = job_events.WebhookPolicy.from_settings(settings)
        self._outcomes: dict[str, str] = {}  # job id -> outcome, written by RQ's handlers

    # -- both paths ----------------------------------------------------------------------------

    def begin(self, job: Job, queue: Queue) -> Attempt | None:
        """Claim the attempt; None when Redis is away (the job is back at its queue's head) or
        a cancel came first (the job is recorded canceled, never started)."""
        try:
            claimed = self._claim(job)
        except REDIS_OUTAGE as e:
            log.warning("job_not_started", job_id=job.id, error=str(e))
            cancels.give_back_claimed(self.worker.connection, job.id, queue)
            return None
        if not claimed:
            connection = self.worker.connection
            cancels.record_canceled(connection, job, queue, webhooks=self.webhooks)
            return None
        return Attempt(job, queue)

    def note_outcome(self, job: Job, outcome: str) -> None:
        """RQ's success/failure handlers say how the attempt ended (finished, retried, failed)."""
        self._outcomes[job.id] = outcome

    def end(self, attempt: Attempt, *, model_idle: bool = True) -> None:
        """The job left this worker's hands: its metric, its heartbeat, the recycling count."""
        outcome = self._outcomes.pop(attempt.job.id, None)
        if outcome is not None:
            seconds = time.monotonic() - attempt.began_at
            metrics.record_job(attempt.queue.name, outcome, seconds)
            if outcome == "failed":
                self._count_failure(attempt.job)
        self.housekeeper.end_job(attempt.job.id)
        self.on_end(model_idle)

    def _count_failure(self, job: Job) -> None:
        """A failure in the operator page's throughput chart (shared/job_index.py)."""
        try:
            tag = job.meta.get(TENANT_META_KEY)
            record_failure(self.worker.connection, tag if isinstance(tag, str) else None)
        except REDIS_OUTAGE as e:
            log.warning("job_failure_not_counted", job_id=job.id, error=str(e))

    def refuse(
        self, job: Job, queue: Queue, refusal: admission.Refusal, *, model_idle: bool = True
    ) -> None:
        """Fail a job that must not run: no retry, no callbacks, no RQ webhooks, nothing
        imported. A job refused `told` (its tenant's, a call of another release) keeps its meta
        and tells its webhook or document it failed, as any failed job does; any other is
        nobody's (its meta is replaced by the reason).

        The write waits out an outage: a refusal is a verdict on a hash that was read."""
        log.warning("job_refused", job_id=job.id, queue=queue.name, reason=refusal.message)
        metrics.record_job(queue.name, "refused")
        error = {"kind": refusal.kind, "message": refusal.message}
        job.meta = (
            {**job.meta, keys.ERROR_META_KEY: error}
            if refusal.told
            else {keys.ERROR_META_KEY: error}
        )
        job.retries_left = 0
        job.webhooks = []
        job._success_callback_name = job._failure_callback_name = None
        job._stopped_callback_name = None
        job.ended_at = now()

        def write() -> None:
            with self.worker.connection.pipeline() as pipe:
                if refusal.told:
                    job_events.job_ended(pipe, job, "job.failed", self.webhooks)
                admission.record_refusal(job, f"{refusal.kind}: {refusal.message}", pipe)
                pipe.lrem(queue.intermediate_queue_key, 1, job.id)
                self.worker.increment_failed_job_count(pipe)
                pipe.execute()

        until_reachable(write, "job_refusal_unrecorded")
        if refusal.told:  # best effort: else the housekeeping keeps it (`keep_unkept`)
            keep_body(self.worker.connection, job, "job.failed", self.webhooks)
        self.on_end(model_idle)

    def refuse_unreadable(self, job_id: str, queue: Queue, error: Exception) -> None:
        """A popped id whose hash was read and would not load: failed, never run."""
        reason = f"{type(error).__name__}: {error}"
        log.warning("job_refused", job_id=job_id, queue=queue.name, reason=reason)
        metrics.record_job(queue.name, "refused")
        until_reachable(
            lambda: admission.refuse_unreadable(
                self.worker.connection,
                queue.name,
                job_id,
                reason,
                failure_ttl_s=self.settings.failure_ttl_s,
            ),
            "job_refusal_unrecorded",
        )

    # -- one job -------------------------------------------------------------------------------

    def run_alone(self, job: Job, queue: Queue, execute: Callable[[Job, Queue], None]) -> None:
        """begin, RQ's execute (perform, outcome through the worker's handlers), end."""
        attempt = self.begin(job, queue)
        if attempt is None:
            return
        try:
            execute(job, queue)
        except REDIS_OUTAGE as e:
            # A bookkeeping step outside the outcome writes failed (those wait for Redis
            # themselves): release the job once Redis is back, labelled for what happened.
            log.warning("job_bookkeeping_failed", job_id=job.id, error=str(e))
            outcomes.release_unrecorded(
                self.worker.connection, queue, job, self.worker.name, self.webhooks
            )
        finally:
            self.end(attempt)

    # -- a batched job -------------------------------------------------------------------------

    def register(self, attempt: Attempt) -> bool:
        """RQ's start-of-job steps for a job run outside RQ's execute; False when Redis was
        away (the job is then back in its queue, or released as outcome_unrecorded)."""
        job, queue = attempt.job, attempt.queue
        try:
            attempt.execution = self.worker.prepare_execution(job)
        except REDIS_OUTAGE as e:
            log.warning("job_not_started", job_id=job.id, error=str(e))
            # queued again (a reaper ignores an entry whose job is queued)
            cancels.give_back_claimed(self.worker.connection, job.id, queue)
            return False
        try:
            self.worker.prepare_job_execution(job, len(self.worker.queues) == 1)
        except REDIS_OUTAGE as e:
            log.warning("job_bookkeeping_failed", job_id=job.id, error=str(e))
            outcomes.release_unrecorded(
                self.worker.connection, queue, job, self.worker.name, self.webhooks
            )
            return False
        job.started_at = now()
        return True

    def succeed(self, attempt: Attempt, return_value: dict[str, Any]) -> bool:
        """RQ's success steps; False when the steps themselves failed (the attempt is then
        failed instead)."""
        assert attempt.execution is not None
        job, queue, execution = attempt.job, attempt.queue, attempt.execution
        try:
            self.worker._finalize_success(job, queue, execution, return_value)
        except REDIS_OUTAGE as e:
            log.warning("job_outcome_unrecorded", job_id=job.id, error=str(e))
        except Exception:
            self.fail(attempt, sys.exc_info())
            return False
        return True

    def fail(self, attempt: Attempt, exc_info: ExcInfo) -> None:
        """RQ's failure steps (classification and retry policy in the worker's handlers)."""
        if attempt.execution is None:
            return
        try:
            job, queue, execution = attempt.job, attempt.queue, attempt.execution
            self.worker._finalize_failure(job, queue, execution, exc_info)
        except REDIS_OUTAGE as e:
            log.warning("job_outcome_unrecorded", job_id=attempt.job.id, error=str(e))

    # -- inside begin --------------------------------------------------------------------------

    def _claim(self, job: Job) -> bool:
        """A job requeued by hand (`rq requeue`, rq-dashboard, `cosyq failed --requeue`) keeps
        its meta: its old failure is cleared here, the attempt count goes on, and its run
        count (the webhook id of its next outcome, shared/webhooks.event_id) goes up. False,
        the job untouched (its run count is the one a cancel's event was told under), when a
        cancel came first."""
        meta = dict(job.meta)
        previous = meta.get(keys.ATTEMPT_META_KEY, 0)
        meta[keys.ATTEMPT_META_KEY] = (previous if isinstance(previous, int) else 0) + 1
        if meta.pop(keys.ERROR_META_KEY, None) is not None:
            run = meta.get(keys.RUN_META_KEY, 1)
            meta[keys.RUN_META_KEY] = (run if isinstance(run, int) else 1) + 1
        retries = (job.retries_left, job.retry_intervals)
        apply_default_retries(
            job,
            max_retries=self.settings.max_retries,
            backoff_base_s=self.settings.retry_backoff_s,
        )
        # a started job names its worker from the claim on (RQ writes it again as it registers)
        fields: dict[str, str | int] = {"meta": json.dumps(meta), "worker_name": self.worker.name}
        if job.retries_left is not None:
            fields["retries_left"] = job.retries_left
        if job.retry_intervals is not None:
            fields["retry_intervals"] = json.dumps(job.retry_intervals)
        if not self.housekeeper.begin_job(job.id, fields):
            job.retries_left, job.retry_intervals = retries
            return False
        job.meta, job.worker_name = meta, self.worker.name
        job.timeout = effective_timeout(job.timeout, self.settings.job_timeout_s)
        return True
