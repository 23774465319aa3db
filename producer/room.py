"""Room in a tenant's queues: which planned jobs fit now, the error when none can, and which
priorities the tenant may use at all (`check_priority`).

The client reads the depths of the tenant's queues under WATCH and enqueues the chunk this
module chose in the same transaction (producer/client.py `_take_room`), so the check and the
take are one atomic step: a quota is never passed by producers submitting at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from producer.planned import PlannedJob
from shared.errors import (
    InvalidRequestError,
    QueueFullError,
    SubmitInterruptedError,
    TenantQuotaError,
)
from shared.plurals import counted
from shared.settings import Settings


@dataclass(frozen=True)
class Room:
    """The limits one submit works within: per queue, per tenant, per chunk."""

    tenant: str
    max_queue_depth: int
    max_queued_jobs: int  # the tenant's quota
    chunk_size: int
    retry_after_s: int

    @classmethod
    def for_tenant(cls, settings: Settings, tenant: str) -> Room:
        return cls(
            tenant=tenant,
            max_queue_depth=settings.max_queue_depth,
            max_queued_jobs=settings.max_queued_jobs(tenant),
            chunk_size=settings.submit_chunk_size,
            retry_after_s=settings.http_retry_after_s,
        )

    def fitting(
        self, planned: Sequence[PlannedJob], start: int, depths: dict[str, int], *, whole: bool
    ) -> list[PlannedJob]:
        """The longest run from `start` that fits the chunk size (all of `planned` when
        `whole`), each queue's depth and the tenant's quota; empty when none fits, or, when
        `whole`, when not all of it does."""
        room = {queue: self.max_queue_depth - depth for queue, depth in depths.items()}
        tenant_room = self.max_queued_jobs - sum(depths.values())
        end = len(planned) if whole else start + self.chunk_size
        chunk: list[PlannedJob] = []
        for job in planned[start:end]:
            if room[job.queue] <= 0 or tenant_room <= 0:
                break
            room[job.queue] -= 1
            tenant_room -= 1
            chunk.append(job)
        return chunk if not whole or len(chunk) == len(planned) - start else []

    def never_fits(self, planned: Sequence[PlannedJob], *, whole: bool) -> bool:
        """True when jobs that go in together outnumber a limit: waiting cannot help."""
        if not whole or not planned:
            return False
        per_queue = max(Counter(job.queue for job in planned).values())
        return len(planned) > self.max_queued_jobs or per_queue > self.max_queue_depth

    def refusal(
        self,
        planned: Sequence[PlannedJob],
        start: int,
        depths: dict[str, int],
        submitted: list[str],
        *,
        whole: bool,
    ) -> QueueFullError | TenantQuotaError:
        """Why the job at `start` (all of `planned`, when `whole`) cannot go in now."""
        queued = sum(depths.values())
        needed = len(planned) - start if whole else 1
        if whole:
            outcome = (
                f"these {needed:,} jobs go in together or not at all: none was submitted"
                if needed > 1
                else "it was not submitted"
            )
        else:
            outcome = f"{len(submitted):,} submitted"
        if self.max_queued_jobs - queued < needed:
            return self.quota_error(queued, outcome, submitted)
        full = planned[start].queue  # a document's segments all wait in one queue
        return self.queue_full(full, depths[full], outcome, submitted)

    def quota_error(
        self, queued: int, outcome: str, submitted: Sequence[str] = ()
    ) -> TenantQuotaError:
        return TenantQuotaError(
            f"tenant {self.tenant} has {counted(queued, 'job')} queued (quota max_queued_jobs "
            f"{self.max_queued_jobs:,}, COSYQ_TENANT_QUOTAS); {outcome}",
            tenant=self.tenant,
            quota="max_queued_jobs",
            retry_after_s=self.retry_after_s,
            submitted=tuple(submitted),
        )

    def queue_full(
        self, queue: str, depth: int, outcome: str, submitted: Sequence[str] = ()
    ) -> QueueFullError:
        return QueueFullError(
            f"{queue} holds {counted(depth, 'job')} "
            f"(COSYQ_MAX_QUEUE_DEPTH {self.max_queue_depth:,}); {outcome}",
            queue=queue,
            depth=depth,
            submitted=tuple(submitted),
        )


def refusal_of_one(
    room: Room, queue: str, depths: dict[str, int]
) -> QueueFullError | TenantQuotaError | None:
    """Why one more job (an add-voice job) cannot wait in `queue` now; None when it fits."""
    queued = sum(depths.values())
    if queued >= room.max_queued_jobs:
        return room.quota_error(queued, "nothing was submitted")
    if depths[queue] >= room.max_queue_depth:
        return room.queue_full(queue, depths[queue], "nothing was submitted")
    return None


def interrupted(
    error: redis.RedisError, chunk: Sequence[PlannedJob], total: int, submitted: list[str]
) -> SubmitInterruptedError:
    """Why a chunk did not go in, which one, and how many jobs did (never the job bytes)."""
    first, last = chunk[0].index + 1, chunk[-1].index + 1
    if isinstance(error, redis.exceptions.OutOfMemoryError):  # refused before EXEC ran
        what = f"Redis is out of memory (maxmemory): the chunk of requests {first:,}-{last:,}"
        what += " was refused"
    else:  # the reply was lost: the chunk may or may not be in
        what = f"Redis failed ({type(error).__name__}): the chunk of requests {first:,}-{last:,}"
        what += " was not confirmed (it may be queued)"
    return SubmitInterruptedError(
        f"{what}; {len(submitted):,} of the {counted(total, 'job')} went in before it",
        submitted=tuple(submitted),
    )


def check_priority(settings: Settings, tenant: str, priority: str) -> None:
    """InvalidRequestError when `priority` is above `tenant`'s max_priority: workers serve every
    tenant's high queue first, so a tenant held to default must not fill one."""
    if not settings.allows_priority(tenant, priority):
        raise InvalidRequestError(
            f"priority: {priority} is above tenant {tenant}'s highest, "
            f"{settings.max_priority(tenant)} (COSYQ_TENANT_MAX_PRIORITY, COSYQ_TENANT_QUOTAS)"
        )
