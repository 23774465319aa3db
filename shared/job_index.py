"""What the operator's page (`/ui`) reads without loading every job: indexes kept beside RQ's.

- jobs and documents by submit time, in one sorted set for all and one per tenant
  (`keys.JOB_INDEX[:tenant]`, `keys.DOCUMENT_INDEX[:tenant]`), written by the producer in the
  same transaction as the enqueue; entries older than the TTL are trimmed as new ones come,
  each only once its job or document has expired (one still queued, failed or kept alive stays
  listed), a bounded batch per submit, so a page reads a range (ZREVRANGE) and never the whole
  set;
- suspect results waiting for a judgement (`keys.SUSPECT_INDEX[:tenant]`) and each finished
  job's small summary (verdict, audio seconds), written by the worker as it returns a result;
- throughput per minute (jobs, audio seconds, failures), kept two hours;
- judgements (accepted, regenerated, failed) with who made them and when.

Everything is JSON or plain numbers: nothing here is ever unpickled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.client import Pipeline
from rq.job import Job

from shared import keys
from shared.document_state import DOCUMENT_PREFIX

THROUGHPUT_KEEP_S = 2 * 3600  # the chart shows the last hour; a minute's hash lives two
STOPPED_KEEP_S = 3600  # a stopped worker stays on the fleet view this long
SUMMARY_VERDICT, SUMMARY_AUDIO_S = "verdict", "audio_s"
JUDGEMENTS = ("accepted", "regenerated", "failed")
# Old index entries looked at per submit, besides one per id the submit adds (so the trim
# always gains on the index). One whose job or document still lives is kept and looked at
# again when the trim comes round to it: each trim goes on where the last one stopped.
TRIM_BATCH = 1000
# KEYS[1] an index, KEYS[2] the trims' cursors (hash: index -> rank); ARGV: the cutoff score,
# the prefix of the record key that lives as long as an entry's item (+ its id), most entries
# looked at. The entries scored before the cutoff are the index's first ranks: it looks at the
# next ARGV[3] of them from its cursor (from the first again once past the last), removes those
# whose record is gone and keeps its place; O(log N + ARGV[3]). Returns how many it removed.
_TRIM_EXPIRED = """
local old = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. ARGV[1])
if old == 0 then return 0 end
local at = tonumber(redis.call('HGET', KEYS[2], KEYS[1]) or '0')
if at >= old then at = 0 end
local last = math.min(at + tonumber(ARGV[3]), old) - 1
local removed = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], at, last)) do
  if redis.call('EXISTS', ARGV[2] .. id) == 0 then
    removed = removed + redis.call('ZREM', KEYS[1], id)
  end
end
redis.call('HSET', KEYS[2], KEYS[1], last + 1 - removed)
return removed
"""


def owned(key: str, tenant: str | None) -> str:
    """The all-tenants index `key`, or one tenant's (`key:tenant`)."""
    return key if tenant is None else f"{key}:{tenant}"


def index_jobs(
    target: Redis | Pipeline,
    tenant: str,
    job_ids: Sequence[str],
    *,
    keep_s: float,
    at: float | None = None,
) -> None:
    """Add submitted jobs to the all-tenants and the tenant's index; drop entries older than
    `keep_s` (RQ's longest TTL) whose job has expired (its RQ hash is gone) from both. A job
    outlives its submit time + TTL while it waits in a deep queue or runs, and a failed one
    for the failure TTL from its end, so an entry's age alone does not say it is gone."""
    _index(target, keys.JOB_INDEX, tenant, job_ids, keep_s=keep_s, at=at)


def index_document(
    target: Redis | Pipeline, tenant: str, document_id: str, *, keep_s: float
) -> None:
    """Add a submitted document to the all-tenants and the tenant's index; drop entries older
    than `keep_s` whose document has expired (its plan is gone) from both. A document outlives
    its submit time + TTL while a job of it waits or runs (the keepalive, a segment starting, a
    retry renew its plan), so an entry's age alone does not say it is gone."""
    _index(target, keys.DOCUMENT_INDEX, tenant, [document_id], keep_s=keep_s, at=None)


def _index(
    target: Redis | Pipeline,
    key: str,
    tenant: str,
    ids: Sequence[str],
    *,
    keep_s: float,
    at: float | None,
) -> None:
    if not ids:
        return
    stamp = time.time() if at is None else at
    record = Job.redis_job_namespace_prefix if key == keys.JOB_INDEX else DOCUMENT_PREFIX
    for name in (key, owned(key, tenant)):
        target.zadd(name, dict.fromkeys(ids, stamp))
        cutoff, batch = repr(stamp - keep_s), TRIM_BATCH + len(ids)
        target.eval(_TRIM_EXPIRED, 2, name, keys.INDEX_TRIM_CURSORS, cutoff, record, batch)


def page_ids(
    connection: Redis,
    key: str,
    tenant: str | None,
    *,
    offset: int,
    count: int,
    since: float | None = None,
) -> list[tuple[str, float]]:
    """(id, submit time) newest first: `count` from `offset`, submitted at or after `since`."""
    raw: Any = connection.zrevrangebyscore(
        owned(key, tenant),
        "+inf",
        "-inf" if since is None else since,
        start=offset,
        num=count,
        withscores=True,
    )
    return [(_text(member), float(score)) for member, score in raw]


def count_ids(connection: Redis, key: str, tenant: str | None) -> int:
    return int(connection.zcard(owned(key, tenant)))


@dataclass(frozen=True)
class Outcome:
    """What the worker tells the page about a job as it returns: its audio and verdict."""

    job_id: str
    tenant: str | None
    audio_s: float
    verdict: str | None  # ok, suspect; None: no quality check ran
    keep_s: float  # the result TTL


def record_outcome(connection: Redis, outcome: Outcome, *, at: float | None = None) -> None:
    """The job's summary, this minute's throughput, and the suspect queue (a suspect result)."""
    stamp = time.time() if at is None else at
    summary = {SUMMARY_VERDICT: outcome.verdict, SUMMARY_AUDIO_S: round(outcome.audio_s, 3)}
    with connection.pipeline(transaction=False) as pipe:
        pipe.set(keys.JOB_SUMMARY_PREFIX + outcome.job_id, json.dumps(summary), ex=_ttl(outcome))
        _count_minute(pipe, stamp, outcome.tenant, jobs=1, audio_s=outcome.audio_s)
        if outcome.verdict == "suspect":
            for tenant in (None, outcome.tenant) if outcome.tenant else (None,):
                pipe.zadd(owned(keys.SUSPECT_INDEX, tenant), {outcome.job_id: stamp})
        pipe.execute()


def record_failure(connection: Redis, tenant: str | None, *, at: float | None = None) -> None:
    """One failed job (of `tenant`) in this minute's throughput."""
    with connection.pipeline(transaction=False) as pipe:
        _count_minute(pipe, time.time() if at is None else at, tenant, failed=1)
        pipe.execute()


def _ttl(outcome: Outcome) -> int:
    return max(1, int(outcome.keep_s))


def _count_minute(
    pipe: Pipeline,
    stamp: float,
    tenant: str | None,
    *,
    jobs: int = 0,
    audio_s: float = 0.0,
    failed: int = 0,
) -> None:
    """The minute's counts, for the fleet and for the tenant (a tenant sees only its own)."""
    for owner in (None, tenant) if tenant else (None,):
        key = _minute_key(owner, int(stamp // 60))
        if jobs:
            pipe.hincrby(key, "jobs", jobs)
            pipe.hincrbyfloat(key, "audio_s", audio_s)
        if failed:
            pipe.hincrby(key, "failed", failed)
        pipe.expire(key, THROUGHPUT_KEEP_S)


def _minute_key(tenant: str | None, minute: int) -> str:
    return keys.THROUGHPUT_PREFIX + (f"{tenant}:" if tenant else "") + str(minute)


@dataclass(frozen=True)
class Minute:
    start: float  # unix seconds
    jobs: int
    audio_s: float
    failed: int


def throughput(
    connection: Redis,
    tenant: str | None = None,
    *,
    minutes: int = 60,
    now: float | None = None,
) -> list[Minute]:
    """The last `minutes` minutes of the fleet (or of `tenant`), oldest first (a minute with
    nothing done reads zero)."""
    last = int((time.time() if now is None else now) // 60)
    starts = list(range(last - minutes + 1, last + 1))
    with connection.pipeline(transaction=False) as pipe:
        for minute in starts:
            pipe.hgetall(_minute_key(tenant, minute))
        rows = pipe.execute()
    found = []
    for minute, row in zip(starts, rows, strict=True):
        values = {_text(k): _text(v) for k, v in row.items()}
        found.append(
            Minute(
                start=minute * 60.0,
                jobs=int(values.get("jobs", 0)),
                audio_s=float(values.get("audio_s", 0.0)),
                failed=int(values.get("failed", 0)),
            )
        )
    return found


def summaries(connection: Redis, job_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Each job's summary ({} when it has none: not finished, or expired)."""
    if not job_ids:
        return []
    raw = connection.mget([keys.JOB_SUMMARY_PREFIX + job_id for job_id in job_ids])
    return [_json_object(value) for value in raw]


def save_judgement(
    connection: Redis, job_id: str, tenant: str | None, record: dict[str, Any], *, keep_s: float
) -> None:
    """The judgement (JSON) kept for the result TTL; the job leaves the suspect queue."""
    with connection.pipeline() as pipe:
        pipe.set(keys.JUDGEMENT_PREFIX + job_id, json.dumps(record), ex=max(1, int(keep_s)))
        for owner in (None, tenant) if tenant else (None,):
            pipe.zrem(owned(keys.SUSPECT_INDEX, owner), job_id)
        pipe.execute()


def claim_judgement(
    connection: Redis, job_id: str, record: dict[str, Any], *, keep_s: float
) -> bool:
    """Take the job's judgement for `record` (SET NX): False when someone judged it first."""
    key = keys.JUDGEMENT_PREFIX + job_id
    return bool(connection.set(key, json.dumps(record), nx=True, ex=max(1, int(keep_s))))


def release_judgement(connection: Redis, job_id: str) -> None:
    """Give a claimed judgement back (its action could not be carried out)."""
    connection.delete(keys.JUDGEMENT_PREFIX + job_id)


def judgement_of(connection: Redis, job_id: str) -> dict[str, Any] | None:
    value = connection.get(keys.JUDGEMENT_PREFIX + job_id)
    return _json_object(value) or None


def _json_object(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    try:
        parsed = json.loads(value)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# Stopped workers older than STOPPED_KEEP_S leave the sorted set and their stats the hash; so do
# stats no name in the set holds (a release that trimmed the set alone left them).
_TRIM_STOPPED = f"""
local cutoff = '(' .. (tonumber(ARGV[1]) - {STOPPED_KEEP_S})
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
if redis.call('HLEN', KEYS[2]) <= redis.call('ZCARD', KEYS[1]) then return 0 end
local gone = 0
for _, name in ipairs(redis.call('HKEYS', KEYS[2])) do
  if not redis.call('ZSCORE', KEYS[1], name) then
    redis.call('HDEL', KEYS[2], name)
    gone = gone + 1
  end
end
return gone
"""


def record_stopped_worker(
    target: Redis | Pipeline, name: str, stats: dict[str, str], *, at: float | None = None
) -> None:
    """A worker that stopped, with its last stats, for the fleet view (kept STOPPED_KEEP_S)."""
    stamp = time.time() if at is None else at
    target.zadd(keys.STOPPED_WORKERS, {name: stamp})
    target.hset(keys.STOPPED_WORKER_STATS, name, json.dumps({**stats, "stopped_at": stamp}))
    # the names trimmed take their stats with them (the hash grew by one field a recycle)
    target.eval(_TRIM_STOPPED, 2, keys.STOPPED_WORKERS, keys.STOPPED_WORKER_STATS, stamp)


def stopped_workers(connection: Redis, *, now: float | None = None) -> list[dict[str, Any]]:
    """Workers stopped within STOPPED_KEEP_S, newest first, each its last stats."""
    stamp = time.time() if now is None else now
    cutoff = stamp - STOPPED_KEEP_S
    old: Any = connection.zrangebyscore(keys.STOPPED_WORKERS, "-inf", f"({cutoff}")
    if old:  # their stats go with them (the hash would otherwise grow with every recycle)
        connection.hdel(keys.STOPPED_WORKER_STATS, *old)
        connection.zrem(keys.STOPPED_WORKERS, *old)
    names: Any = connection.zrevrangebyscore(keys.STOPPED_WORKERS, "+inf", cutoff)
    if not names:
        return []
    raw: Any = connection.hmget(keys.STOPPED_WORKER_STATS, names)
    return [record for record in (_json_object(value) for value in raw) if record]
