"""A SimpleWorker that rides out a Redis outage instead of quitting.

RQ retries only inside its blocking dequeue; a connection error anywhere else in its loop (the
heartbeat after a job, the suspension check, maintenance, deregistration) ends the worker. Here
each of those logs and carries on, so the loop returns to the dequeue, which waits for Redis.
A misconfiguration (wrong password, ACL, TLS certificate) is never waited out: it becomes a
RedisRefusedError, and `cosyq-worker run` turns that into one line and a non-zero exit.

Once a warm stop is asked, every such wait is bounded (`STOP_BOUND`, armed by the worker's
first signal with COSYQ_STOP_REDIS_WAIT_S): past it the worker gives up on Redis and exits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import redis
from rq.worker import SimpleWorker

from shared.connection import REDIS_OUTAGE, misconfiguration, probe_redis
from shared.logs import get_logger

log = get_logger(__name__)

REDIS_RETRY_FIRST_S = 0.5
REDIS_RETRY_MAX_S = 10.0  # longest wait between attempts to reach Redis again
STOP_CHECK_S = 0.25  # while waiting out an outage, how often a stop is looked for

REFUSED_EXIT_CODE = 2  # the settings must be fixed; restarting as-is cannot help
STOP_WAIT_EXIT_CODE = 3  # a warm stop gave up waiting for Redis (COSYQ_STOP_REDIS_WAIT_S)

T = TypeVar("T")


class StopBound:
    """How long, once a warm stop is asked, this process still waits for Redis; past that,
    `on_expiry` (which must not return: it ends the process) is called by the next wait."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.on_expiry: Callable[[str], NoReturn] | None = None

    def arm(self, wait_s: float, on_expiry: Callable[[str], NoReturn]) -> None:
        """The first call counts (a second signal is the cold stop, not a new bound)."""
        if self.deadline is None:
            self.deadline, self.on_expiry = time.monotonic() + wait_s, on_expiry

    def disarm(self) -> None:
        """No stop asked: a new worker in this process (tests run several) starts unbounded."""
        self.deadline, self.on_expiry = None, None

    def left_s(self) -> float:
        """Seconds left (infinity when no stop was asked)."""
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def check(self, event: str) -> None:
        """Give up (`on_expiry(event)`) once the bound has passed."""
        if self.on_expiry is not None and self.left_s() <= 0:
            self.on_expiry(event)


STOP_BOUND = StopBound()  # one per process: the signal handler arms what every wait reads


class RedisRefusedError(SystemExit):
    """Redis turned this process's settings away (password, ACL user, NOPERM, TLS certificate).

    A SystemExit because RQ's loop retries connection errors forever and swallows every other
    exception; it lets SystemExit through, so the process ends (status 2) after its teardown.
    """

    def __init__(self, error: redis.RedisError, cause: str) -> None:
        super().__init__(REFUSED_EXIT_CODE)
        self.error = error
        self.cause = cause


def refuse_or_wait(error: redis.RedisError) -> None:
    """Raise RedisRefusedError for a misconfiguration, re-raise anything but an outage."""
    cause = misconfiguration(error)
    if cause is not None:
        raise RedisRefusedError(error, cause) from error
    if not isinstance(error, REDIS_OUTAGE):
        raise error


def until_reachable(action: Callable[[], T], event: str) -> T:
    """Run `action`, retrying with capped exponential backoff while Redis is unreachable."""
    result = _retry_outages(action, event, stopped=lambda: False)
    assert result is not None  # never stopped: only a result ends the wait
    return result[0]


def until_reachable_or_stopped(
    action: Callable[[], T], event: str, stopped: Callable[[], bool]
) -> T | None:
    """As `until_reachable`, but None once `stopped()` says so: for an action that holds
    nothing yet (a pop), so a stop during an outage still lets the worker leave."""
    result = _retry_outages(action, event, stopped)
    return None if result is None else result[0]


def _retry_outages(
    action: Callable[[], T], event: str, stopped: Callable[[], bool]
) -> tuple[T] | None:
    """(action's result,) once Redis answers; None when `stopped()` during a pause."""
    delay = REDIS_RETRY_FIRST_S
    while True:
        try:
            return (action(),)
        except redis.RedisError as e:
            refuse_or_wait(e)
            STOP_BOUND.check(event)
            log.warning(event, error=str(e), retry_in_s=delay)
            deadline = time.monotonic() + delay
            while not stopped() and time.monotonic() < deadline and STOP_BOUND.left_s() > 0:
                time.sleep(min(STOP_CHECK_S, max(0.0, deadline - time.monotonic())))
            if stopped():
                return None
            delay = min(delay * 2, REDIS_RETRY_MAX_S)


def wait_for_redis(connection: redis.Redis) -> None:
    """Block until Redis answers: RQ's constructor and registration do not survive it down.

    The probe also reads and writes, so a user without the permissions fails here, at once.
    """
    until_reachable(lambda: probe_redis(connection), "waiting_for_redis")


class OutageTolerantWorker(SimpleWorker):
    """RQ's SimpleWorker whose bookkeeping steps survive Redis being away."""

    def register_birth(self) -> None:
        """RQ's registration, waited for: Redis may go away between the worker saying ready
        and its loop's first pop (a stop meanwhile ends the wait: the worker holds nothing)."""
        until_reachable_or_stopped(
            super().register_birth, "worker_register_waiting", lambda: self._stop_requested
        )

    def set_state(self, state: Any, pipeline: Any = None) -> None:
        """The worker hash's state field; a write lost to an outage is logged, and the next
        one (the loop sets it at every job) puts it right."""
        if pipeline is not None:  # written by the caller's pipeline, and its errors its own
            super().set_state(state, pipeline)
            return
        try:
            super().set_state(state)
        except redis.RedisError as e:
            refuse_or_wait(e)
            log.warning("worker_state_unrecorded", state=str(state), error=str(e))

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        try:
            super().heartbeat(timeout, pipeline)
        except redis.RedisError as e:
            refuse_or_wait(e)
            log.warning("worker_heartbeat_failed", error=str(e))

    def check_for_suspension(self, burst: bool) -> None:
        try:
            super().check_for_suspension(burst)
        except redis.RedisError as e:
            refuse_or_wait(e)
            log.warning("suspension_check_failed", error=str(e))  # the dequeue waits for Redis

    def run_maintenance_tasks(self) -> None:
        try:
            super().run_maintenance_tasks()
        except redis.RedisError as e:
            refuse_or_wait(e)
            log.warning("maintenance_failed", error=str(e))

    def teardown(self) -> None:
        try:
            super().teardown()
        except REDIS_OUTAGE as e:
            log.warning("worker_deregister_failed", error=str(e))
        finally:
            STOP_BOUND.disarm()  # this worker's stop is over
