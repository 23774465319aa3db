"""Requests a hostile or broken client sends to the real front (`cosyq serve`, uvicorn), read
back from its log: a JSON number past Python's digit limit, a body cut off by a disconnect, a
request trickled in a byte at a time (slow-loris), a voice transcript in a broken encoding, a
voice recording that decompresses to a gigabyte. Each
is the client's doing: a 4xx or a log line that says so, never `http_internal_error` with a
traceback (issue 45 items 10 and 12)."""

from __future__ import annotations

import io
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile

from tests.conftest import RedisServer
from tests.doubles.audio_bombs import decoded_bytes, silent_flac
from tests.doubles.harness import named, wait_for
from tests.integration.producer.http.conftest import Front, start_front

pytestmark = pytest.mark.slow

READ_TIMEOUT_S = 1  # five 0.2 s drips of a slow request, each too quick for a read timeout
BOMB_S = 30 * 60  # of stereo 48 kHz silence: ~340 KB of FLAC, ~690 MB of float32 samples
PEAK_GROWTH_BYTES = 200 * 1024 * 1024  # what one refused upload may add to the front's peak
HUGE_NUMBER = "1" + "0" * 5000  # 5,001 digits: past Python's 4,300 for int()
BODIES = {
    "/v1/jobs": '{"text": "Hello.", "seed": %s}',
    "/v1/jobs:batch": '{"requests": [{"text": "Hello.", "seed": %s}]}',
    "/v1/documents": '{"text": "Hello.", "seed": %s}',
    "/v1/audio/speech": '{"model": "tts-1", "input": "Hi.", "voice": "default", "speed": %s}',
}


@pytest.fixture(scope="module")
def front(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    """No worker; a request must arrive within READ_TIMEOUT_S."""
    root = tmp_path_factory.mktemp("http-hostile")
    started = start_front(
        root,
        redis_server.url,
        COSYQ_HTTP_REQUEST_READ_TIMEOUT_S=str(READ_TIMEOUT_S),
        COSYQ_HTTP_WAIT_TIMEOUT_S="1",
    )
    yield started
    started.stop()


def no_internal_error(front: Front) -> None:
    assert named(front.events(), "http_internal_error") == []
    assert "Traceback" not in front.log.read_text(errors="replace")


def connect(front: Front) -> socket.socket:
    host, port = front.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


@pytest.mark.parametrize("path", sorted(BODIES))
def test_a_number_of_5001_digits_is_400_not_500(front: Front, path: str) -> None:
    body = BODIES[path] % HUGE_NUMBER
    response = httpx.post(
        front.url + path, content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_json"
    assert "digits" in error["message"]
    no_internal_error(front)


def test_a_client_gone_mid_body_is_logged_as_a_disconnect(front: Front) -> None:
    with connect(front) as client:
        client.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b'content-length: 1000\r\n\r\n{"text": "Hel'
        )
    gone = wait_for(
        lambda: named(front.events(), "http_client_disconnected"),
        30,
        "the front to log the client's disconnect",
    )
    assert gone[0]["path"] == "/v1/jobs"
    wait_for(
        lambda: [e for e in named(front.events(), "http_request") if e["status"] == 499],
        30,
        "the access line of the request that never arrived",
    )
    no_internal_error(front)


def trickle(client: socket.socket, head: bytes, drip: bytes, stop: threading.Event) -> None:
    """Send `head`, then `drip` every 0.2 s until the server closes or `stop` is set."""
    try:
        client.sendall(head)
        while not stop.wait(0.2):
            client.sendall(drip)
    except OSError:  # the server closed the connection: what the test waits for
        pass


@pytest.mark.parametrize(
    ("head", "drip"),
    [
        (b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n", b"x-slow: a\r\n"),  # headers never end
        (b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\ncontent-length: 100000\r\n\r\n{", b" "),  # body
        (b"", b""),  # a connection that sends nothing at all
    ],
    ids=["headers", "body", "silent"],
)
def test_a_slow_request_is_answered_408_and_closed(front: Front, head: bytes, drip: bytes) -> None:
    stop = threading.Event()
    with connect(front) as client:
        sender = threading.Thread(target=trickle, args=(client, head, drip, stop), daemon=True)
        sender.start()
        answer = b""
        try:
            while chunk := client.recv(65536):  # b"" once the server has closed it
                answer += chunk
        finally:
            stop.set()
            sender.join(timeout=10)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"COSYQ_HTTP_REQUEST_READ_TIMEOUT_S" in answer
    assert named(front.events(), "http_request_read_timeout")
    no_internal_error(front)


def voice_form(name: str, transcript: bytes) -> tuple[bytes, str]:
    """A multipart upload built by hand, so the transcript's bytes go out as they are."""
    buffer = io.BytesIO()
    soundfile.write(
        buffer,
        0.3 * np.sin(np.arange(24000) / 24000 * 2 * np.pi * 220),
        24000,
        "PCM_16",
        format="WAV",
    )
    boundary = "cosyq-test-boundary"
    parts = [
        (b'name="name"', name.encode()),
        (b'name="transcript"', transcript),
        (b'name="file"; filename="v.wav"\r\nContent-Type: audio/wav', buffer.getvalue()),
    ]
    body = b"".join(
        b"--"
        + boundary.encode()
        + b"\r\nContent-Disposition: form-data; "
        + head
        + b"\r\n\r\n"
        + value
        + b"\r\n"
        for head, value in parts
    )
    return body + b"--" + boundary.encode() + b"--\r\n", f"multipart/form-data; boundary={boundary}"


@pytest.mark.parametrize("transcript", [b"\xff\xfe", "Grüße".encode("latin-1"), b"ok \xed\xa0\x80"])
def test_a_transcript_that_is_not_utf8_is_400_and_nothing_stored(
    front: Front, transcript: bytes
) -> None:
    body, content_type = voice_form("mojibake", transcript)
    response = httpx.post(
        front.url + "/v1/audio/voices", content=body, headers={"content-type": content_type}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "transcript" and "UTF-8" in error["message"]
    assert not (front.storage / "voices" / "default" / "mojibake").exists()
    no_internal_error(front)


def test_a_utf8_transcript_still_goes_through(front: Front) -> None:
    body, content_type = voice_form("gruesse", "Grüße.".encode())
    response = httpx.post(
        front.url + "/v1/audio/voices", content=body, headers={"content-type": content_type}
    )
    assert response.status_code == 504, response.text  # no worker here: stored, then the wait
    assert len(list((front.storage / "voices" / "default" / "gruesse").iterdir())) == 1


def peak_rss_bytes(front: Front) -> int:
    """The front process's resident-memory high-water mark (Linux: /proc's VmHWM)."""
    status = Path(f"/proc/{front.process.pid}/status")
    if not status.exists():
        pytest.skip("no /proc: the front's peak memory cannot be read here")
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in {status}")


def test_a_recording_that_decompresses_to_a_gigabyte_is_refused_before_it_is_decoded(
    front: Front,
) -> None:
    bomb = silent_flac(BOMB_S)
    assert decoded_bytes(BOMB_S) > 1000 * len(bomb)
    before = peak_rss_bytes(front)
    response = httpx.post(
        front.url + "/v1/audio/voices",
        data={"name": "bomb", "transcript": "Hi."},
        files={"file": ("bomb.flac", bomb, "audio/flac")},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert "1800.0 s, limit 30 s" in response.json()["error"]["message"]
    grown = peak_rss_bytes(front) - before
    assert grown < PEAK_GROWTH_BYTES, f"the front's peak grew {grown:,} bytes for {len(bomb):,}"
    assert not (front.storage / "voices" / "default" / "bomb").exists()
    no_internal_error(front)


@pytest.mark.parametrize("authorization", ["", "Bearer sk-not-a-key", "Basic c2stYWxwaGE="])
def test_an_upload_without_a_key_is_answered_from_its_headers_not_read_ahead(
    redis_server: RedisServer, tmp_path: Path, authorization: str
) -> None:
    """A voice upload may be 16 MB (COSYQ_HTTP_MAX_UPLOAD_BYTES), and the front read an upload
    whole before its route judged the key: anybody could make it hold 16 MB per connection for
    the read deadline. Sent with no key or a wrong one, 10 MB declared and 1 KB sent, the
    answer is the 401 at once: the front did not wait for the rest of the body."""
    started = start_front(tmp_path, redis_server.url, COSYQ_API_KEYS="alpha:sk-alpha-0123456789")
    try:
        head = (
            "POST /v1/audio/voices HTTP/1.1\r\nHost: x\r\n"
            "content-type: multipart/form-data; boundary=b\r\n"
            f"content-length: {10 * 1024 * 1024}\r\n"
            + (f"authorization: {authorization}\r\n" if authorization else "")
            + "\r\n"
        )
        with connect(started) as client:
            client.settimeout(20)  # well inside the read deadline (60 s): no wait for the body
            client.sendall(head.encode() + b"x" * 1024)
            answer = client.recv(4096)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        no_internal_error(started)
    finally:
        started.stop()
