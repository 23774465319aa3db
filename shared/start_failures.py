"""Why a worker slot cannot start, kept in Redis for `cosyq status`.

A worker that fails before it is ready (storage not writable, no model) exits non-zero and is
restarted with backoff by its pool (or launchd); the reason would otherwise be only in its log.
So the worker records it in `cosyq:start-failure:<host>:<slot>` (one hash per place a worker
runs, overwritten by each try, gone once a worker there is ready or after
COSYQ_START_FAILURE_TTL_S), and the pool adds how the process ended and when it tries again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import redis

from shared import keys

NO_SLOT = "-"  # a worker started without a pool (launchd, supervisord, `cosyq-worker run`)


@dataclass(frozen=True)
class StartFailure:
    """One row of `cosyq status`'s start-up failures."""

    host: str
    slot: str
    worker: str
    reason: str
    failures: int  # consecutive failed starts
    failed_at: str  # ISO 8601, UTC
    exit: str  # "exit code 2", "signal SIGKILL" (from the pool; empty without one)
    next_start_at: str  # ISO 8601, UTC (from the pool; empty without one)


def _key(host: str, slot: str) -> str:
    return f"{keys.START_FAILURE_PREFIX}{host}:{slot or NO_SLOT}"


def _now() -> datetime:
    return datetime.now(UTC)


def record_start_failure(
    connection: redis.Redis,
    *,
    host: str,
    slot: str,
    worker: str,
    reason: str,
    ttl_s: int,
    count: bool,
) -> None:
    """The worker's side: what went wrong. `count`: add one to `failures` (no pool counts)."""
    key = _key(host, slot)
    with connection.pipeline() as pipe:
        fields = {"worker": worker, "reason": reason, "failed_at": _now().isoformat()}
        pipe.hset(key, mapping=cast(Mapping[Any, Any], fields))
        if count:
            pipe.hincrby(key, "failures", 1)
        pipe.expire(key, ttl_s)
        pipe.execute()


def record_backoff(
    connection: redis.Redis,
    *,
    host: str,
    slot: str,
    how: str,
    reason: str,
    failures: int,
    backoff_s: float,
    ttl_s: int,
) -> None:
    """The pool's side: how the process ended, how often in a row, when it starts again."""
    key = _key(host, slot)
    now = _now()
    with connection.pipeline() as pipe:
        pipe.hsetnx(key, "reason", reason)  # a worker that died silently left none
        pipe.hsetnx(key, "failed_at", now.isoformat())
        fields = {
            "exit": how,
            "failures": str(failures),
            "next_start_at": (now + timedelta(seconds=backoff_s)).isoformat(),
        }
        pipe.hset(key, mapping=cast(Mapping[Any, Any], fields))
        pipe.expire(key, ttl_s)
        pipe.execute()


def clear_start_failure(connection: redis.Redis, *, host: str, slot: str) -> None:
    """A worker at this place is ready: its predecessors' failure is history."""
    connection.delete(_key(host, slot))


def start_failures(connection: redis.Redis) -> list[StartFailure]:
    """Every recorded start-up failure, by host and slot."""
    rows = []
    for key in connection.scan_iter(match=keys.START_FAILURE_PREFIX + "*", count=500):
        name = _text(key)[len(keys.START_FAILURE_PREFIX) :]
        host, _, slot = name.rpartition(":")
        raw = {_text(k): _text(v) for k, v in connection.hgetall(key).items()}
        if not raw:
            continue  # expired between the scan and the read
        rows.append(
            StartFailure(
                host=host,
                slot=slot,
                worker=raw.get("worker", ""),
                reason=raw.get("reason", ""),
                failures=_int(raw.get("failures")),
                failed_at=raw.get("failed_at", ""),
                exit=raw.get("exit", ""),
                next_start_at=raw.get("next_start_at", ""),
            )
        )
    return sorted(rows, key=lambda row: (row.host, row.slot))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0
