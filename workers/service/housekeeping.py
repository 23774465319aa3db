"""A worker's background duties, run by one thread every heartbeat interval.

The main thread may sit in a long synthesis (or a blocking dequeue) for minutes, so everything
that must keep happening meanwhile lives here: refresh the running job's heartbeat key, publish
the worker's stats hash for `cosyq status`, reap jobs of dead workers, promote due retries, and
any extra checks the worker adds (lifetime, parent pool gone). Each duty survives Redis errors;
an outage is logged once when a duty first fails and once when Redis answers again (an idle
worker's heartbeat duty asks Redis nothing, so it never counts as a recovery); after it the
reaper waits one heartbeat TTL so live workers can refresh their keys first.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, cast

import redis
from redis.client import Pipeline
from rq.queue import Queue

from shared import keys
from shared.job_index import record_stopped_worker
from shared.logs import get_logger
from workers.service import metrics
from workers.service.cancels import claim_start
from workers.service.host import rss_mb
from workers.service.orphans import OrphanSweep
from workers.service.reaper import Reaper
from workers.service.retries import promote_due_retries

log = get_logger(__name__)

# Delete the heartbeat key only if it still names us (a reaped job may run elsewhere by now).
_DELETE_IF_OURS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
STOP_JOIN_TIMEOUT_S = 5.0


class NotReplicatedError(redis.ConnectionError):
    """The attempt's record did not reach COSYQ_REDIS_WAIT_REPLICAS replicas in time.

    An outage for the job (it is put back, not run): after a failover an attempt that only the
    old master saw would be forgotten, and the job would run again under the same count.
    """


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class WorkerState(StrEnum):
    """A worker's state as `cosyq status` shows it."""

    STARTING = "starting"
    LOADING = "loading"
    IDLE = "idle"
    BUSY = "busy"
    RETIRING = "retiring"
    STOPPING = "stopping"


@dataclass
class WorkerStats:
    """What `cosyq status` shows for one worker (hash `cosyq:worker-stats:<name>`)."""

    name: str
    pid: int
    host: str
    queues: str
    slot: str = ""
    state: WorkerState = WorkerState.STARTING
    current_job: str = ""
    jobs_done: int = 0
    backend: str = ""
    device: str = ""
    model: str = ""
    family: str = ""  # the model directory's: cosyvoice2 or cosyvoice3
    threads: int = 0
    started_at: str = field(default_factory=utc_now_iso)
    ready_at: str = ""

    def as_mapping(self) -> dict[str, str]:
        values = {name: str(value) for name, value in asdict(self).items()}
        values["rss_mb"] = f"{rss_mb():.0f}"
        return values


class Housekeeper:
    """Owns the heartbeats of the running jobs and the periodic duties (see module docstring)."""

    def __init__(
        self,
        connection: redis.Redis,
        stats: WorkerStats,
        reaper: Reaper,
        queues: list[Queue],
        *,
        interval_s: float,
        ttl_s: float,
        wait_replicas: int = 0,
        wait_timeout_s: float = 1.0,
        orphans: OrphanSweep | None = None,
    ) -> None:
        self.connection = connection
        self.stats = stats
        self.reaper = reaper
        self.orphans = orphans
        self.queues = queues
        self.interval_s = interval_s
        self.ttl_ms = int(ttl_s * 1000)
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = max(1, int(wait_timeout_s * 1000))
        self.extra_duties: list[Callable[[], None]] = []
        self._job_ids: dict[str, None] = {}  # running jobs, oldest first (several when batching)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cosyq-housekeeping", daemon=True)
        self._failing = False
        self._recovered_at: float | None = None
        self._delete_if_ours = connection.register_script(_DELETE_IF_OURS)

    @property
    def stats_key(self) -> str:
        return keys.worker_stats_key(self.stats.name)

    def start(self) -> None:
        self.tick()  # start-up duties (reap what a previous worker left) before anything else
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(STOP_JOIN_TIMEOUT_S)
        stopped = {**self.stats.as_mapping(), "state": "stopped"}
        with (
            contextlib.suppress(redis.RedisError),
            self.connection.pipeline(transaction=False) as pipe,
        ):
            pipe.delete(self.stats_key)
            record_stopped_worker(pipe, self.stats.name, stopped)  # the /ui fleet view
            pipe.execute()

    def set_state(self, state: WorkerState) -> None:
        self.stats.state = state
        self._guarded("publish_stats", self.publish_stats)

    def begin_job(self, job_id: str, job_fields: Mapping[str, str | int]) -> bool:
        """Claim the job's start against its cancels (workers/service/cancels.claim_start):
        `job_fields` and status `started` written to its hash and its heartbeat set, in one
        MULTI/EXEC; False, nothing written, when a cancel came first. Called before RQ
        registers the job (see workers/reaper.py for why). With wait_replicas, the stats write
        after it WAITs for them (NotReplicatedError if too few): replication keeps order, so
        replicas that have that write have the claim."""
        heartbeat = (keys.job_heartbeat_key(job_id), self.stats.name, self.ttl_ms)
        if not claim_start(self.connection, job_id, job_fields, heartbeat=heartbeat):
            return False
        with self._lock:
            self._job_ids[job_id] = None
            self.stats.state, self.stats.current_job = WorkerState.BUSY, ",".join(self._job_ids)
        try:
            self._publish_claim(job_id)
        except BaseException:
            self._forget(job_id)  # the caller gives the job back: it is no longer ours
            raise
        return True

    def _publish_claim(self, job_id: str) -> None:
        """The stats write after a claim, and (wait_replicas) its WAIT."""
        with self.connection.pipeline(transaction=False) as pipe:
            self._queue_stats(pipe)
            if self.wait_replicas:
                pipe.wait(self.wait_replicas, self.wait_timeout_ms)  # the stats write's offset
            replies = pipe.execute()
        if self.wait_replicas and int(replies[-1]) < self.wait_replicas:
            raise NotReplicatedError(
                f"job {job_id}: attempt on {replies[-1]} of {self.wait_replicas} replicas after "
                f"{self.wait_timeout_ms} ms"
            )

    def _forget(self, job_id: str) -> None:
        """A claimed job that will not run here after all (begin_job failed after its claim):
        off the heartbeat list at once, so no refresh keeps it alive once it is given back
        (another worker may take it), and its heartbeat key dropped if it still names us (best
        effort: else it expires within the TTL; a job given back is queued, which a reaper
        never takes). Not counted as a job done."""
        with self._lock:
            self._job_ids.pop(job_id, None)
            self.stats.current_job = ",".join(self._job_ids)
            if self.stats.state is WorkerState.BUSY and not self._job_ids:
                self.stats.state = WorkerState.IDLE
        key = keys.job_heartbeat_key(job_id)
        with contextlib.suppress(redis.RedisError):
            self._delete_if_ours(keys=[key], args=[self.stats.name])

    def end_job(self, job_id: str) -> None:
        """Drop the heartbeat; called after RQ removed the job from the started registry."""
        with self._lock:
            self._job_ids.pop(job_id, None)
            self.stats.jobs_done += 1
            self.stats.current_job = ",".join(self._job_ids)
            if self.stats.state is WorkerState.BUSY and not self._job_ids:
                self.stats.state = WorkerState.IDLE
        key = keys.job_heartbeat_key(job_id)

        def release() -> None:
            with self.connection.pipeline(transaction=False) as pipe:
                self._delete_if_ours(keys=[key], args=[self.stats.name], client=pipe)
                self._queue_stats(pipe)
                pipe.execute()

        self._guarded("end_job", release)

    def publish_stats(self) -> None:
        with self.connection.pipeline(transaction=False) as pipe:
            self._queue_stats(pipe)
            pipe.execute()

    def _queue_stats(self, pipe: Pipeline) -> None:
        metrics.set_worker_state(self.stats.state)  # every state change passes through here
        pipe.hset(self.stats_key, mapping=cast(Mapping[Any, Any], self.stats.as_mapping()))
        pipe.pexpire(self.stats_key, self.ttl_ms)

    def tick(self) -> None:
        """One round of every duty; errors are logged, never raised."""
        healthy = self._guarded("heartbeat", self._refresh_heartbeat)
        healthy = self._guarded("publish_stats", self.publish_stats) and healthy
        if healthy and self._reaper_armed():
            self._guarded("reap", self.reaper.reap)
            if self.orphans is not None:
                self._guarded("orphan_sweep", self._sweep_orphans)
        self._guarded("promote_retries", lambda: promote_due_retries(self.connection, self.queues))
        for duty in self.extra_duties:
            self._guarded(getattr(duty, "__name__", "duty"), duty, uses_redis=False)

    def _sweep_orphans(self) -> None:
        assert self.orphans is not None
        self.orphans.tick(self.interval_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()

    def _refresh_heartbeat(self) -> bool:
        """Refresh the running job's heartbeat; False when idle (Redis was not asked)."""
        with self._lock:
            job_ids = list(self._job_ids)
        if not job_ids:
            return False
        with self.connection.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.set(keys.job_heartbeat_key(job_id), self.stats.name, px=self.ttl_ms)
            pipe.execute()
        return True

    def _reaper_armed(self) -> bool:
        """False for one TTL after a Redis outage, so live workers re-claim their jobs first."""
        if self._recovered_at is None:
            return True
        if time.monotonic() - self._recovered_at >= self.ttl_ms / 1000:
            self._recovered_at = None
            return True
        return False

    def _guarded(self, duty: str, action: Callable[[], object], *, uses_redis: bool = True) -> bool:
        try:
            asked = action()
        except redis.RedisError as e:
            if not self._failing:
                log.warning("housekeeping_redis_error", duty=duty, error=str(e), pid=os.getpid())
            self._failing = True
            return False
        except Exception:
            log.exception("housekeeping_error", duty=duty)
            return False
        if self._failing and uses_redis and asked is not False:  # Redis answered: it is back
            self._failing = False
            self._recovered_at = time.monotonic()
            log.info("housekeeping_redis_recovered", duty=duty, pid=os.getpid())
        return True
