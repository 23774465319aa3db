"""Whether Redis may evict cosyq's keys, told once at start-up as a warning.

RQ keeps each job in a hash (`rq:job:<id>`) and each queue in a list; a Redis at its
`maxmemory` with an evicting `maxmemory-policy` drops keys to make room: an `allkeys-*` policy
any of them (a queued job's hash: the job is lost without a trace, its id still in the queue),
a `volatile-*` one those with a TTL (finished jobs' results, idempotency keys: a retried submit
runs twice). Eviction needs `maxmemory` set (0: no limit, nothing is evicted), so a policy
other than `noeviction` under a limit is warned of by `cosyq serve`, `cosyq-worker pool` and a
lone `cosyq-worker run`. A warning, not a refusal, as Sidekiq does: nothing is lost until
memory fills, managed Redis services default to `volatile-lru`, and refusing would stop a whole
fleet where a parameter group takes a maintenance window to change (`cosyq-worker doctor`
flags it too). An ACL user without INFO is not warned (the start-up probe has passed).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from shared.logs import get_logger

log = get_logger(__name__)

SAFE_POLICY = "noeviction"


@dataclass(frozen=True)
class Eviction:
    """An evicting policy under a memory limit, as INFO memory says."""

    policy: str
    maxmemory: int  # bytes

    def warning(self) -> str:
        lost = "a queued job" if self.policy.startswith("allkeys") else "a finished job's result"
        return (
            f"Redis may evict cosyq's keys (maxmemory-policy {self.policy}, maxmemory "
            f"{self.maxmemory:,} bytes): {lost} can be lost without a trace once memory fills;"
            f" set maxmemory-policy {SAFE_POLICY}"
        )


def eviction(connection: redis.Redis) -> Eviction | None:
    """The evicting policy Redis runs under its memory limit; None when it evicts nothing."""
    try:
        info = connection.info("memory")
    except redis.RedisError:  # an ACL user without INFO, Redis gone since: a warning never stops
        return None
    policy = str(info.get("maxmemory_policy", SAFE_POLICY))
    maxmemory = int(info.get("maxmemory", 0) or 0)
    if policy == SAFE_POLICY or maxmemory == 0:
        return None
    return Eviction(policy, maxmemory)


def warn_if_evicting(connection: redis.Redis, process: str) -> None:
    """Log `redis_may_evict` once, at start-up, when Redis may evict (see module docstring)."""
    found = eviction(connection)
    if found is not None:
        log.warning(
            "redis_may_evict",
            process=process,
            policy=found.policy,
            maxmemory=found.maxmemory,
            message=found.warning(),
        )
