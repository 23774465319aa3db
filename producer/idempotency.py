"""Idempotency keys: the first submit of a key makes the job, later ones get its id.

Each key (`cosyq:idem:<sha256>`) holds `<job id> <reserved at>` (Redis server seconds) for
`COSYQ_IDEMPOTENCY_TTL_S`; the pipeline that enqueues the job appends `<enqueued at>` to it
(`mark_enqueued`). A key whose job no longer exists (deleted by `rq empty` or a dashboard, or
expired) is free again, so a resubmit makes a new job instead of answering with a dead id:
- once the key says its job was enqueued, a missing job hash means the job is gone, at once;
- a key not marked enqueued may belong to a submit whose job is still on its way into Redis, so
  "no such job" is only trusted once it is older than `COSYQ_IDEMPOTENCY_CLAIM_GRACE_S`.
Check and claim run in one Lua script, so two submitters never both win. A document's key
(`cosyq:document-idem:<sha256>`) works the same way, its plan standing for the job hash.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import redis
from redis.client import Pipeline
from rq.job import Job

# KEYS: idempotency keys. ARGV: ttl, grace, job key prefix, then one job id per key.
# Returns, per key, "" when our job got it, else the id of the job that holds it.
_RESERVE_SCRIPT = """
local now = tonumber(redis.call('TIME')[1])
local ttl, grace, prefix = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local answers = {}
for i, key in ipairs(KEYS) do
  local answer = ''
  local previous = redis.call('GET', key)
  if previous then
    local id, at, enqueued = string.match(previous, '^(%S+) (%d+) ?(%d*)$')
    if not id then id, at, enqueued = previous, '0', '' end
    local in_flight = enqueued == '' and now - tonumber(at) < grace
    if in_flight or redis.call('EXISTS', prefix .. id) == 1 then
      answer = id
    end
  end
  if answer == '' then redis.call('SET', key, ARGV[3 + i] .. ' ' .. now, 'EX', ttl) end
  answers[i] = answer
end
return answers
"""

# KEYS: idempotency keys. ARGV: one job id per key. Appends the enqueue time to each key that
# still names that job and is not marked yet (its TTL kept).
_MARK_ENQUEUED_SCRIPT = """
local now = redis.call('TIME')[1]
for i, key in ipairs(KEYS) do
  local value = redis.call('GET', key)
  if value and string.match(value, '^(%S+) (%d+)$') == ARGV[i] then
    redis.call('SET', key, value .. ' ' .. now, 'KEEPTTL')
  end
end
return 0
"""

# Compare-and-delete: free a key only if it still names our job.
_RELEASE_SCRIPT = """
local value = redis.call('GET', KEYS[1])
if value and string.match(value, '^(%S+)') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def reserve(
    connection: redis.Redis,
    claims: Sequence[tuple[str, str]],
    *,
    ttl_s: int,
    grace_s: float,
    prefix: str = Job.redis_job_namespace_prefix,
) -> list[str | None]:
    """Claim each (Redis key, our job id); per claim None if ours, else the holder's job id.

    One round trip for the whole list; claims of the same key later in the list see the
    earlier one's job as the holder. `prefix` + id is the key whose existence says the holder
    still lives (a job's hash; a document's plan for document keys).
    """
    if not claims:
        return []
    args: list[str | int | float] = [ttl_s, grace_s, prefix]
    args += [job_id for _, job_id in claims]
    replies = connection.eval(_RESERVE_SCRIPT, len(claims), *(key for key, _ in claims), *args)
    return [_text(reply) or None for reply in replies]


def mark_enqueued(pipe: Pipeline, claims: Sequence[tuple[str, str]]) -> None:
    """Queue, in the pipeline that enqueues the jobs, the mark that each claim's job went in:
    from then on a missing job hash frees the key without waiting for the claim grace."""
    if claims:
        pipe.eval(
            _MARK_ENQUEUED_SCRIPT,
            len(claims),
            *(key for key, _ in claims),
            *(job_id for _, job_id in claims),
        )


def release(connection: redis.Redis, key: str, job_id: str) -> None:
    """Free a key we reserved for a job that was never enqueued (best effort: else its TTL)."""
    with contextlib.suppress(redis.RedisError):
        connection.eval(_RELEASE_SCRIPT, 1, key, job_id)


def _text(reply: bytes | str | None) -> str:
    if isinstance(reply, bytes):
        return reply.decode()
    return reply or ""
