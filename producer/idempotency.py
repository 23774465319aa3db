"""Idempotency keys: the first submit of a key makes the job, later ones get its id.

Each key (`cosyq:idem:<sha256>`; a document's `cosyq:document-idem:<sha256>`) holds
`<job id> <claimed at> <enqueued at>` (Redis server seconds; a document's key its id alone, the
form fronts of earlier releases read) for `COSYQ_IDEMPOTENCY_TTL_S`,
and is written only in the transaction that enqueues its job (`claim`): a submitter killed at
any point leaves either the job and its key, or neither, never a key naming a job that will
never exist. The submitter WATCHes each key as it reads the holder (`holders`), so of two
submitters of one key the second's transaction is refused and, reading again, it finds the
first's job. A key whose job no longer exists (deleted by `rq empty` or a dashboard, or
expired; a document's plan gone) is free again, so a resubmit makes a new job instead of
answering with a dead id. A key of `<job id> <claimed at>` alone was claimed before its job by
an earlier release: "no such job" is trusted for it only once it is older than
`COSYQ_IDEMPOTENCY_CLAIM_GRACE_S` (its submit may still be on its way).
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.client import Pipeline
from rq.job import Job

# KEYS: idempotency keys. ARGV: grace, holder key prefix, then one job id per key. Read only.
# Returns, per key, "" when it is free for our job, else the id of the job that holds it (a
# key twice in the list: the later claim sees the earlier one's job as the holder).
_HOLDERS_SCRIPT = """
local now = tonumber(redis.call('TIME')[1])
local grace, prefix = tonumber(ARGV[1]), ARGV[2]
local answers, ours = {}, {}
for i, key in ipairs(KEYS) do
  local answer = ours[key] or ''
  local previous = answer == '' and redis.call('GET', key)
  if previous then
    local id, at, enqueued = string.match(previous, '^(%S+) (%d+) ?(%d*)$')
    if not id then id, at, enqueued = previous, '0', '' end
    local in_flight = enqueued == '' and now - tonumber(at) < grace
    if in_flight or redis.call('EXISTS', prefix .. id) == 1 then
      answer = id
    end
  end
  if answer == '' then ours[key] = ARGV[2 + i] end
  answers[i] = answer
end
return answers
"""

# KEYS: idempotency keys. ARGV: ttl, stamped (1 or 0), then one job id per key: each key names
# its job, claimed and enqueued now (stamped), or its id alone.
_CLAIM_SCRIPT = """
local now = redis.call('TIME')[1]
for i, key in ipairs(KEYS) do
  local value = ARGV[2 + i]
  if ARGV[2] == '1' then value = value .. ' ' .. now .. ' ' .. now end
  redis.call('SET', key, value, 'EX', ARGV[1])
end
return 0
"""


def holders(
    pipe: Pipeline,
    claims: Sequence[tuple[str, str]],
    *,
    grace_s: float,
    prefix: str = Job.redis_job_namespace_prefix,
) -> list[str | None]:
    """On a pipeline that WATCHes each claim's (Redis key, our job id) key, before its MULTI:
    who holds each key; per claim None if it is free for ours, else the holder's id. `prefix`
    + id is the key whose existence says the holder lives (a job's hash; a document's plan)."""
    if not claims:
        return []
    args: list[str | float] = [grace_s, prefix, *(job_id for _, job_id in claims)]
    replies = pipe.eval(_HOLDERS_SCRIPT, len(claims), *(key for key, _ in claims), *args)
    return [_text(reply) or None for reply in replies]


def claim(
    pipe: Pipeline, claims: Sequence[tuple[str, str]], *, ttl_s: int, stamped: bool = True
) -> None:
    """Queue, in the transaction that enqueues the jobs (after `holders` found the keys
    free), each key's claim for its job: `<id> <claimed at> <enqueued at>`, or (`stamped`
    False) `<id>` alone, the form a document's key had before 950dc28 and a front of such a
    release reads whole as the id (`holders` reads both alike: enqueued, or no time: never in
    flight, the holder's existence decides)."""
    if claims:
        keys = [key for key, _ in claims]
        ids = [job_id for _, job_id in claims]
        pipe.eval(_CLAIM_SCRIPT, len(claims), *keys, ttl_s, int(stamped), *ids)


def _text(reply: bytes | str | None) -> str:
    if isinstance(reply, bytes):
        return reply.decode()
    return reply or ""
