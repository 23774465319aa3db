"""A SimpleWorker that rides out a Redis outage instead of quitting.

RQ retries only inside its blocking dequeue; a connection error anywhere else in its loop (the
heartbeat after a job, the suspension check, maintenance, deregistration) ends the worker. Here
each of those logs and carries on, so the loop returns to the dequeue, which waits for Redis.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from rq.worker import SimpleWorker

from shared.logs import get_logger

log = get_logger(__name__)

REDIS_OUTAGE = (redis.ConnectionError, redis.TimeoutError)
REDIS_RETRY_FIRST_S = 0.5
REDIS_RETRY_MAX_S = 10.0  # longest wait between attempts to reach Redis again

T = TypeVar("T")


def until_reachable(action: Callable[[], T], event: str) -> T:
    """Run `action`, retrying with capped exponential backoff while Redis is unreachable."""
    delay = REDIS_RETRY_FIRST_S
    while True:
        try:
            return action()
        except REDIS_OUTAGE as e:
            log.warning(event, error=str(e), retry_in_s=delay)
            time.sleep(delay)
            delay = min(delay * 2, REDIS_RETRY_MAX_S)


def wait_for_redis(connection: redis.Redis) -> None:
    """Block until Redis answers: RQ's constructor and registration do not survive it down."""
    until_reachable(connection.ping, "waiting_for_redis")


class OutageTolerantWorker(SimpleWorker):
    """RQ's SimpleWorker whose bookkeeping steps survive Redis being away."""

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        try:
            super().heartbeat(timeout, pipeline)
        except REDIS_OUTAGE as e:
            log.warning("worker_heartbeat_failed", error=str(e))

    def check_for_suspension(self, burst: bool) -> None:
        try:
            super().check_for_suspension(burst)
        except REDIS_OUTAGE as e:
            log.warning("suspension_check_failed", error=str(e))  # the dequeue waits for Redis

    def run_maintenance_tasks(self) -> None:
        try:
            super().run_maintenance_tasks()
        except REDIS_OUTAGE as e:
            log.warning("maintenance_failed", error=str(e))

    def teardown(self) -> None:
        try:
            super().teardown()
        except REDIS_OUTAGE as e:
            log.warning("worker_deregister_failed", error=str(e))
