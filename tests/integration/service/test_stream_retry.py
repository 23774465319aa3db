"""A stream reader across a retried attempt: real Redis, a real worker, a job that fails once.

The failed attempt ends its stream with an error entry; while the job is retried a reader goes
on to the retry's chunks, and only a job that failed for good ends the read with its error.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from producer import CosyqClient
from shared import keys
from shared.audio_stream import AudioChunk, StreamError, parse_entry
from shared.errors import StreamFailedError
from shared.settings import load_settings
from tests.doubles.harness import Cluster, wait_for


class Reader(threading.Thread):
    def __init__(self, client: CosyqClient, job_id: str) -> None:
        super().__init__(daemon=True)
        self.client, self.job_id = client, job_id
        self.chunks: list[AudioChunk] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.chunks.extend(self.client.stream(self.job_id, timeout=120))
        except BaseException as e:  # the test asserts on it
            self.error = e


class Witness(threading.Thread):
    """Every entry the stream ever held, read raw (the error entry included)."""

    def __init__(self, connection: redis.Redis, job_id: str) -> None:
        super().__init__(daemon=True)
        self.connection, self.key = connection, keys.audio_stream_key(job_id)
        self.entries: list[AudioChunk | StreamError] = []
        self.stop = threading.Event()

    def run(self) -> None:
        last = "0-0"
        while not self.stop.is_set():
            reply: Any = self.connection.xread({self.key: last}, block=100)
            for raw_id, fields in reply[0][1] if reply else []:
                last = raw_id.decode()
                self.entries.append(parse_entry(last, fields))


@pytest.mark.timeout(300)
def test_a_reader_goes_on_to_the_retry_and_stops_at_a_final_failure(
    cluster: Cluster, connection: redis.Redis, tmp_path: Path
) -> None:
    cluster.overrides["COSYQ_RETRY_BACKOFF_S"] = "1"  # the error entry stays a second
    settings = load_settings(env_file=None, redis_url=cluster.redis_url, stream_block_ms=200)
    once = load_settings(env_file=None, redis_url=cluster.redis_url, max_retries=1)
    with CosyqClient(settings) as client, CosyqClient(once) as final_client:
        retried = client.submit({"text": f"transient:{tmp_path / 'a'}", "stream": True})
        # fails at b1 on attempt 1 (retried), at b2 on attempt 2 (its last): a final failure
        twice = f"transient:{tmp_path / 'b1'} transient:{tmp_path / 'b2'}"
        failed = final_client.submit({"text": twice, "stream": True})
        witness = Witness(redis.Redis.from_url(cluster.redis_url), retried)
        readers = [Reader(client, retried), Reader(client, failed)]
        for thread in (witness, *readers):
            thread.start()
        cluster.start("run", log_name="worker.log")  # readers wait before the job runs
        for reader in readers:
            reader.join(timeout=200)
        witness.stop.set()
        witness.join(timeout=5)
        good, bad = readers
        assert good.error is None, good.error
        assert good.chunks and good.chunks[-1].final and good.chunks[-1].uri
        assert [c.seq for c in good.chunks] == list(range(len(good.chunks)))
        assert {c.attempt for c in good.chunks} == {2}
        errors = [e for e in witness.entries if isinstance(e, StreamError)]
        assert [(e.attempt, e.kind) for e in errors] == [(1, "transient")]  # it was there
        assert isinstance(bad.error, StreamFailedError), bad.error
        assert bad.error.kind == "transient" and not bad.chunks
        assert "marker b2" in bad.error.reason  # the last attempt's error, not the first's
        wait_for(lambda: client.status(retried).state == "finished", 30, "the retried job")
