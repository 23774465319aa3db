"""Exactly one assembler per document: a Redis claim with a heartbeat.

The claim is `SET cosyq:document:<id>:claim <token> NX PX ttl`; a thread renews it every third
of the TTL while the assembler works, only while it still holds that token. An assembler that
dies stops renewing, the claim expires, and the next assembler (the dead job retried by the
reaper, or one enqueued again by `cosyq document retry`) takes it and writes the file again
from the start: the file is only ever replaced whole (atomic write), so a half-written one is
never seen. Before it publishes the result the assembler checks it still holds the claim.
"""

from __future__ import annotations

import threading
import uuid
from types import TracebackType

import redis

# KEYS: claim; ARGV: token, ttl ms. 1 when the token still holds the claim (renewed).
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class AssemblyClaim:
    """`with claim:` renews the claim on a thread; `held()` says whether it is still ours."""

    def __init__(self, connection: redis.Redis, key: str, owner: str, ttl_s: float) -> None:
        self.connection = connection
        self.key = key
        self.token = f"{owner}:{uuid.uuid4().hex}"
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> bool:
        return bool(self.connection.set(self.key, self.token, nx=True, px=self.ttl_ms))

    def held(self) -> bool:
        return bool(self.connection.eval(_RENEW, 1, self.key, self.token, self.ttl_ms))

    def release(self) -> None:
        self.connection.eval(_RELEASE, 1, self.key, self.token)

    def __enter__(self) -> AssemblyClaim:
        self._thread = threading.Thread(target=self._beat, name="document-claim", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.release()

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_ms / 3000):
            try:
                if not self.held():
                    return
            except redis.RedisError:
                continue  # an outage: the claim may lapse, and then publish refuses
