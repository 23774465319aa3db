"""The safety net under "no job lost": put back queued jobs that sit in no list at all.

A job whose status is `queued` but that is in no queue, no intermediate list and no registry
will never run: nothing pops it, no reaper sees it. Stops cannot cause that any more
(workers/service/dequeue.py), but a pop reply lost with its connection still can. The producer
records every submitted id in `keys.SUBMITTED_JOBS` (score: submit time); this sweep, run by
one worker's housekeeping per tick (a short lock), checks the oldest entries only:
- finished, failed, stopped, canceled or expired jobs leave the index;
- a job found where it belongs (its queue, a registry) is re-scored to now: looked at again
  one bound later, so the index rotates and each tick costs at most `batch` checks;
- a queued job found nowhere is a suspect; still nowhere `orphan_after_s` later, it goes back
  to the head of its queue (`job_orphan_requeued`). Two sightings a bound apart mean a worker
  that has just popped it (registered milliseconds later) is never raced;
- a started job in no started registry and with no heartbeat is one a reaper took from its
  dead worker (the ZREM that makes a reaper its owner) and then lost Redis before it requeued
  or failed it: nothing else would ever look at it again. Seen so a bound apart, it goes back
  to its started registry (`job_orphan_released`), where the reaper retries or fails it as a
  dead worker's job, telling its webhook.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import redis
from rq.job import Job
from rq.queue import Queue
from rq.registry import DeferredJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.utils import as_text, parse_composite_key

from shared import keys
from shared.logs import get_logger

log = get_logger(__name__)

DONE_STATUSES = frozenset({"finished", "failed", "stopped", "canceled"})
CHECKS_PER_JOB = 4  # queue list, intermediate list, scheduled and deferred registries


@dataclass(frozen=True)
class SweepResult:
    checked: int
    forgotten: int
    suspects: int
    requeued: tuple[str, ...]
    released: tuple[str, ...] = ()  # started jobs handed back to the reaper


class OrphanSweep:
    """Checks the oldest submitted ids each tick (see the module docstring)."""

    def __init__(
        self, connection: redis.Redis, *, orphan_after_s: float, batch: int, holder: str
    ) -> None:
        self.connection = connection
        self.orphan_after_s = orphan_after_s
        self.batch = batch
        self.holder = holder

    def tick(self, interval_s: float) -> SweepResult | None:
        """Sweep once, unless another process holds this tick's lock."""
        lock_ms = max(1, int(interval_s * 1000))
        if not self.connection.set(keys.ORPHAN_SWEEP_LOCK, self.holder, nx=True, px=lock_ms):
            return None
        return self.sweep()

    def sweep(self, now: float | None = None) -> SweepResult:
        now = time.time() if now is None else now
        due = self.connection.zrangebyscore(
            keys.SUBMITTED_JOBS, "-inf", now - self.orphan_after_s, start=0, num=self.batch
        )
        ids = [as_text(raw) for raw in cast(list[bytes], due)]
        if not ids:
            return SweepResult(0, 0, 0, ())
        with self.connection.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(Job.key_for(job_id), "status", "origin")
            found = pipe.execute()
        forgotten: list[str] = []
        fine: list[str] = []
        by_state: dict[str, list[tuple[str, str]]] = {"queued": [], "started": []}
        for job_id, (status, origin) in zip(ids, found, strict=True):
            state = as_text(status) if status is not None else None
            if state is None or state in DONE_STATUSES or origin is None:
                forgotten.append(job_id)
            elif state in by_state:
                by_state[state].append((job_id, as_text(origin)))
            else:
                fine.append(job_id)  # scheduled, deferred: a registry has it
        lost = self._nowhere(by_state["queued"])
        unheld = self._unheld(by_state["started"])
        fine += [job_id for job_id, _ in by_state["queued"] if job_id not in lost]
        fine += [job_id for job_id, _ in by_state["started"] if job_id not in unheld]
        requeued = self._handle_lost(lost, now)
        released = self._handle_lost(unheld, now, started=True)
        back = [*requeued, *released]
        with self.connection.pipeline(transaction=False) as pipe:
            if forgotten:
                pipe.zrem(keys.SUBMITTED_JOBS, *forgotten)
            settled = forgotten + fine + back
            if settled:
                pipe.zrem(keys.ORPHAN_SUSPECTS, *settled)
            if fine or back:
                pipe.zadd(keys.SUBMITTED_JOBS, dict.fromkeys([*fine, *back], now), xx=True)
            pipe.execute()
        suspects = len(lost) + len(unheld) - len(back)
        return SweepResult(len(ids), len(forgotten), suspects, requeued, released)

    def _nowhere(self, queued: Sequence[tuple[str, str]]) -> dict[str, str]:
        """The queued jobs that are in no queue list, intermediate list or registry."""
        if not queued:
            return {}
        running = self._started_ids({origin for _, origin in queued})
        with self.connection.pipeline(transaction=False) as pipe:
            for job_id, origin in queued:
                queue = Queue(origin, connection=self.connection)
                pipe.lpos(queue.key, job_id)
                pipe.lpos(queue.intermediate_queue_key, job_id)
                pipe.zscore(ScheduledJobRegistry(origin, connection=self.connection).key, job_id)
                pipe.zscore(DeferredJobRegistry(origin, connection=self.connection).key, job_id)
            replies = pipe.execute()
        lost = {}
        for index, (job_id, origin) in enumerate(queued):
            places = replies[index * CHECKS_PER_JOB : (index + 1) * CHECKS_PER_JOB]
            if job_id not in running and all(place is None for place in places):
                lost[job_id] = origin
        return lost

    def _started_ids(self, origins: set[str]) -> set[str]:
        """Ids in the started registries (entries are "job id:execution id"). A queued job
        there is between registration and start, or its worker died: the reaper's case."""
        ids = set()
        for origin in origins:
            key = StartedJobRegistry(origin, connection=self.connection).key
            for raw in cast(list[bytes], self.connection.zrange(key, 0, -1)):
                ids.add(parse_composite_key(as_text(raw))[0])
        return ids

    def _unheld(self, started: Sequence[tuple[str, str]]) -> dict[str, str]:
        """The started jobs in no started registry whose heartbeat is gone: no worker runs
        them and no reaper will ever see them."""
        if not started:
            return {}
        registered = self._started_ids({origin for _, origin in started})
        with self.connection.pipeline(transaction=False) as pipe:
            for job_id, _ in started:
                pipe.exists(keys.job_heartbeat_key(job_id))
            beating = pipe.execute()
        return {
            job_id: origin
            for (job_id, origin), alive in zip(started, beating, strict=True)
            if job_id not in registered and not alive
        }

    def _handle_lost(
        self, lost: dict[str, str], now: float, *, started: bool = False
    ) -> tuple[str, ...]:
        """Mark first sightings; put back those seen nowhere for a whole bound: a queued job at
        the head of its queue, a `started` one in its started registry, for the reaper."""
        if not lost:
            return ()
        with self.connection.pipeline(transaction=False) as pipe:
            for job_id in lost:
                pipe.zscore(keys.ORPHAN_SUSPECTS, job_id)
            first_seen = pipe.execute()
        requeued = []
        with self.connection.pipeline(transaction=False) as pipe:
            for (job_id, origin), seen in zip(lost.items(), first_seen, strict=True):
                if seen is None:
                    pipe.zadd(keys.ORPHAN_SUSPECTS, {job_id: now}, nx=True)
                elif now - float(seen) >= self.orphan_after_s:
                    if started:  # no heartbeat: the reaper's next pass releases it
                        registry = StartedJobRegistry(origin, connection=self.connection)
                        pipe.zadd(registry.key, {f"{job_id}:orphaned": now + self.orphan_after_s})
                    else:
                        pipe.lpush(Queue(origin, connection=self.connection).key, job_id)
                    requeued.append(job_id)
                    log.warning(
                        "job_orphan_released" if started else "job_orphan_requeued",
                        job_id=job_id,
                        queue=origin,
                        orphaned_for_s=round(now - float(seen), 1),
                    )
            pipe.execute()
        return tuple(requeued)
