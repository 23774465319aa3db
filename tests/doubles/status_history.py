"""Every status the jobs' hashes were given, in the order a real redis-server applied them.

`StatusHistory(redis_url)` runs MONITOR on its own connection from the moment it is made:
Redis reports each command it executes (a transaction's commands when its EXEC runs them, none
of an EXEC that WATCH aborted), so `statuses(job_id)` is the job's real history, whatever the
timing: the tests assert on it (a job a cancel was told `canceled` for is never `started`
after), never on which of two correct orders a race took. `stop()` ends the recording once a
marker sent after everything the test did has come back.
"""

from __future__ import annotations

import re
import threading
import uuid

import redis
from rq.job import Job

# one argument of a MONITOR line: "..." with \" and \\ escaped inside
_ARGUMENT = re.compile(r'"((?:[^"\\]|\\.)*)"')
_SETTERS = {"HSET", "HMSET", "HSETNX"}
STOP_TIMEOUT_S = 30.0


class StatusHistory:
    def __init__(self, redis_url: str) -> None:
        self._url = redis_url
        # no read timeout (redis-py's default is 5 s): a worker may start for longer in silence
        self._client = redis.Redis.from_url(redis_url, socket_timeout=None)
        self._marker = f"status-history-end-{uuid.uuid4().hex}"
        self._listening = threading.Event()
        self._writes: list[tuple[str, str]] = []  # (hash key, status), in Redis's order
        self._thread = threading.Thread(target=self._record, daemon=True)
        self._thread.start()
        assert self._listening.wait(STOP_TIMEOUT_S), "MONITOR never started"

    def statuses(self, job_id: str) -> list[str]:
        key = Job.key_for(job_id)
        return [status for written, status in self._writes if written == key]

    def stop(self) -> None:
        with redis.Redis.from_url(self._url) as other:
            other.echo(self._marker)
        self._thread.join(STOP_TIMEOUT_S)
        assert not self._thread.is_alive(), "the marker never came back from MONITOR"
        self._client.close()

    def _record(self) -> None:
        with self._client.monitor() as monitor:
            self._listening.set()
            while True:
                line = monitor.connection.read_response()
                text = line.decode(errors="replace") if isinstance(line, bytes) else str(line)
                arguments = _ARGUMENT.findall(text)
                if not arguments:
                    continue
                if arguments[0].upper() == "ECHO" and arguments[1:] == [self._marker]:
                    return
                if arguments[0].upper() in _SETTERS and len(arguments) >= 4:
                    pairs = arguments[2:]
                    for field, value in zip(pairs[::2], pairs[1::2], strict=False):
                        if field == "status":
                            self._writes.append((arguments[1], value))


def started_after_canceled(statuses: list[str]) -> bool:
    """Whether `started` follows `canceled` anywhere in a job's history."""
    return "canceled" in statuses and "started" in statuses[statuses.index("canceled") :]
