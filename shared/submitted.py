"""The producer's record of every job it submitted, which the orphan sweep reads.

One sorted set (`keys.SUBMITTED_JOBS`): job id -> submit time. Written in the same pipeline as
the enqueue, so a job is never in a queue without being in the index.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from redis import Redis
from redis.client import Pipeline

from shared import keys


def record_submitted(
    target: Redis | Pipeline, job_ids: Sequence[str], at: float | None = None
) -> None:
    """Add the ids with their submit time (now unless given)."""
    if job_ids:
        stamp = time.time() if at is None else at
        target.zadd(keys.SUBMITTED_JOBS, dict.fromkeys(job_ids, stamp))
