"""Canceling a job: a queued one never runs, a running one stops at its next step.

The flag `cosyq:cancel:<id>` is set first, whatever the state, so a job that a worker pops in
the instant between our read and RQ's `Job.cancel()` is still stopped: the worker checks the
flag at every piece or LLM step, and before it starts a job, in the MULTI/EXEC that marks it
started under WATCH of its hash and flag (workers/service/cancels.claim_start): that start
and this cancel's transaction serialise on the hash, so a job told `canceled` never starts. A
job still waiting (queued, scheduled for a retry, deferred) is then canceled with RQ's own
`Job.cancel()`: out of its queue and registries, status `canceled`, in the canceled registry.
A job that already ended is left exactly as it is. No worker ever sees a job canceled while
waiting, so its `job.canceled` webhook event (when it asked for one) is appended here, in
`Job.cancel()`'s transaction, under the id a worker would give it (shared/job_events.py): told
once.

The state is read under WATCH of the job's hash and the cancel is that read's MULTI/EXEC: a
worker that pops and starts (or even finishes) the job between the read and the cancel writes
its status into the hash, the EXEC is refused and the state is read again. So a finished job is
never marked canceled over its result.

Of many cancels at once exactly one says `canceled`, whoever did the work: each cancel sets the
flag to a token of its own, and the job's hash names the cancel it is told to
(`keys.CANCELED_BY_FIELD`): the cancel whose transaction canceled it, or, when a worker popped
the job, saw the flag and canceled it first (workers/service/cancels.py), the token the worker
read in the flag. Every cancel that set the flag while the job waited reads the state again
after the worker's record (its EXEC is refused), and finds its own token there or not.

A transaction whose answer is lost (the connection dropped after Redis applied it: redis-py
raises WatchError, or ConnectionError when it cannot reconnect at once) is read back the same
way, by this same cancel with its token: it finds its own token and says `canceled`, never
`already_canceled` for what it did itself. Redis away meanwhile is waited out for
COSYQ_CANCEL_LOST_ANSWER_WAIT_S (then TransientError: whether it applied is unknown).

A caller's retry of a cancel whose answer it never got (a 503, a dropped connection) is a new
cancel: with an idempotency key (`Idempotency-Key` on DELETE) both are one. The key, per tenant
and hashed as a submit's is (`keys.tenant_digest`), makes the cancel's token, so the retry finds
its own token on a job its first try canceled; and each try that decides (`canceled` in its
transaction, `stopping` with the flag) records its verdict and the state it read at
`cosyq:idem:cancel:<job id>:<digest>` for the flag's TTL, which a retry answers with: the same
body as the first try's.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Literal, cast

import redis
from redis.client import Pipeline
from rq.exceptions import InvalidJobOperation
from rq.job import Job

from producer.tracking import JobTracker
from producer.webhooks.bodies import keep_body
from shared import keys
from shared.connection import REDIS_OUTAGE
from shared.errors import InvalidRequestError, JobNotFoundError, TransientError
from shared.job_events import WebhookPolicy, job_ended
from shared.jobs import MAX_IDEMPOTENCY_KEY_CHARS

CancelVerdict = Literal["canceled", "stopping", "already_canceled", "already_ended"]
WAITING_STATES = frozenset({"queued", "scheduled", "deferred"})
ENDED_STATES = frozenset({"finished", "failed", "stopped"})
CANCEL_TRIES = 20  # a waiting job changes state a few times at most (popped, started, ended)
LOST_ANSWER_WAIT_S = 10.0  # COSYQ_CANCEL_LOST_ANSWER_WAIT_S's default
LOST_ANSWER_PAUSE_S = 1.0  # the longest pause between two reads back while Redis is away


@dataclass(frozen=True)
class CancelOutcome:
    """What a cancel did: `canceled` (it will never run), `stopping` (running: it stops at its
    next step), `already_canceled`, or `already_ended` (`state` says how; nothing changed)."""

    job_id: str
    verdict: CancelVerdict
    state: str

    @property
    def changed(self) -> bool:
        return self.verdict in ("canceled", "stopping")

    def describe(self) -> str:
        return {
            "canceled": f"job {self.job_id} canceled (it was {self.state}; it will not run)",
            "stopping": f"job {self.job_id} is running: it stops at its next step",
            "already_canceled": f"job {self.job_id} was already canceled",
            "already_ended": f"job {self.job_id} already {self.state}: nothing changed",
        }[self.verdict]


def cancel_job(
    connection: redis.Redis,
    tracker: JobTracker,
    job_id: str,
    *,
    flag_ttl_s: int,
    webhooks: WebhookPolicy | None = None,
    lost_answer_wait_s: float = LOST_ANSWER_WAIT_S,
    idempotency: str | None = None,
) -> CancelOutcome:
    """Cancel one job (see the module docstring); JobNotFoundError for an unknown id.
    `webhooks`: tell a waiting job's cancel to its webhook (None: the caller tells).
    `lost_answer_wait_s`: how long Redis may stay away once this cancel's transaction was
    sent and its answer lost (then TransientError: whether it applied is unknown).
    `idempotency`: the caller's key as `idempotency_digest` makes it; a cancel with the same
    one answers as the first did."""
    job = tracker.fetch(job_id)
    mine = _Canceler.keyed(job_id, idempotency) if idempotency else _Canceler.fresh()
    if (replay := mine.replay(connection)) is not None:
        return replay
    changes, lost = 0, _LostAnswer(lost_answer_wait_s)
    with connection.pipeline() as pipe:
        while changes < CANCEL_TRIES:
            try:
                outcome, acted = _cancel_watched(
                    connection, pipe, job, mine, flag_ttl_s=flag_ttl_s, webhooks=webhooks
                )
            except redis.WatchError:  # the job changed meanwhile (or the EXEC's answer was lost)
                changes += 1
            except REDIS_OUTAGE as e:
                if not mine.sent:
                    raise  # nothing done that only this cancel can tell
                lost.wait_once(job_id, e)  # then read back, this cancel's token in hand
            else:
                if acted and webhooks is not None:  # a worker's cancel keeps its own body
                    keep_body(connection, job, "job.canceled", webhooks)
                return outcome
            pipe.reset()
    raise TransientError(
        f"job {job_id} changed state {CANCEL_TRIES} times while being canceled; try again"
    )


@dataclass
class _Canceler:
    """One cancel: its token (it is told `canceled` when the job's hash names it), the
    waiting state it last read (what a job a worker canceled for it was) and whether it has
    sent its transaction (whose answer may be lost: only its token then tells it applied)."""

    token: str
    job_id: str = ""
    digest: str | None = None  # a keyed cancel's (idempotency_digest)
    waited: str = "queued"
    sent: bool = False

    @classmethod
    def fresh(cls) -> _Canceler:
        return cls(secrets.token_hex(16))

    @classmethod
    def keyed(cls, job_id: str, digest: str) -> _Canceler:
        token = hashlib.sha256(f"cancel {digest}".encode()).hexdigest()[:32]
        return cls(token, job_id, digest)

    @property
    def record_key(self) -> str | None:
        """Where a keyed cancel's verdict is kept for its retries."""
        if self.digest is None:
            return None
        return keys.cancel_idempotency_key(self.job_id, self.digest)

    def replay(self, connection: redis.Redis) -> CancelOutcome | None:
        """What an earlier try with this key answered (None: none recorded)."""
        if self.record_key is None or (raw := _text(connection.get(self.record_key))) is None:
            return None
        verdict, _, state = raw.partition(" ")
        if verdict not in ("canceled", "stopping"):
            return None
        return CancelOutcome(self.job_id, cast(CancelVerdict, verdict), state)

    def record(self, pipe: Pipeline, verdict: str, state: str, ttl_s: int) -> None:
        """Queue this keyed cancel's answer for its retries, and its digest in the job's
        index of them (`keys.cancel_records_key`: what an erasure deletes)."""
        if self.record_key is not None and self.digest is not None:
            pipe.set(self.record_key, f"{verdict} {state}", ex=ttl_s)
            pipe.sadd(keys.cancel_records_key(self.job_id), self.digest)
            pipe.expire(keys.cancel_records_key(self.job_id), ttl_s)


def idempotency_digest(key: str, tenant: str) -> str:
    """A cancel's idempotency key as one tenant's name (keys.tenant_digest), checked as a
    submit's is (InvalidRequestError)."""
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS or not key.isprintable():
        raise InvalidRequestError(
            f"idempotency_key: {len(key)} characters, must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} "
            "printable characters"
        )
    return keys.tenant_digest(key, tenant)


class _LostAnswer:
    """Redis away after this cancel sent its transaction: each `wait_once` sleeps a little
    longer (up to LOST_ANSWER_PAUSE_S), until `wait_s` has passed (then TransientError)."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self.since: float | None = None
        self.pause_s = 0.05

    def wait_once(self, job_id: str, error: Exception) -> None:
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        left = self.since + self.wait_s - now
        if left <= 0:
            raise TransientError(
                f"job {job_id}: Redis went away as it was being canceled and was still away "
                f"{self.wait_s:g} s later ({error}); whether it was canceled is unknown: try again"
            ) from error
        time.sleep(min(self.pause_s, left))
        self.pause_s = min(self.pause_s * 2, LOST_ANSWER_PAUSE_S)


def _cancel_watched(
    connection: redis.Redis,
    pipe: Pipeline,
    job: Job,
    mine: _Canceler,
    *,
    flag_ttl_s: int,
    webhooks: WebhookPolicy | None,
) -> tuple[CancelOutcome, bool]:
    """One try: the state read under WATCH of the job's hash, then (a waiting job) the event,
    RQ's cancel and this cancel's token as the hash's canceler in one MULTI/EXEC; WatchError
    when the job changed meanwhile. With the outcome: whether this try's EXEC canceled it."""
    pipe.watch(job.key)
    raw, canceler = pipe.hmget(job.key, ["status", keys.CANCELED_BY_FIELD])
    if raw is None and not pipe.exists(job.key):
        raise JobNotFoundError(f"no job {job.id} (deleted while being canceled)")
    state = _text(raw) or "unknown"
    if state == "canceled":  # by a worker for this cancel's flag, or by another cancel
        if _text(canceler) == mine.token:  # also this cancel's own EXEC, its answer lost
            return CancelOutcome(job.id, "canceled", mine.waited), mine.sent
        return CancelOutcome(job.id, "already_canceled", state), False
    if state in ENDED_STATES:
        return CancelOutcome(job.id, "already_ended", state), False
    # outside the transaction, at once: a worker popping the job from now on reads it first
    connection.set(keys.cancel_key(job.id), mine.token, ex=flag_ttl_s)
    if state not in WAITING_STATES:  # started (or a state RQ adds later): the worker stops it
        with connection.pipeline() as keep:  # the verdict and its index's TTL together
            mine.record(keep, "stopping", state, flag_ttl_s)
            keep.execute()
        return CancelOutcome(job.id, "stopping", state), False
    mine.waited = state
    pipe.multi()
    if webhooks is not None:
        job_ended(pipe, job, "job.canceled", webhooks)
    try:
        job.cancel(pipeline=pipe)
    except (InvalidJobOperation, ValueError) as e:
        # changed under us: canceled by another cancel, or taken by a worker (RQ reads the
        # job's executions outside the transaction and finds one gone: ValueError)
        raise redis.WatchError(f"job {job.id} changed while being canceled") from e
    pipe.hset(job.key, keys.CANCELED_BY_FIELD, mine.token)
    mine.record(pipe, "canceled", state, flag_ttl_s)
    pipe.expire(job.key, flag_ttl_s)  # RQ keeps a canceled job for ever: kept as a result is
    mine.sent = True
    pipe.execute()
    return CancelOutcome(job.id, "canceled", state), True


def _text(raw: bytes | str | None) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw
