"""Streaming through the real queue: real Redis, a real worker process on the tiny model.

A reader started before the job runs gets chunks before the job ends; the chunks concatenated
equal the stored file; the second and third streamed jobs of the same worker stream too; a
failed streamed job ends its stream with its error; the readers' errors are the clear ones.
"""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import redis
import soundfile as sf
from rq import Queue
from rq.serializers import JSONSerializer

from producer import CosyqClient
from producer.cli import main as cosyq_main
from shared import keys
from shared.audio_stream import AudioChunk
from shared.errors import (
    JobNotFoundError,
    StreamExpiredError,
    StreamFailedError,
    StreamNotRequestedError,
    StreamTimeoutError,
)
from shared.settings import Settings, load_settings
from shared.storage import open_storage
from tests.doubles.harness import Cluster

TEXT = "Hello there."
STREAM_ENV = {
    "COSYQ_ENGINE": "tests.doubles.engines:tiny_forced",  # the real engine, 24 tokens a piece
    "TESTENGINE_FORCED_TOKENS": "24",
    "COSYQ_THREADS": "1",  # two OpenMP threads on a crowded machine run the flow 15x slower
    "COSYQ_STREAM_FIRST_HOP_TOKENS": "6",  # short hops: several chunks of 24 tokens
    "COSYQ_STREAM_MAX_HOP_TOKENS": "12",
}


@pytest.fixture
def settings(
    redis_url: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "out").as_uri())
    monkeypatch.setenv("COSYQ_STREAM_BLOCK_MS", "200")
    return load_settings(env_file=None)


@pytest.fixture
def worker(cluster: Cluster, tiny_model_dir: Path, tmp_path: Path) -> Cluster:
    cluster.overrides.update(
        STREAM_ENV,
        COSYQ_MODEL_DIR=str(tiny_model_dir),
        COSYQ_HASH_CACHE_DIR=str(tmp_path / "hashes"),
    )
    cluster.start("run", log_name="worker.log")
    return cluster


class Reader(threading.Thread):
    """Reads one job's stream on its own thread, noting when each chunk arrived."""

    def __init__(self, client: CosyqClient, job_id: str, timeout: float = 900.0) -> None:
        super().__init__(daemon=True)
        self.client, self.job_id, self.timeout = client, job_id, timeout
        self.chunks: list[tuple[float, AudioChunk]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for chunk in self.client.stream(self.job_id, timeout=self.timeout):
                self.chunks.append((time.time(), chunk))
        except BaseException as e:  # the test asserts on it
            self.error = e


def pcm(chunks: list[AudioChunk]) -> np.ndarray:
    return np.frombuffer(b"".join(c.pcm for c in chunks), dtype="<i2")


def stored_int16(settings: Settings, uri: str) -> tuple[np.ndarray, int]:
    data, rate = sf.read(io.BytesIO(open_storage(settings).get(uri)), dtype="int16")
    return np.asarray(data), int(rate)


@pytest.mark.timeout(1500)  # one tiny-model worker for five streamed jobs; slow on a busy machine
def test_streamed_jobs_through_the_real_queue(
    settings: Settings, worker: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection = redis.Redis.from_url(settings.redis_url)
    queue = Queue(keys.QUEUE_DEFAULT, connection=connection, serializer=JSONSerializer)
    with CosyqClient(settings) as client:
        first = client.submit({"text": TEXT, "stream": True, "seed": 1})
        reader = Reader(client, first)  # started before any worker took the job
        reader.start()
        second = client.submit(
            {"text": TEXT, "stream": True, "seed": 2, "format": "flac", "sample_rate": 16000}
        )
        third = client.submit({"text": TEXT, "stream": True, "seed": 3})
        smuggled = {"text": "Say <|endofprompt|> this", "stream": True}  # skipped the producer
        bad = queue.enqueue(keys.SYNTHESIZE_FUNCTION, kwargs={"request": smuggled}).id
        reader.join(timeout=1000)
        assert reader.error is None, reader.error
        results = {job: client.result(job, timeout=600) for job in (first, second, third)}
        chunks = [chunk for _, chunk in reader.chunks]
        assert len(chunks) >= 2 and chunks[-1].final and not any(c.final for c in chunks[:-1])
        assert [c.seq for c in chunks] == list(range(len(chunks)))
        ended = client.status(first).ended_at
        assert ended is not None
        assert reader.chunks[0][0] < ended.timestamp()  # audio before the job was done
        result = results[first]
        assert chunks[-1].uri == result.uri and result.stream == keys.audio_stream_key(first)
        first_chunk = result.timings.first_chunk_s
        assert first_chunk is not None and 0 < first_chunk < result.timings.total_s
        stored, rate = stored_int16(settings, result.uri)
        assert rate == chunks[0].sample_rate == 24000
        streamed = pcm(chunks).astype(np.int32)
        assert streamed.shape == stored.shape  # the same length, the same samples ...
        assert np.abs(streamed - stored).max() <= 1  # ... within PCM16 rounding
        assert (streamed == stored).mean() > 0.999  # (libsndfile rounds a few edge cases)
        # the second and third streamed jobs of the same worker, read after they ran
        for job, expected_rate in ((second, 16000), (third, 24000)):
            late = list(client.stream(job, timeout=10))
            assert len(late) >= 2 and late[-1].final, job
            stored, rate = stored_int16(settings, results[job].uri)
            assert rate == expected_rate == late[0].sample_rate
            assert pcm(late).shape == stored.shape
            assert np.abs(pcm(late).astype(np.int32) - stored).max() <= 1
            assert results[job].timings.first_chunk_s is not None
        assert results[first].sha256 != results[third].sha256  # the seeds differ
        # a failed streamed job ends its stream with its error
        with pytest.raises(StreamFailedError) as failed:
            list(client.stream(bad, timeout=300))
        assert failed.value.kind == "invalid_request"
        assert "special token <|endofprompt|>" in failed.value.reason
        connection.delete(keys.audio_stream_key(third))  # what its TTL does in time
        with pytest.raises(StreamExpiredError, match="has expired"):
            list(client.stream(third, timeout=5))
    # cosyq say --stream: a valid WAV, header sizes patched to the real ones
    monkeypatch.setenv("COSYQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "out").as_uri())
    out = tmp_path / "said.wav"
    argv = ["--env-file", "/nonexistent", "say", TEXT, "--stream", "--out", str(out)]
    assert cosyq_main([*argv, "--seed", "4", "--timeout", "300"]) == 0
    info = sf.info(out)
    assert info.samplerate == 24000 and info.channels == 1 and info.subtype == "PCM_16"
    samples, _ = sf.read(out, dtype="int16")
    assert info.frames == len(samples) > 0
    assert out.stat().st_size == 44 + 2 * info.frames


def test_reader_errors_without_a_worker(settings: Settings) -> None:
    with CosyqClient(settings) as client:  # no worker: the jobs stay queued
        job = client.submit({"text": "Hello.", "stream": True})
        started = time.monotonic()
        with pytest.raises(StreamTimeoutError) as timed_out:
            list(client.stream(job, timeout=0.6))
        assert time.monotonic() - started < 5
        message = str(timed_out.value)
        assert "after waiting 0.6 s" in message and "no chunk arrived" in message
        assert "job is queued" in message
        plain = client.submit({"text": "Hello.", "seed": 1})
        with pytest.raises(StreamNotRequestedError, match=f"job {plain} did not ask for a stream"):
            list(client.stream(plain, timeout=5))
        with pytest.raises(JobNotFoundError):
            list(client.stream("no-such-job", timeout=5))
