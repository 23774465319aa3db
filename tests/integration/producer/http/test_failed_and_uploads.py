"""What a real `cosyq serve` answers for jobs that failed for good, for SSE streams, and for voice
uploads whose file name is hostile. No worker: the test sets a job's end the way a worker would
(its state, and job.meta["cosyq_error"]) and appends stream entries in the worker's format."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import redis
import soundfile
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from shared import audio_stream, keys
from shared.results import JobFailure
from tests.integration.producer.http.conftest import Front, queued_job

pytestmark = pytest.mark.slow

RATE = 24000


@pytest.fixture
def connection(stalled: Front) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stalled.redis_url)
    yield client
    client.close()


def failed_job(connection: redis.Redis, kind: str, message: str, stream: bool = False) -> str:
    job_id = queued_job(connection, {"text": "Doomed.", "stream": stream})
    Queue(keys.QUEUE_LOW, connection=connection).remove(job_id)  # ends as the test says
    fetched = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
    fetched.meta[keys.ERROR_META_KEY] = JobFailure(kind, message).as_meta()
    fetched.save_meta()
    connection.hset(f"rq:job:{job_id}", "status", "failed")
    return job_id


@pytest.mark.parametrize(
    ("kind", "status"),
    [("transient", 502), ("invalid_request", 400), ("storage", 500), ("internal", 500)],
)
def test_a_failed_job_answers_its_failure_never_503(
    stalled: Front, connection: redis.Redis, kind: str, status: int
) -> None:
    job_id = failed_job(connection, kind, "text: gave up after 3 tries")
    with stalled.http(key=None) as http:
        response = http.get(f"/v1/jobs/{job_id}/audio")
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == kind and "gave up after 3 tries" in error["message"]
        assert response.json()["job_id"] == job_id
        assert http.get(f"/v1/jobs/{job_id}").json()["error"]["kind"] == kind  # 200, as before


def test_a_failed_streamed_job_is_502_for_transient(
    stalled: Front, connection: redis.Redis
) -> None:
    job_id = failed_job(connection, "transient", "storage down", stream=True)
    failed = audio_stream.error_fields(0, 1, RATE, kind="transient", message="storage down")
    connection.xadd(keys.audio_stream_key(job_id), failed)  # type: ignore[arg-type]
    response = httpx.get(f"{stalled.url}/v1/jobs/{job_id}/stream", timeout=30)
    assert response.status_code == 502 and response.json()["error"]["code"] == "transient"


def test_sse_sends_no_empty_delta(stalled: Front, connection: redis.Redis) -> None:
    job_id = queued_job(connection, {"text": "S.", "stream": True})
    key = keys.audio_stream_key(job_id)
    pieces = [(np.arange(900, dtype=np.int16) * (n + 1)).astype("<i2").tobytes() for n in range(2)]
    for seq, data in enumerate(pieces):
        connection.xadd(key, audio_stream.chunk_fields(seq, 1, RATE, data))  # type: ignore[arg-type]
    final = audio_stream.final_fields(2, 1, RATE, b"", uri="file:///x.wav", samples=1800)
    connection.xadd(key, final)  # type: ignore[arg-type]  # what the worker ends with: no samples
    response = httpx.get(
        f"{stalled.url}/v1/jobs/{job_id}/stream", params={"stream_format": "sse"}, timeout=30
    )
    events = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")
    ]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 2 + ["speech.audio.done"]
    assert all(e["audio"] for e in events[:2])


def _wav() -> bytes:
    t = np.arange(24000) / 24000
    buffer = io.BytesIO()
    soundfile.write(buffer, 0.3 * np.sin(2 * np.pi * 220 * t), 24000, format="WAV")
    return buffer.getvalue()


def test_an_upload_is_stored_by_its_format_and_its_file_name_never_echoed(
    stalled: Front,
) -> None:
    with stalled.http(key=None) as http:
        stored = http.post(
            "/v1/audio/voices",
            data={"name": "mallory", "transcript": "Hi."},
            files={"file": ("payload.sh", _wav(), "application/x-sh")},
        )
        assert stored.status_code == 504  # no worker computes it; the upload is stored
        refused = http.post(
            "/v1/audio/voices",
            data={"name": "mallory2"},
            files={"file": ("../../evil name.sh", b"#!/bin/sh\nrm -rf /\n", "text/plain")},
        )
    [upload] = list((stalled.storage / "voices" / "default" / "mallory").iterdir())
    assert upload.suffix == ".wav" and "payload" not in upload.name
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "file" and error["message"].startswith("file: not a readable audio")
    assert "evil" not in refused.text and ".sh" not in refused.text
    assert not (stalled.storage / "voices" / "default" / "mallory2").exists()
