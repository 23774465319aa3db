"""GET /v1/jobs/{id}/stream relays a job's Redis Stream (the worker's entry format, see
workers/service/audio_stream.py) over chunked
HTTP, read from a real server: before, during and after the entries arrive; raw PCM, WAV and
server-sent events; and each way a stream can fail.

The test appends the entries itself (no worker: so each failure can be staged exactly), in the
worker's format (seq, attempt, sample_rate, pcm int16 LE, final; an attempt's
final entry carries the uri, or error_kind and error_message) to a job enqueued but never run,
and sets the job's state the way its worker would.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import redis

from tests.integration.producer.http.conftest import Front, queued_job

pytestmark = pytest.mark.slow

RATE = 24000


@pytest.fixture
def connection(stalled: Front) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stalled.redis_url)
    yield client
    client.close()


def streaming_job(connection: redis.Redis, stream: bool = True) -> str:
    request = {"text": "Streamed.", "stream": True} if stream else {"text": "Not streamed."}
    return queued_job(connection, request)


def chunk(n: int, seq: int) -> bytes:
    return (np.arange(n, dtype=np.int16) * (seq + 1)).astype("<i2").tobytes()


def append(
    connection: redis.Redis, job_id: str, seq: int, pcm: bytes, final: bool, *, attempt: int = 1
) -> None:
    fields: dict[str, bytes | int | str] = {
        "seq": seq,
        "attempt": attempt,
        "sample_rate": RATE,
        "pcm": pcm,
        "final": int(final),
    }
    if final:
        fields.update(uri="file:///tmp/out.wav", samples=0)
    connection.xadd(f"cosyq:audio:{job_id}", fields)  # type: ignore[arg-type]


def fail(
    connection: redis.Redis,
    job_id: str,
    kind: str,
    message: str,
    *,
    attempt: int = 1,
    state: str = "failed",
) -> None:
    """A failed attempt's final entry, and the job's state after it (failed, or scheduled for
    a retry)."""
    fields = {
        "seq": 0,
        "attempt": attempt,
        "sample_rate": RATE,
        "pcm": b"",
        "final": 1,
        "error_kind": kind,
        "error_message": message,
    }
    connection.xadd(f"cosyq:audio:{job_id}", fields)  # type: ignore[arg-type]
    connection.hset(f"rq:job:{job_id}", "status", state)


def test_relay_started_before_the_entries_gets_them_all_in_order(
    stalled: Front, connection: redis.Redis
) -> None:
    job_id = streaming_job(connection)
    pieces = [chunk(2400, seq) for seq in range(4)]
    received: list[bytes] = []

    def read() -> None:
        with httpx.stream("GET", f"{stalled.url}/v1/jobs/{job_id}/stream", timeout=30) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
            for part in r.iter_raw():
                received.append(part)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.3)  # the relay is waiting before the first entry exists
    append(connection, job_id, 0, pieces[0], final=False)
    # The first audio reaches the client while the job is still streaming: the later entries are
    # written only once it has (no timing bound: a relay that held audio back until the job's
    # end would leave this wait to run out).
    deadline = time.monotonic() + 20
    while not received and time.monotonic() < deadline:
        time.sleep(0.02)
    assert received, "the first entry was not relayed while the job was still streaming"
    for seq, pcm in enumerate(pieces[1:], start=1):
        append(connection, job_id, seq, pcm, final=seq == len(pieces) - 1)
        time.sleep(0.05)
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert b"".join(received) == b"".join(pieces)


def test_relay_after_the_job_streamed_replays_from_the_first_entry(
    stalled: Front, connection: redis.Redis
) -> None:
    job_id = streaming_job(connection)
    pieces = [chunk(1000, seq) for seq in range(3)]
    for seq, pcm in enumerate(pieces):
        append(connection, job_id, seq, pcm, final=seq == 2)
    with httpx.Client(base_url=stalled.url, timeout=30) as http:
        wav = http.get(f"/v1/jobs/{job_id}/stream", params={"format": "wav"})
        sse = http.get(f"/v1/jobs/{job_id}/stream", params={"stream_format": "sse"})
    assert wav.status_code == 200 and wav.headers["content-type"] == "audio/wav"
    header, body = wav.content[:44], wav.content[44:]
    assert header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    channels, rate, _, _, bits = struct.unpack("<HIIHH", header[22:36])
    assert (channels, rate, bits) == (1, RATE, 16)
    assert body == b"".join(pieces)
    assert sse.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:3]) == b"".join(pieces)


def test_a_failure_before_any_audio_is_a_status(stalled: Front, connection: redis.Redis) -> None:
    job_id = streaming_job(connection)
    fail(connection, job_id, "invalid_request", "voice: no voice named 'x' is registered")
    response = httpx.get(f"{stalled.url}/v1/jobs/{job_id}/stream", timeout=30)
    assert response.status_code == 400
    assert "no voice named 'x'" in response.json()["error"]["message"]
    other = streaming_job(connection)
    fail(connection, other, "internal", "out of memory")
    assert httpx.get(f"{stalled.url}/v1/jobs/{other}/stream", timeout=30).status_code == 500


def test_a_failure_after_audio_cuts_the_body_short(stalled: Front, connection: redis.Redis) -> None:
    job_id = streaming_job(connection)
    append(connection, job_id, 0, chunk(1000, 0), final=False)
    fail(connection, job_id, "internal", "vocoder crashed")
    with pytest.raises(httpx.RemoteProtocolError):  # an incomplete chunked body, never a clean end
        httpx.get(f"{stalled.url}/v1/jobs/{job_id}/stream", timeout=30)


def test_a_retried_attempt_is_relayed_after_a_failed_one(
    stalled: Front, connection: redis.Redis
) -> None:
    job_id = streaming_job(connection)
    fail(connection, job_id, "transient", "storage hiccup", state="scheduled")
    pieces = [chunk(800, seq) for seq in range(2)]

    def second_attempt() -> None:
        time.sleep(0.5)
        connection.hset(f"rq:job:{job_id}", "status", "started")
        for seq, pcm in enumerate(pieces):
            append(connection, job_id, seq, pcm, final=seq == 1, attempt=2)

    writer = threading.Thread(target=second_attempt)
    writer.start()
    response = httpx.get(f"{stalled.url}/v1/jobs/{job_id}/stream", timeout=30)
    writer.join(timeout=10)
    assert response.status_code == 200 and response.content == b"".join(pieces)


def test_a_last_failed_attempt_is_reported_once_the_job_ends(
    stalled: Front, connection: redis.Redis
) -> None:
    job_id = streaming_job(connection)
    fail(connection, job_id, "transient", "storage down", state="started")  # state not yet final
    threading.Timer(0.3, connection.hset, (f"rq:job:{job_id}", "status", "failed")).start()
    response = httpx.get(f"{stalled.url}/v1/jobs/{job_id}/stream", timeout=30)
    assert response.status_code == 502 and "storage down" in response.json()["error"]["message"]


def test_no_entry_within_the_wait_is_504(stalled: Front, connection: redis.Redis) -> None:
    job_id = streaming_job(connection)
    response = httpx.get(f"{stalled.url}/v1/jobs/{job_id}/stream", timeout=30)
    assert response.status_code == 504
    assert response.headers["location"] == f"/v1/jobs/{job_id}"


def test_streams_that_cannot_be_read(stalled: Front, connection: redis.Redis) -> None:
    with httpx.Client(base_url=stalled.url, timeout=30) as http:
        plain = streaming_job(connection, stream=False)
        assert http.get(f"/v1/jobs/{plain}/stream").json()["error"]["code"] == "not_streamed"
        assert http.get("/v1/jobs/feedbeef/stream").status_code == 404
        gone = streaming_job(connection)
        connection.hset(f"rq:job:{gone}", "status", "finished")  # done, its stream expired
        response = http.get(f"/v1/jobs/{gone}/stream")
        assert response.status_code == 410 and "expired" in response.json()["error"]["message"]
        bad = http.get(f"/v1/jobs/{plain}/stream", params={"format": "mp3"})
        assert bad.status_code == 400


def entry_fields(seq: int, pcm: bytes, final: bool) -> dict[str, bytes | int | str]:
    fields: dict[str, bytes | int | str] = {
        "seq": seq,
        "attempt": 1,
        "sample_rate": RATE,
        "pcm": pcm,
        "final": int(final),
    }
    if final:
        fields.update(uri="file:///tmp/out.wav", samples=0)
    return fields


def trimmed_append(connection: redis.Redis, job_id: str, seqs: range, maxlen: int) -> None:
    """XADD with MAXLEN, as the worker does, in one transaction: a reader blocked on the stream
    wakes after it, when the oldest of these entries are already trimmed."""
    with connection.pipeline(transaction=True) as pipe:
        for seq in seqs:
            fields = entry_fields(seq, chunk(500, seq), final=seq == seqs[-1])
            pipe.xadd(f"cosyq:audio:{job_id}", fields, maxlen=maxlen, approximate=False)  # type: ignore[arg-type]
        pipe.execute()


def test_a_reader_behind_a_trim_before_any_audio_gets_410(
    stalled: Front, connection: redis.Redis
) -> None:
    job_id = streaming_job(connection)
    trimmed_append(connection, job_id, range(6), maxlen=3)  # 0-2 trimmed before anyone read
    response = httpx.get(f"{stalled.url}/v1/jobs/{job_id}/stream", timeout=30)
    assert response.status_code == 410
    error = response.json()["error"]
    assert error["code"] == "stream_trimmed" and "chunk 0 of attempt 1 is gone" in error["message"]


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_a_reader_that_fell_behind_a_trim_never_gets_a_clean_end(
    stalled: Front, connection: redis.Redis, stream_format: str
) -> None:
    """Entry 0 relayed, then 1-3 written with MAXLEN 2 while the relay waits: it sees 2 next.
    Raw audio ends as an incomplete body; SSE ends with an error event and no done."""
    job_id = streaming_job(connection)
    append(connection, job_id, 0, chunk(500, 0), final=False)
    url = f"{stalled.url}/v1/jobs/{job_id}/stream"
    received: list[bytes] = []
    with httpx.stream("GET", url, params={"stream_format": stream_format}, timeout=30) as r:
        assert r.status_code == 200
        body = r.iter_raw()
        received.append(next(body))  # the relay has read entry 0 and waits for more
        trimmed_append(connection, job_id, range(1, 4), maxlen=2)
        if stream_format == "audio":
            with pytest.raises(httpx.RemoteProtocolError):  # incomplete chunked body
                received.extend(body)
            assert b"".join(received) == chunk(500, 0)  # nothing after the gap was sent
            return
        received.extend(body)
    lines = b"".join(received).decode().splitlines()
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["speech.audio.delta", "error"]
    assert base64.b64decode(events[0]["audio"]) == chunk(500, 0)
    assert events[1]["error"]["code"] == "stream_trimmed"
    assert "chunk 1 of attempt 1 is gone" in events[1]["error"]["message"]
