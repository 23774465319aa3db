"""When a worker process should retire so a fresh one replaces it.

Like gunicorn's max_requests + jitter and Celery's max memory per child: a worker retires after
its own job budget (max_jobs + a per-process random jitter, so slots do not all recycle at the
same moment), after a job that left RSS above the limit, after its maximum lifetime, and at once
after a job timeout (SIGALRM interrupted Python mid-call: state may be unsound) or after a batch
window whose model thread failed (the model is unsound: a fresh worker loads it anew).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class RecycleSettings(Protocol):
    max_jobs: int
    max_jobs_jitter: int | None
    max_rss_mb: int
    max_lifetime_s: int


class RecycleReason(StrEnum):
    MAX_JOBS = "max_jobs"
    RSS = "rss"
    LIFETIME = "lifetime"
    JOB_TIMEOUT = "job_timeout"
    MODEL_FAILED = "model_failed"

    @property
    def urgent(self) -> bool:
        """Urgent reasons exit right away; the others may wait for the pool's turn."""
        return self in (RecycleReason.JOB_TIMEOUT, RecycleReason.MODEL_FAILED)


@dataclass(frozen=True)
class RecyclePolicy:
    """The limits, as configured (COSYQ_MAX_JOBS, COSYQ_MAX_JOBS_JITTER, ...)."""

    max_jobs: int
    max_jobs_jitter: int
    max_rss_mb: int
    max_lifetime_s: float

    @classmethod
    def from_settings(cls, settings: RecycleSettings) -> RecyclePolicy:
        jitter = settings.max_jobs_jitter
        if jitter is None:
            jitter = settings.max_jobs // 10  # default: 10% of max_jobs, rounded down
        return cls(
            max_jobs=settings.max_jobs,
            max_jobs_jitter=max(0, jitter),
            max_rss_mb=settings.max_rss_mb,
            max_lifetime_s=float(settings.max_lifetime_s),
        )

    def job_budget(self, rng: random.Random | None = None) -> int:
        """This process's own job count: max_jobs plus 0..jitter, drawn once per process (by
        default with a generator seeded from the OS, so slots started together differ)."""
        rng = rng if rng is not None else random.Random(int.from_bytes(os.urandom(8), "little"))
        return self.max_jobs + rng.randint(0, self.max_jobs_jitter)


class RecycleTracker:
    """Counts one process's jobs and age against its policy."""

    def __init__(
        self,
        policy: RecyclePolicy,
        *,
        job_budget: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.job_budget = job_budget
        self.jobs_done = 0
        self._clock = clock
        self._born = clock()

    def lifetime_left_s(self) -> float:
        return self.policy.max_lifetime_s - (self._clock() - self._born)

    def lifetime_expired(self) -> bool:
        return self.lifetime_left_s() <= 0

    def after_job(self, *, rss_mb: float, timed_out: bool) -> RecycleReason | None:
        """Count one finished job (success or failure) and say whether to retire now."""
        self.jobs_done += 1
        if timed_out:
            return RecycleReason.JOB_TIMEOUT
        if rss_mb > self.policy.max_rss_mb:
            return RecycleReason.RSS
        if self.jobs_done >= self.job_budget:
            return RecycleReason.MAX_JOBS
        if self.lifetime_expired():
            return RecycleReason.LIFETIME
        return None
