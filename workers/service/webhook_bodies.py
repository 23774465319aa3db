"""Keep the body of a job event whose recorder died before keeping it (a housekeeping duty).

Whoever records a job's outcome (the worker, the reaper, a cancel) appends its webhook event
first and keeps the event's body right after the outcome (`producer/webhooks/bodies.py`), so
the event outlives its job. A recorder that dies, or loses Redis, between the two left the
event bodiless: its body was then taken from the job at the dispatcher's first try, and a
dispatcher down longer than the job is kept (COSYQ_RESULT_TTL_S) dead-lettered it unsent.

So the append notes the event as unkept in the same step (`shared.webhooks.append_event`,
`keys.WEBHOOK_UNKEPT`, scored by when), the body kept (by its recorder, this duty or the
dispatcher) removes the note in the same transaction, and this duty, one holder per heartbeat
tick, looks at the notes older than one heartbeat interval: a job that ended as the event
says has its body kept as its recorder would have; one not ended yet (its recorder waits for
Redis, or died before the outcome and the reaper has yet to fail it) is looked at again a
heartbeat later; one gone, rerun, ended otherwise or another tenant's is dropped.
"""

from __future__ import annotations

import time
from typing import cast

from producer.webhooks.bodies import keep_unkept
from shared import keys
from shared.logs import get_logger
from workers.documents.duty import LockedDuty

log = get_logger(__name__)
UNKEPT_BATCH = 50  # events looked at per tick (the rest wait a tick)


class UnkeptBodies(LockedDuty):
    """A housekeeping duty: `tick()` once per heartbeat interval, one holder per tick."""

    lock_key = keys.WEBHOOK_UNKEPT_LOCK

    def tick(self) -> list[str]:
        """The events (their entries) this tick was done with."""
        if not self.holds_this_tick():
            return []
        now = time.time()
        grace_s = self.settings.heartbeat_interval_s
        memory_s = int(self.settings.webhook_event_memory_hours * 3600)
        due = self.connection.zrangebyscore(
            keys.WEBHOOK_UNKEPT, "-inf", now - grace_s, start=0, num=UNKEPT_BATCH, withscores=True
        )
        done = []
        for raw, noted_at in cast(list[tuple[bytes, float]], due):
            member = raw.decode() if isinstance(raw, bytes) else str(raw)
            if keep_unkept(self.connection, member, float(noted_at), memory_s):
                done.append(member)
            else:  # not ended yet: behind the others, looked at again after the grace
                self.connection.zadd(keys.WEBHOOK_UNKEPT, {member: now}, xx=True)
        return done
