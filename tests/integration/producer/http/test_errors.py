"""Every error status of the HTTP front, from a real server: 400, 401, 404, 409, 413, 429, 503,
504, each in OpenAI's error JSON (never a traceback or HTML); /healthz and /readyz need no key."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import soundfile as sf

from shared import keys
from tests.conftest import free_port
from tests.integration.producer.http.conftest import Front, start_front

pytestmark = pytest.mark.slow

SPEECH = {"model": "tts-1", "input": "Hello.", "voice": "default", "response_format": "wav"}


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in error["message"]
    return dict(error)


@pytest.fixture
def http(stalled: Front) -> Iterator[httpx.Client]:
    """Checks that refuse a request before it is queued need no worker (nor a key)."""
    with stalled.http(key=None) as client:
        yield client


def test_400_names_the_field_and_rule(http: httpx.Client) -> None:
    error = error_of(http.post("/v1/jobs", json={"text": "hi", "speed": 9}), 400)
    assert error["message"] == "speed: 9.0 is outside 0.5-2.0" and error["param"] == "speed"
    error = error_of(http.post("/v1/jobs", json={"text": "hi", "colour": "red"}), 400)
    assert error["message"] == "colour: unknown field"
    error = error_of(http.post("/v1/jobs", content=b"{not json", headers=_json()), 400)
    assert error["code"] == "invalid_json"
    deep = b"[" * 50_000 + b"]" * 50_000  # under COSYQ_HTTP_MAX_JSON_VALUES: parsed, too deep
    error = error_of(http.post("/v1/jobs", content=deep, headers=_json()), 400)
    assert error["message"] == "request: JSON nested too deeply"
    error = error_of(http.post("/v1/jobs", content=b"\xff\xfe{", headers=_json()), 400)
    assert error["code"] == "invalid_json"
    error = error_of(http.post("/v1/jobs", json=["a", "list"]), 400)
    assert "must be a JSON object" in error["message"]
    error = error_of(http.post("/v1/audio/speech", json={**SPEECH, "temperature": 1}), 400)
    assert error["message"] == "temperature: unknown field"
    error = error_of(http.post("/v1/jobs", json={"text": "x" * 2001}), 400)
    assert error["message"] == "text: 2,001 characters, limit 2,000"
    error = error_of(
        http.post("/v1/jobs", json={"text": "hi", "output_key": "../../etc/passwd"}), 400
    )
    assert error["param"] == "output_key" and "'..'" in error["message"]


def test_400_for_hostile_text_on_every_route(http: httpx.Client) -> None:
    """Special tokens through SSML entities, controls and booleans: refused before queueing."""
    token = "<speak>&lt;|endofprompt|&gt;Hello.</speak>"
    error = error_of(http.post("/v1/jobs", json={"text": token}), 400)
    assert error["param"] == "text" and "special token <|endofprompt|>" in error["message"]
    error = error_of(http.post("/v1/audio/speech", json={**SPEECH, "input": token}), 400)
    assert "special token <|endofprompt|>" in error["message"]
    error = error_of(http.post("/v1/jobs", json={"text": "a\u0085b"}), 400)
    assert "control character U+0085" in error["message"]
    error = error_of(http.post("/v1/jobs", json={"text": "hi", "speed": True}), 400)
    assert error["message"] == "speed: must be a number, not true"
    error = error_of(http.post("/v1/audio/speech", json={**SPEECH, "speed": True}), 400)
    assert error["param"] == "speed"
    t = np.arange(24000) / 24000
    wav = io.BytesIO()
    sf.write(wav, 0.3 * np.sin(2 * np.pi * 200 * t), 24000, format="WAV")
    response = http.post(
        "/v1/audio/voices",
        data={"name": "eve", "transcript": "<speak>&#60;|im_start|&#62; hi</speak>"},
        files={"file": ("eve.wav", wav.getvalue(), "audio/wav")},
    )
    assert "special token <|im_start|>" in error_of(response, 400)["message"]


def test_400_for_any_prompt_uri_over_http(http: httpx.Client) -> None:
    body = {"text": "hi", "prompt_audio": "file:///etc/passwd", "prompt_text": "x"}
    error = error_of(http.post("/v1/jobs", json=body), 400)
    assert error["param"] == "prompt_audio" and "worker's own disk" in error["message"]
    batch = {"requests": [{"text": "a"}, {**body, "prompt_audio": "s3://bucket/key.wav"}]}
    error = error_of(http.post("/v1/jobs:batch", json=batch), 400)
    assert error["message"].startswith("requests[1]: prompt_audio:")


def test_400_for_streaming_what_cannot_stream(http: httpx.Client) -> None:
    streamed = {**SPEECH, "stream_format": "audio", "speed": 1.5}
    error = error_of(http.post("/v1/audio/speech", json=streamed), 400)
    assert error["param"] == "speed" and "streaming needs speed 1.0" in error["message"]
    error = error_of(
        http.post(
            "/v1/audio/speech", json={**SPEECH, "stream_format": "sse", "response_format": "mp3"}
        ),
        400,
    )
    assert error["param"] == "response_format" and "cannot be streamed" in error["message"]


def test_401_without_a_valid_key_and_health_without_one(live: Front) -> None:
    with live.http(key=None) as anonymous:
        response = anonymous.post("/v1/jobs", json={"text": "hi"})
        error = error_of(response, 401)
        assert error["code"] == "invalid_api_key"
        assert response.headers["www-authenticate"] == "Bearer"
        assert anonymous.get("/healthz").json() == {"status": "ok"}
        ready = anonymous.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {
            "status": "ready",
            "redis": "ok",
            "storage": "ok",
            "ready_workers": 1,
        }
    with live.http(key="wrong") as wrong:
        assert error_of(wrong.get("/v1/audio/voices"), 401)["message"] == "invalid API key"
    basic = httpx.get(live.url + "/v1/audio/voices", headers={"Authorization": "Basic eDp5"})
    assert "missing API key" in error_of(basic, 401)["message"]


def test_404_for_unknown_jobs_voices_and_routes(http: httpx.Client) -> None:
    assert error_of(http.get("/v1/jobs/0123abcd"), 404)["code"] == "job_not_found"
    assert error_of(http.get("/v1/jobs/0123abcd/audio"), 404)["code"] == "job_not_found"
    assert error_of(http.get("/v1/jobs/not$valid"), 404)["code"] == "job_not_found"
    error = error_of(http.post("/v1/audio/speech", json={**SPEECH, "voice": "nobody"}), 404)
    assert error["param"] == "voice"
    assert error_of(http.get("/v1/nothing-here"), 404)["message"] == "Not Found"


def test_413_for_an_oversized_body_declared_or_chunked(http: httpx.Client) -> None:
    big = b'{"text": "' + b"x" * (3 * 1024 * 1024) + b'"}'
    error = error_of(http.post("/v1/jobs", content=big, headers=_json()), 413)
    assert "COSYQ_HTTP_MAX_BODY_BYTES" in error["message"]

    def chunks() -> Iterator[bytes]:
        yield b'{"text": "'
        for _ in range(48):
            yield b"y" * 65536
        yield b'"}'

    error_of(http.post("/v1/jobs", content=chunks(), headers=_json()), 413)


def test_413_for_an_oversized_upload(stalled: Front) -> None:
    with stalled.http(key=None) as http:
        response = http.post(
            "/v1/audio/voices",
            data={"name": "big", "transcript": "x"},
            files={"file": ("big.wav", b"\0" * 60000, "audio/wav")},
        )
    assert "COSYQ_HTTP_MAX_UPLOAD_BYTES" in error_of(response, 413)["message"]


def test_504_past_the_wait_then_409_and_429_on_a_full_queue(stalled: Front) -> None:
    connection = redis.Redis.from_url(stalled.redis_url)
    with stalled.http(key=None) as http:
        assert error_of(http.get("/readyz"), 503)["code"] == "no_ready_worker"
        response = http.post("/v1/audio/speech", json=SPEECH)
        error = error_of(response, 504)
        job_id = response.json()["job_id"]
        assert response.headers["location"] == f"/v1/jobs/{job_id}"
        assert error["code"] == "timeout" and f"/v1/jobs/{job_id}" in error["message"]
        assert http.get(response.headers["location"]).json()["state"] == "queued"
        audio = http.get(f"/v1/jobs/{job_id}/audio")
        assert error_of(audio, 409)["code"] == "not_ready"
        statuses = [http.post("/v1/jobs", json={"text": "hi"}) for _ in range(3)]
    codes = [r.status_code for r in statuses]
    assert 429 in codes and codes[: codes.index(429)] == [202] * codes.index(429)
    full = statuses[codes.index(429)]
    assert error_of(full, 429)["code"] == "queue_full"
    assert full.headers["retry-after"] == "7"
    assert connection.llen(f"rq:queue:{keys.QUEUE_DEFAULT}") == 2
    connection.close()


def test_503_when_redis_is_unreachable(dead: Front) -> None:
    with dead.http(key=None) as http:
        assert error_of(http.get("/readyz"), 503)["code"] == "redis_unreachable"
        assert error_of(http.post("/v1/jobs", json={"text": "hi"}), 503)["code"] == "unavailable"
        assert error_of(http.get("/v1/jobs/abc"), 503)["code"] == "unavailable"
        assert error_of(http.post("/v1/audio/speech", json=SPEECH), 503)["code"] == "unavailable"
        assert http.get("/healthz").status_code == 200


def test_a_caller_not_judged_yet_gets_a_503_naming_no_address(tmp_path: Path) -> None:
    """Redis down with keys on: a caller sending any key, a wrong one too, a stale /ui cookie
    or nothing (/metrics) is nobody yet, so its 503 never says where Redis is (the log does)."""
    down = f"127.0.0.1:{free_port()}"
    right = "alpha-key-" + "8" * 12
    front = start_front(tmp_path / "front", f"redis://{down}/0", COSYQ_API_KEYS=f"alpha:{right}")
    try:
        answers = []
        for key in ("wrong-key-8Q", right):
            with front.http(key=key) as http:
                answers += [http.get("/v1/jobs/" + "a" * 32), http.get("/metrics")]
                answers.append(http.post("/v1/jobs", json={"text": "hi"}))
        with front.http(key=None) as http:
            answers.append(http.post("/ui/signin", data={"key": "wrong-key-8Q"}))
            answers.append(http.get("/metrics"))
            http.cookies.set("cosyq_ui", "made-up-session-8Q")
            answers.append(http.get("/ui/jobs"))
    finally:
        front.stop()
    for answer in answers:
        assert error_of(answer, 503)["code"] == "unavailable"
        assert down.split(":")[1] not in answer.text, answer.text
    events = ("http_key_unjudged", "http_unjudged_error")
    logged = [e["error"] for e in front.events() if e["event"] in events]
    assert len(logged) == len(answers) and all(down in error for error in logged)


def test_503_when_the_storage_cannot_be_read(redis_url: str, tmp_path: Path) -> None:
    in_the_way = tmp_path / "not-a-folder"
    in_the_way.write_text("a file where the storage folder should be")
    front = start_front(tmp_path / "front", redis_url, COSYQ_STORAGE_URL=in_the_way.as_uri())
    try:
        with front.http(key=None) as http:
            error = error_of(http.get("/readyz"), 503)
    finally:
        front.stop()
    assert error["code"] == "storage_unusable" and "not-a-folder" in error["message"]


def test_readyz_names_no_user_or_password_of_redis_or_the_s3_endpoint(
    redis_url: str, tmp_path: Path
) -> None:
    """/readyz answers anyone: its 503 says what failed, never a URL's user name or password."""
    unreachable = f"redis://ops-user-5F:ops-pass-5F@127.0.0.1:{free_port()}/0"
    s3 = {
        "COSYQ_STORAGE_URL": "s3://bucket/prefix",
        "COSYQ_S3_ENDPOINT_URL": f"http://minio-user-5F:minio-pass-5F@127.0.0.1:{free_port()}",
        "COSYQ_S3_ACCESS_KEY_ID": "id",
        "COSYQ_S3_SECRET_ACCESS_KEY": "key",
        "COSYQ_S3_MAX_ATTEMPTS": "1",
    }
    errors = []
    for root, url, extra in (("redis", unreachable, {}), ("s3", redis_url, s3)):
        front = start_front(tmp_path / root, url, **extra)
        try:
            with front.http(key=None) as http:
                errors.append(error_of(http.get("/readyz"), 503))
        finally:
            front.stop()
    assert [error["code"] for error in errors] == ["redis_unreachable", "storage_unusable"]
    for error in errors:
        assert "127.0.0.1" in error["message"] and "-5F" not in error["message"], error


def test_readyz_tells_an_anonymous_caller_which_check_failed_and_an_operator_why(
    redis_url: str, tmp_path: Path
) -> None:
    """With keys on, /readyz (no key needed) says only which check failed: where the Redis or
    the storage is, and why it failed, is the deployment's, for an operator key and the log
    (with Redis down no key can be judged: the log only)."""
    folder = tmp_path / "storage-folder-7Q"
    folder.write_text("a file where the storage folder should be")
    tenant, operator = "alpha-key-" + "7" * 12, "op-key-" + "7" * 12
    keyed = {"COSYQ_API_KEYS": f"alpha:{tenant}", "COSYQ_OPERATOR_KEYS": operator}
    down = f"127.0.0.1:{free_port()}"
    fronts = {
        "storage": start_front(
            tmp_path / "s", redis_url, COSYQ_STORAGE_URL=folder.as_uri(), **keyed
        ),
        "redis": start_front(tmp_path / "r", f"redis://{down}/0", **keyed),
    }
    answers: dict[tuple[str, str | None], dict] = {}
    try:
        for name, front in fronts.items():
            for key in (None, tenant, operator):
                with front.http(key=key) as http:
                    answers[name, key] = error_of(http.get("/readyz"), 503)
        with fronts["storage"].http(key="wrong-key-7Q") as http:
            assert error_of(http.get("/readyz"), 401)["code"] == "invalid_api_key"
    finally:
        for front in fronts.values():
            front.stop()
    for key in (None, tenant):
        assert answers["storage", key]["message"] == "not ready: the storage cannot be read"
        assert answers["redis", key]["message"] == "not ready: Redis is unreachable"
    assert answers["redis", operator]["message"] == "not ready: Redis is unreachable"
    assert "storage-folder-7Q" in answers["storage", operator]["message"]
    assert {answer["code"] for (name, _), answer in answers.items() if name == "redis"} == {
        "redis_unreachable"
    }
    logged = [e["detail"] for e in fronts["redis"].events() if e["event"] == "readyz_not_ready"]
    assert logged and all(down in detail for detail in logged)


def test_serve_with_two_processes_shares_the_queue(redis_url: str, tmp_path: Path) -> None:
    front = start_front(tmp_path / "front", redis_url, "--workers", "2")
    try:
        with front.http(key=None) as http:
            ids = {http.post("/v1/jobs", json={"text": f"job {n}"}).json()["id"] for n in range(6)}
            states = {http.get(f"/v1/jobs/{job_id}").json()["state"] for job_id in ids}
    finally:
        front.stop()
    assert len(ids) == 6 and states == {"queued"}
    assert redis.Redis.from_url(redis_url).llen(f"rq:queue:{keys.QUEUE_DEFAULT}") == 6
    started = {e["event"] for e in front.events() if "Started server process" in e["event"]}
    assert len(started) == 2  # uvicorn names each server process's pid


def _json() -> dict[str, str]:
    return {"content-type": "application/json"}
