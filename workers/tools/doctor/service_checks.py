"""Services rows: Redis (version, latency, auth with the password masked, eviction policy),
storage (a probe object written, read back and deleted), and the queues with the workers
listening on them and any worker slots that cannot start.

Reuses the worker's own start-up checks (`shared.connection.check_redis` classification and
`shared.storage_probe`), so doctor names the same cause a worker would exit with.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.exceptions import AuthorizationError, NoPermissionError
from rq import Queue, Worker
from rq.worker import BaseWorker

from shared import keys
from shared.connection import misconfiguration, probe_redis, redis_connection
from shared.settings import Settings
from shared.start_failures import start_failures
from shared.storage_probe import probe_configured_storage
from workers.tools.doctor.rows import Row, fail, ok, one_line, skip

GROUP = "services"
REDIS_ROW = "Redis"
STORAGE_ROW = "storage writable"
QUEUES_ROW = "queues and workers"
ROW_NAMES = (REDIS_ROW, STORAGE_ROW, QUEUES_ROW)  # in report order
REDIS_HINT = "check COSYQ_REDIS_URL (host, port, TLS) and that redis-server is running"
MIN_REDIS = (6, 2)  # deploy/README.md: Redis 6.2 or newer
AUTH_HINT = "fix the user and password in COSYQ_REDIS_URL (redis://user:password@host:port/db)"
# Any other refusal: another service's port, TLS, a database the server lacks, not a Sentinel
URL_HINT = "fix COSYQ_REDIS_URL: its scheme (rediss:// for TLS), host, port or database"


def service_rows(settings: Settings) -> list[Row]:
    connection = redis_connection(settings)
    try:
        redis_row, reachable = check_redis_row(connection, settings)
        rows = [redis_row, storage_row(settings)]
        if reachable:
            rows.append(queues_row(connection))
        else:
            rows.append(skip(GROUP, QUEUES_ROW, "Redis is not reachable"))
        return rows
    finally:
        connection.close()


def check_redis_row(connection: redis.Redis, settings: Settings) -> tuple[Row, bool]:
    """The Redis row, and whether Redis answered (the queues row needs it)."""
    url = settings.redacted_redis_url()
    try:
        probe_redis(connection)  # the worker's own start-up probe: PING, read, write
        started = time.perf_counter()
        connection.ping()
        latency_ms = (time.perf_counter() - started) * 1e3
        info = connection.info("server")
        policy = _eviction_policy(connection)
    except redis.RedisError as e:
        cause = misconfiguration(e)
        if cause is not None:
            credentials = isinstance(
                e, redis.AuthenticationError | AuthorizationError | NoPermissionError
            )
            hint = AUTH_HINT if credentials else URL_HINT
            return fail(GROUP, REDIS_ROW, f"{url}: {cause}", hint), False
        return fail(
            GROUP, REDIS_ROW, f"cannot reach Redis at {url}: {one_line(e)}", REDIS_HINT
        ), False
    version = str(info.get("redis_version", "?"))
    detail = f"{url}: Redis {version}, {latency_ms:.1f} ms round trip, {_auth(settings)}"
    if policy:
        detail += f", maxmemory-policy {policy}"
    if _too_old(version):
        hint = f"upgrade Redis to {'.'.join(map(str, MIN_REDIS))} or newer"
        return fail(GROUP, REDIS_ROW, detail + ": too old for RQ and cosyq", hint), True
    if policy and policy != "noeviction":
        return fail(
            GROUP,
            REDIS_ROW,
            detail + ": Redis may evict a queued job's hash (a lost job)",
            "set maxmemory-policy noeviction in redis.conf (or the provider's parameter group)",
            required=False,
        ), True
    figures = {"version": version, "latency_ms": round(latency_ms, 2), "policy": policy}
    return ok(GROUP, REDIS_ROW, detail, **figures), True


def _too_old(version: str) -> bool:
    try:
        return tuple(int(part) for part in version.split(".")[:2]) < MIN_REDIS
    except ValueError:
        return False  # a fork with its own numbering: let the probe's verdict stand


def _eviction_policy(connection: redis.Redis) -> str:
    """maxmemory-policy from INFO memory ("" when the server does not say)."""
    try:
        return str(connection.info("memory").get("maxmemory_policy", ""))
    except redis.ResponseError:  # an ACL without INFO memory: the probe already passed
        return ""


def _auth(settings: Settings) -> str:
    parts = urlsplit(settings.redis_url)
    if parts.password is None:
        return "no password"
    user = parts.username or "default"
    return f"authenticated as {user} (password ***)"


def storage_row(settings: Settings) -> Row:
    outcome = probe_configured_storage(settings, mode="write")
    if outcome.ok:
        note = f" ({outcome.warning})" if outcome.warning else ""
        return ok(
            GROUP,
            STORAGE_ROW,
            f"{outcome.url}: wrote, read back and deleted a "
            f"probe object in {outcome.elapsed_s * 1e3:.0f} ms{note}",
        )
    return fail(
        GROUP,
        STORAGE_ROW,
        f"{outcome.url} ({outcome.verdict.value}): {outcome.cause}",
        "check COSYQ_STORAGE_URL: a writable folder (file://) or a bucket and keys "
        "(s3://, COSYQ_S3_*)",
    )


def queues_row(connection: redis.Redis) -> Row:
    """Depth of each cosyq queue and the workers listening on any of them (advice only)."""
    try:
        depths = {
            name: Queue(name, connection=connection).count for name in keys.QUEUES_IN_PRIORITY_ORDER
        }
        workers = [w for w in Worker.all(connection=connection) if _listens(w)]
        failures = start_failures(connection)
    except redis.RedisError as e:
        return fail(GROUP, QUEUES_ROW, one_line(e), REDIS_HINT, required=False)
    queued = ", ".join(f"{name} {depth}" for name, depth in depths.items())
    listening = f"{len(workers)} worker(s) listening" + (
        "" if workers else " (start one: cosyq-worker run, or cosyq-worker pool)"
    )
    figures: dict[str, Any] = {
        "depths": depths,
        "workers": sorted(w.name for w in workers),
        "start_failures": [f"{f.host}:{f.slot}: {f.reason}" for f in failures],
    }
    detail = f"queued: {queued}; {listening}"
    if failures:
        first = failures[0]
        return fail(
            GROUP,
            QUEUES_ROW,
            f"{detail}; {len(failures)} worker slot(s) cannot start, e.g. {first.host}:"
            f"{first.slot}: {first.reason}",
            "fix the cause named (cosyq status lists every slot), then restart the workers",
            required=False,
        )
    return ok(GROUP, QUEUES_ROW, detail, **figures)


def _listens(worker: BaseWorker) -> bool:
    return any(name in keys.QUEUES_IN_PRIORITY_ORDER for name in worker.queue_names())
