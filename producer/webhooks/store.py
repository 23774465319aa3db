"""The webhook books in Redis: the outbox stream and its consumer group, deliveries waiting for
their next try (a sorted set), and dead letters (a hash, and when each died: a sorted set; kept
COSYQ_FAILURE_TTL_S, as a failed job is, then dropped by `drop_old_dead`). Every move between
them is one transaction or script, so an event is always in exactly one place: nothing is lost
when a dispatcher dies between two steps, and a pending outbox entry is taken over
(XAUTOCLAIM)."""

from __future__ import annotations

import time
from typing import Any

import redis

from producer.webhooks.records import Delivery
from shared import keys

# Due deliveries back into the outbox, atomically (XADD then ZREM, per member).
_PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  redis.call('XADD', KEYS[2], '*', 'delivery', member)
  redis.call('ZREM', KEYS[1], member)
end
return #due
"""
# A dead letter back into the outbox, atomically; 0 when there is no such dead letter.
_REDELIVER = """
local member = redis.call('HGET', KEYS[1], ARGV[1])
if not member then return 0 end
redis.call('XADD', KEYS[2], '*', 'delivery', ARGV[2] ~= '' and ARGV[2] or member)
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""
# Dead letters that died before ARGV[1] go, at most ARGV[2] of them; one with no time of death
# (a release before the times were kept) is given ARGV[3], now, first.
_DROP_OLD_DEAD = """
if redis.call('HLEN', KEYS[1]) > redis.call('ZCARD', KEYS[2]) then
  for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
    redis.call('ZADD', KEYS[2], 'NX', ARGV[3], id)
  end
end
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(old) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
return #old
"""

Entry = tuple[str, dict[str, str]]  # outbox stream id, its fields


class WebhookStore:
    def __init__(self, connection: redis.Redis) -> None:
        self.connection = connection
        self._promote = connection.register_script(_PROMOTE)
        self._redeliver = connection.register_script(_REDELIVER)
        self._drop_old_dead = connection.register_script(_DROP_OLD_DEAD)

    def ensure_group(self) -> None:
        try:
            self.connection.xgroup_create(
                keys.WEBHOOK_OUTBOX, keys.WEBHOOK_GROUP, "0", mkstream=True
            )
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def read_new(self, consumer: str, count: int, block_ms: int) -> list[Entry]:
        reply: Any = self.connection.xreadgroup(
            keys.WEBHOOK_GROUP, consumer, {keys.WEBHOOK_OUTBOX: ">"}, count=count, block=block_ms
        )
        return [_entry(item) for _, items in reply or [] for item in items]

    def claim_stale(self, consumer: str, idle_ms: int, count: int) -> list[Entry]:
        """Entries another dispatcher read and never finished (it died): now this one's."""
        reply = self.connection.xautoclaim(
            keys.WEBHOOK_OUTBOX, keys.WEBHOOK_GROUP, consumer, idle_ms, "0-0", count=count
        )
        return [_entry(item) for item in reply[1] if item and item[1] is not None]

    def delivered(self, entry_id: str) -> None:
        with self.connection.pipeline() as pipe:
            pipe.xack(keys.WEBHOOK_OUTBOX, keys.WEBHOOK_GROUP, entry_id)
            pipe.xdel(keys.WEBHOOK_OUTBOX, entry_id)
            pipe.execute()

    def retry_later(self, entry_id: str, delivery: Delivery, at: float) -> None:
        with self.connection.pipeline() as pipe:
            pipe.zadd(keys.WEBHOOK_RETRY, {delivery.to_json(): at})
            pipe.xack(keys.WEBHOOK_OUTBOX, keys.WEBHOOK_GROUP, entry_id)
            pipe.xdel(keys.WEBHOOK_OUTBOX, entry_id)
            pipe.execute()

    def dead(self, entry_id: str, webhook_id: str, record: str) -> None:
        with self.connection.pipeline() as pipe:
            pipe.hset(keys.WEBHOOK_DEAD, webhook_id, record)
            pipe.zadd(keys.WEBHOOK_DEAD_AT, {webhook_id: time.time()})
            pipe.xack(keys.WEBHOOK_OUTBOX, keys.WEBHOOK_GROUP, entry_id)
            pipe.xdel(keys.WEBHOOK_OUTBOX, entry_id)
            pipe.execute()

    def promote_due(self, now: float, limit: int) -> int:
        return int(self._promote(keys=[keys.WEBHOOK_RETRY, keys.WEBHOOK_OUTBOX], args=[now, limit]))

    def drop_old_dead(self, died_before: float, limit: int) -> int:
        """Forget dead letters that died before `died_before`: how many went."""
        dead = [keys.WEBHOOK_DEAD, keys.WEBHOOK_DEAD_AT]
        return int(self._drop_old_dead(keys=dead, args=[died_before, limit, time.time()]))

    def dead_letters(self) -> dict[str, str]:
        raw = self.connection.hgetall(keys.WEBHOOK_DEAD)
        return {_text(k): _text(v) for k, v in raw.items()}

    def redeliver(self, webhook_id: str, fresh: str = "") -> bool:
        """Move one dead letter back to the outbox (as `fresh` when given): True if it was dead."""
        args = [webhook_id, fresh]
        dead = [keys.WEBHOOK_DEAD, keys.WEBHOOK_OUTBOX, keys.WEBHOOK_DEAD_AT]
        return bool(self._redeliver(keys=dead, args=args))

    def counts(self) -> tuple[int, int]:
        """(waiting to be delivered: in the outbox or between tries, dead letters)."""
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.xlen(keys.WEBHOOK_OUTBOX)
            pipe.zcard(keys.WEBHOOK_RETRY)
            pipe.hlen(keys.WEBHOOK_DEAD)
            outbox, retry, dead = pipe.execute()
        return int(outbox) + int(retry), int(dead)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _entry(item: Any) -> Entry:
    entry_id, fields = item
    return _text(entry_id), {_text(k): _text(v) for k, v in fields.items()}
