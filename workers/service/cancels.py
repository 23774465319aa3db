"""The worker's side of canceling: the flag a running job checks, and the canceled record.

`cosyq cancel` (producer/cancel.py) sets `cosyq:cancel:<id>` before anything else, so:
- before a popped job starts, `canceled_before_start` reads the flag and the job's status (RQ's
  `Job.cancel()` may have run on it after the pop): a canceled job is recorded and never runs;
- that read is only the quick look: the start itself is `claim_start`, one MULTI/EXEC under
  WATCH of the job's hash and its flag that marks the job `started` only if neither a flag nor
  a cancel's transaction came first. A cancel's own transaction WATCHes the hash too, so the two
  serialise: either the cancel cancels the job (`canceled`) and the claim then finds it so and
  never starts it, or the claim marks it started and the cancel reads that (`stopping`): a job
  a cancel was told `canceled` for is never seen `started`;
- while it runs, `CancelFlag` is the engine's `should_stop()`: one EXISTS at most every
  `COSYQ_CANCEL_CHECK_MS`, so a check per LLM step costs nothing;
- the engine then raises `SynthesisCanceled`; the job boundary calls `record_canceled`: status
  `canceled`, RQ's canceled registry (never failed, never retried), its started entry and the
  flag gone, and a `job.canceled` webhook event when the job asked for one. The hash names the
  cancel whose token the flag held (`keys.CANCELED_BY_FIELD`, unless a cancel's own transaction
  named itself first): that cancel, reading the job again, answers `canceled`; the others
  `already_canceled`.

RQ keeps a canceled job's hash and its canceled-registry entry for ever (its registry has no
cleanup), so the canceled hash is given the job's result TTL here (and by `cosyq cancel` for a
waiting one), and `ExpiredCancels`, a housekeeping duty, drops registry entries whose job has
expired (and gives a hash canceled before this release, with no TTL, the result TTL).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, cast

import redis
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import CanceledJobRegistry
from rq.utils import now, utcformat

from producer.webhooks import bodies
from shared import job_events, keys
from shared.logs import get_logger
from shared.settings import Settings
from workers.documents.duty import LockedDuty
from workers.service.outage import until_reachable

log = get_logger(__name__)
CLAIM_TRIES = 20  # a popped job changes a few times at most meanwhile (its cancels)
RQ_DEFAULT_RESULT_TTL_S = 500  # RQ's own, for a job enqueued without one
CANCELED_SWEEP_BATCH = 100  # oldest entries of each canceled registry looked at per tick
# The oldest ARGV[2] entries of a canceled registry: one whose job hash is gone leaves it, a
# hash kept for ever (canceled before its TTL was set) is given ARGV[3] seconds.
_EXPIRED_CANCELS = """
local gone = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)) do
  local ttl = redis.call('TTL', ARGV[1] .. id)
  if ttl == -2 then
    redis.call('ZREM', KEYS[1], id)
    gone = gone + 1
  elseif ttl == -1 then
    redis.call('EXPIRE', ARGV[1] .. id, ARGV[3])
  end
end
return gone
"""


class CancelFlag:
    """`should_stop()` for one job: True once its cancel flag exists (read at most every
    `every_s`; a Redis error reads as "not canceled": an outage never stops a job)."""

    def __init__(self, connection: redis.Redis, job_id: str, *, every_s: float) -> None:
        self.connection = connection
        self.key = keys.cancel_key(job_id)
        self.every_s = every_s
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._set = False

    def __call__(self) -> bool:
        with self._lock:
            moment = time.monotonic()
            if self._set or moment - self._read_at < self.every_s:
                return self._set
            self._read_at = moment
            try:
                self._set = bool(self.connection.exists(self.key))
            except redis.RedisError as e:
                log.warning("cancel_check_failed", key=self.key, error=str(e))
            return self._set


def canceled_before_start(connection: redis.Redis, job: Job) -> bool:
    """A popped job that must not start: its flag is set, or RQ canceled it after the pop."""
    try:
        with connection.pipeline(transaction=False) as pipe:
            pipe.exists(keys.cancel_key(job.id))
            pipe.hget(job.key, "status")
            flagged, status = pipe.execute()
    except redis.RedisError as e:
        log.warning("cancel_check_failed", job_id=job.id, error=str(e))
        return False
    return bool(flagged) or (status or b"").decode() == JobStatus.CANCELED.value


def claim_start(
    connection: redis.Redis,
    job_id: str,
    fields: Mapping[str, str | int],
    *,
    heartbeat: tuple[str, str, int],
) -> bool:
    """Mark the job `started` with `fields` and set its heartbeat (key, holder, TTL in ms), in
    one MULTI/EXEC under WATCH of its hash and its cancel flag; False, nothing written, when a
    cancel came first (the flag is set, or the job's status is `canceled`). A cancel racing it
    makes its EXEC fail and the state is read again; so does a lost answer (redis-py's
    WatchError), which finds the job as this claim left it. A Redis outage is raised."""
    job_key, flag_key = Job.key_for(job_id), keys.cancel_key(job_id)
    heartbeat_key, holder, ttl_ms = heartbeat
    with connection.pipeline() as pipe:
        for _ in range(CLAIM_TRIES):
            try:
                pipe.watch(job_key, flag_key)
                status = pipe.hget(job_key, "status")
                if pipe.exists(flag_key) or status in (b"canceled", "canceled"):
                    return False
                pipe.multi()
                started: dict[str, str | int] = {**fields, "status": JobStatus.STARTED.value}
                pipe.hset(job_key, mapping=cast(Mapping[Any, Any], started))
                pipe.set(heartbeat_key, holder, px=ttl_ms)
                pipe.execute()
                return True
            except redis.WatchError:
                pipe.reset()
    raise redis.ConnectionError(f"job {job_id} changed {CLAIM_TRIES} times while being started")


def give_back_claimed(connection: redis.Redis, job_id: str, queue: Queue) -> None:
    """A popped job that will not run now back at the head of its queue, its status `queued`
    again if `claim_start` marked it started (a cancel then cancels it as waiting); waits out an
    outage."""
    job_key = Job.key_for(job_id)

    def give_back() -> None:
        with connection.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(job_key)
                    started = pipe.hget(job_key, "status") in (b"started", "started")
                    if not started and pipe.lpos(queue.key, job_id) is not None:
                        return  # given back by a try whose answer was lost
                    pipe.multi()
                    if started:
                        pipe.hset(job_key, "status", JobStatus.QUEUED.value)
                    pipe.lpush(queue.key, job_id)
                    pipe.execute()
                    return
                except redis.WatchError:
                    pipe.reset()

    until_reachable(give_back, "job_push_back_failed")
    log.info("job_pushed_back", job_id=job_id, queue=queue.name)


def record_canceled(
    connection: redis.Redis,
    job: Job,
    queue: Queue,
    *,
    execution: Any = None,
    webhooks: job_events.WebhookPolicy | None = None,
) -> None:
    """The job ends as canceled (see the module docstring); waits out a Redis outage."""
    job.retries_left = 0

    def write() -> None:
        if webhooks is not None:
            job_events.job_ended(connection, job, "job.canceled", webhooks)
        token = connection.get(keys.cancel_key(job.id))  # the cancel told it did the work
        with connection.pipeline() as pipe:
            if token is not None:
                pipe.hsetnx(job.key, keys.CANCELED_BY_FIELD, token)
            if execution is not None:
                execution.delete(job=job, pipeline=pipe)
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            job.set_status(JobStatus.CANCELED, pipeline=pipe)
            CanceledJobRegistry(queue.name, connection=connection).add(job, pipeline=pipe)
            pipe.hset(job.key, mapping={"ended_at": utcformat(now()), "retries_left": 0})
            pipe.expire(job.key, canceled_keep_s(job))
            pipe.delete(keys.cancel_key(job.id))
            pipe.execute()

    until_reachable(write, "job_cancel_unrecorded")
    if webhooks is not None:
        bodies.keep_body(connection, job, "job.canceled", webhooks)
    log.info("job_canceled", job_id=job.id, queue=queue.name)


def canceled_keep_s(job: Job) -> int:
    """How long a canceled job stays: its result TTL (RQ's default when it has none; at least
    1 s: RQ's -1, for ever, is what a cancel must not leave)."""
    ttl = job.result_ttl
    return max(1, RQ_DEFAULT_RESULT_TTL_S if ttl is None else int(ttl))


class ExpiredCancels(LockedDuty):
    """A housekeeping duty: the canceled registries of `queues` lose the jobs that expired."""

    lock_key = keys.CANCELED_SWEEP_LOCK

    def __init__(
        self, connection: redis.Redis, settings: Settings, *, holder: str, queues: list[Queue]
    ) -> None:
        super().__init__(connection, settings, holder=holder)
        self.queues = queues
        self._sweep = connection.register_script(_EXPIRED_CANCELS)

    def tick(self) -> list[str]:
        """The queues whose canceled registry lost an entry this tick."""
        if not self.holds_this_tick():
            return []
        swept = []
        args: list[str | int] = [Job.redis_job_namespace_prefix, CANCELED_SWEEP_BATCH]
        args.append(self.settings.result_ttl_s)
        for queue in self.queues:
            registry = CanceledJobRegistry(queue.name, connection=self.connection)
            if int(self._sweep(keys=[registry.key], args=args)):
                swept.append(queue.name)
        return swept
