"""Tenants over HTTP: the key names the tenant (its queue, its name on the job), and each
quota is a 429 with Retry-After naming it, counted in Redis across `--workers 2` (but for
max_voices, a count that waiting does not lower: 400)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import redis
import soundfile as sf

from shared import keys
from shared.voices import VoiceProfile, VoiceRegistry, VoiceSummary
from tests.doubles.harness import REPO_ROOT
from tests.integration.producer.http.conftest import Front, front_env, start_front

ALPHA_KEY, BETA_KEY = "alpha-key-" + "1" * 20, "beta-key-" + "2" * 20
PLAIN_KEY = "plain-key-" + "3" * 20  # the tenant "default"
QUOTAS = {"alpha": {"max_queued_jobs": 2, "requests_per_minute": 4}}


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_keys_name_tenants_and_quotas_answer_429_naming_the_quota(
    redis_url: str, tmp_path: Path
) -> None:
    front = start_front(
        tmp_path / "front",
        redis_url,
        "--workers",
        "2",
        COSYQ_API_KEYS=f"alpha:{ALPHA_KEY},beta:{BETA_KEY}",
        COSYQ_TENANT_QUOTAS=json.dumps(QUOTAS),
        COSYQ_HTTP_RETRY_AFTER_S="7",
    )
    try:
        replies = []
        for n in range(3):  # a client per request: the two server processes share one count
            with front.http(key=ALPHA_KEY) as http:
                replies.append(http.post("/v1/jobs", json={"text": f"alpha {n}"}))
        assert [r.status_code for r in replies[:2]] == [202, 202]
        queued = _error(replies[2], 429)
        assert queued["code"] == "max_queued_jobs" and queued["type"] == "rate_limit_error"
        assert replies[2].headers["retry-after"] == "7" and "alpha" in queued["message"]
        with front.http(key=ALPHA_KEY) as http:
            job_id = replies[0].json()["id"]
            status = http.get(f"/v1/jobs/{job_id}")  # the 4th request in this minute
            assert status.status_code == 200
            assert status.json()["tenant"] == "alpha"
            assert status.json()["queue"] == "cosyq-default.alpha"
            limited = http.get(f"/v1/jobs/{job_id}")
        rate = _error(limited, 429)
        assert rate["code"] == "requests_per_minute" and "requests_per_minute" in rate["message"]
        assert 1 <= int(limited.headers["retry-after"]) <= 60
        with front.http(key=BETA_KEY) as http:  # another tenant is not held back
            beta = http.post("/v1/jobs", json={"text": "beta"})
            assert beta.status_code == 202
            assert http.get(f"/v1/jobs/{beta.json()['id']}").json()["tenant"] == "beta"
            # ... and sees none of alpha's jobs: each answers as no such job, nothing changes
            for method, path in (
                ("GET", f"/v1/jobs/{job_id}"),
                ("GET", f"/v1/jobs/{job_id}/audio"),
                ("GET", f"/v1/jobs/{job_id}/stream"),
                ("DELETE", f"/v1/jobs/{job_id}"),
            ):
                hidden = _error(http.request(method, path), 404)
                assert hidden["code"] == "job_not_found", (method, path, hidden)
    finally:
        front.stop()
    connection = redis.Redis.from_url(redis_url)
    assert connection.llen("rq:queue:cosyq-default.alpha") == 2
    assert connection.llen("rq:queue:cosyq-default.beta") == 1
    logged = [e for e in front.events() if e.get("event") == "http_request"]
    assert {e.get("tenant") for e in logged if e["path"].startswith("/v1/")} == {"alpha", "beta"}
    connection.close()


def test_a_malformed_key_entry_stops_serve_with_one_line(redis_url: str, tmp_path: Path) -> None:
    secret = "sk-" + "5" * 20
    env = front_env(redis_url, tmp_path, COSYQ_API_KEYS=f"alpha:{secret},Not Valid:{secret}x")
    done = subprocess.run(
        [sys.executable, "-m", "producer.cli", "serve", "--port", "0"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "COSYQ_API_KEYS entry 2" in lines[0], done.stderr
    assert secret not in done.stderr + done.stdout


def test_a_voice_name_naming_another_owner_is_no_voice_of_the_default_tenant(
    redis_url: str, tmp_path: Path
) -> None:
    """The tenant "default" keys its voices with no owner part (`cosyq:voice:<name>`), so a
    name `alpha:alice` would be alpha's key: its DELETE answers as a voice never registered
    and leaves alpha's voice, and the shared one (an operator's), where they are."""
    connection = redis.Redis.from_url(redis_url)
    theirs = {"alpha": "alice", keys.SHARED_VOICES: "narrator"}
    for owner, name in theirs.items():
        connection.hset(keys.voice_key(name, owner), mapping={"meta": "{}", "arrays": "{}"})
        connection.sadd(keys.voices_set(owner), name)
    front = start_front(
        tmp_path / "front", redis_url, COSYQ_API_KEYS=f"alpha:{ALPHA_KEY},{PLAIN_KEY}"
    )
    try:
        with front.http(key=PLAIN_KEY) as http:
            never = _error(http.delete("/v1/audio/voices/nobody"), 404)
            for owner, name in theirs.items():
                hidden = _error(http.delete(f"/v1/audio/voices/{owner}:{name}"), 404)
                assert hidden == {
                    **never,
                    "message": never["message"].replace("'nobody'", f"'{owner}:{name}'"),
                }
    finally:
        front.stop()
    for owner, name in theirs.items():
        assert connection.exists(keys.voice_key(name, owner)), (owner, name)
    connection.close()


def _session(front: Front, key: str) -> str:
    """A /ui sign-in with `key`: the `cosyq_ui=<id>` cookie it sets."""
    with httpx.Client(base_url=front.url, timeout=30) as http:
        signed = http.post("/ui/signin", data={"key": key})
    assert signed.status_code == 303, signed.text
    return signed.headers["set-cookie"].split(";", 1)[0]


def test_a_ui_session_ends_with_its_key(redis_url: str, tmp_path: Path) -> None:
    """A key taken out of COSYQ_API_KEYS or COSYQ_OPERATOR_KEYS (revoked, rotated, moved to
    another tenant) no longer reaches anything through a session it opened before."""
    operator, rotated = "operator-key-" + "4" * 20, "alpha-key-" + "9" * 20
    before = {"COSYQ_API_KEYS": f"alpha:{ALPHA_KEY},beta:{BETA_KEY}"}
    front = start_front(tmp_path / "front", redis_url, COSYQ_OPERATOR_KEYS=operator, **before)
    try:
        sessions = {key: _session(front, key) for key in (ALPHA_KEY, BETA_KEY, operator)}
    finally:
        front.stop()
    # alpha's key rotated, its old one now gamma's; beta's kept; no operator keys
    after = {"COSYQ_API_KEYS": f"alpha:{rotated},beta:{BETA_KEY},gamma:{ALPHA_KEY}"}
    front = start_front(tmp_path / "front", redis_url, **after)
    try:
        with httpx.Client(base_url=front.url, timeout=30) as http:
            for key, cookie in sessions.items():
                page = http.get("/ui/jobs", headers={"Cookie": cookie})
                if key == BETA_KEY:  # unchanged: its session goes on
                    assert page.status_code == 200, page.text
                    continue
                assert page.status_code == 303, (key[:5], page.status_code, page.text[:200])
                assert page.headers["location"] == "/ui/signin"
    finally:
        front.stop()


def _recording() -> bytes:
    """One second of a 220 Hz tone at 24 kHz: a recording every voice check takes."""
    rate = 24000
    tone = 0.3 * np.sin(2 * np.pi * 220 * np.arange(rate) / rate)
    out = io.BytesIO()
    sf.write(out, tone.astype(np.float32), rate, format="WAV")
    return out.getvalue()


def test_voice_uploads_wait_within_the_tenants_queued_jobs_quota(
    redis_url: str, tmp_path: Path
) -> None:
    """An upload is a job in the tenant's high queue: it counts against the tenant's
    max_queued_jobs like any other (else one tenant's uploads, taken before every default
    job, would push the others' work back past its quota). No worker runs here."""
    front = start_front(
        tmp_path / "front",
        redis_url,
        COSYQ_API_KEYS=f"alpha:{ALPHA_KEY},beta:{BETA_KEY}",
        COSYQ_TENANT_QUOTAS=json.dumps({"alpha": {"max_queued_jobs": 2}}),
        COSYQ_HTTP_WAIT_TIMEOUT_S="1",
    )
    audio = _recording()
    try:
        replies = []
        for n in range(3):
            with front.http(key=ALPHA_KEY) as http:
                replies.append(
                    http.post(
                        "/v1/audio/voices",
                        data={"name": f"voice{n}", "transcript": "A tone."},
                        files={"file": ("tone.wav", audio, "audio/wav")},
                    )
                )
        assert [r.status_code for r in replies[:2]] == [504, 504]  # queued, no worker
        refused = _error(replies[2], 429)
        assert refused["code"] == "max_queued_jobs"
        with front.http(key=BETA_KEY) as http:  # another tenant's quota is its own
            beta = http.post(
                "/v1/audio/voices",
                data={"name": "voice0", "transcript": "A tone."},
                files={"file": ("tone.wav", audio, "audio/wav")},
            )
            assert beta.status_code == 504, beta.text
    finally:
        front.stop()
    connection = redis.Redis.from_url(redis_url)
    assert connection.llen("rq:queue:cosyq-high.alpha") == 2
    uploads = sorted(p.parent.name for p in (front.storage / "voices" / "alpha").rglob("*.wav"))
    assert uploads == ["voice0", "voice1"]  # the refused one left nothing behind
    connection.close()


def test_a_tenant_held_to_default_priority_uploads_voices_into_its_default_queue(
    redis_url: str, tmp_path: Path
) -> None:
    """Workers take every tenant's `high` jobs first: a tenant held to `default` uploading
    into `high` would hold back every other tenant's default work for as long as its uploads
    last. Its add-voice jobs wait in its own default queue; a tenant free to use `high` keeps
    it. No worker runs here (an accepted upload waits: 504)."""
    front = start_front(
        tmp_path / "front",
        redis_url,
        COSYQ_API_KEYS=f"alpha:{ALPHA_KEY},beta:{BETA_KEY}",
        COSYQ_TENANT_QUOTAS=json.dumps({"alpha": {"max_priority": "default"}}),
        COSYQ_HTTP_WAIT_TIMEOUT_S="1",
    )
    audio = _recording()
    try:
        for key in (ALPHA_KEY, BETA_KEY):
            with front.http(key=key) as http:
                reply = http.post(
                    "/v1/audio/voices",
                    data={"name": "tone", "transcript": "A tone."},
                    files={"file": ("tone.wav", audio, "audio/wav")},
                )
                assert reply.status_code == 504, reply.text  # queued, no worker
    finally:
        front.stop()
    connection = redis.Redis.from_url(redis_url)
    depths = {
        name: connection.llen(f"rq:queue:{name}")
        for name in ("cosyq-high.alpha", "cosyq-default.alpha", "cosyq-high.beta")
    }
    assert depths == {"cosyq-high.alpha": 0, "cosyq-default.alpha": 1, "cosyq-high.beta": 1}
    connection.close()


def _stored_voice(name: str) -> VoiceProfile:
    """A voice as a worker stores it (tiny arrays: only the count matters here)."""
    summary = VoiceSummary(
        name=name,
        transcript="A tone.",
        speech_tokens=2,
        source_sample_rate=16000,
        source_seconds=1.0,
        model_name="tiny",
        checkpoint_hash="-",
        created_at="-",
    )
    return VoiceProfile(
        summary=summary,
        speech_tokens=np.zeros(2, dtype=np.int32),
        mel=np.zeros((4, 80), dtype=np.float32),
        embedding=np.zeros(192, dtype=np.float32),
    )


def test_past_max_voices_a_new_voice_is_refused_and_a_replacement_goes_on(
    redis_url: str, tmp_path: Path
) -> None:
    """A voice stays in Redis until it is removed, so a tenant's count is a quota: past it a
    new name is refused before anything is uploaded (400, code max_voices: waiting does not
    help); replacing one of its voices, and another tenant's uploads, go on. No worker runs
    here (an accepted upload waits: 504)."""
    connection = redis.Redis.from_url(redis_url)
    for name in ("v0", "v1"):
        VoiceRegistry(connection, "alpha").save(_stored_voice(name))
    front = start_front(
        tmp_path / "front",
        redis_url,
        COSYQ_API_KEYS=f"alpha:{ALPHA_KEY},beta:{BETA_KEY}",
        COSYQ_TENANT_QUOTAS=json.dumps({"alpha": {"max_voices": 2}}),
        COSYQ_HTTP_WAIT_TIMEOUT_S="1",
    )
    audio = _recording()

    def upload(key: str, name: str) -> httpx.Response:
        with front.http(key=key) as http:
            return http.post(
                "/v1/audio/voices",
                data={"name": name, "transcript": "A tone."},
                files={"file": ("tone.wav", audio, "audio/wav")},
            )

    try:
        refused = _error(upload(ALPHA_KEY, "v2"), 400)
        assert (refused["code"], refused["param"]) == ("max_voices", "name")
        assert "tenant alpha has 2 voices (quota max_voices 2" in refused["message"]
        assert upload(ALPHA_KEY, "v0").status_code == 504  # a replacement: queued
        assert upload(BETA_KEY, "v2").status_code == 504  # beta's count is its own
    finally:
        front.stop()
    uploads = sorted(p.parent.name for p in (front.storage / "voices" / "alpha").rglob("*.wav"))
    assert uploads == ["v0"]  # the refused one was never stored
    assert VoiceRegistry(connection, "alpha").names() == ["v0", "v1"]
    connection.close()


def test_operator_keys_count_their_requests_apart_from_the_default_tenants(
    redis_url: str, tmp_path: Path
) -> None:
    """An operator key submits as the tenant "default", but its requests per minute are its
    own count: a plain key holder spending "default"'s minute never locks operators out (nor
    an operator's scrapes the tenant)."""
    operator = "operator-key-" + "4" * 20
    front = start_front(
        tmp_path / "front",
        redis_url,
        COSYQ_API_KEYS=PLAIN_KEY,
        COSYQ_OPERATOR_KEYS=operator,
        COSYQ_TENANT_REQUESTS_PER_MINUTE="3",
    )
    try:
        with front.http(key=PLAIN_KEY) as plain, front.http(key=operator) as ops:
            assert [plain.get("/v1/audio/voices").status_code for _ in range(3)] == [200] * 3
            assert _error(plain.get("/v1/audio/voices"), 429)["code"] == "requests_per_minute"
            assert ops.get("/v1/audio/voices").status_code == 200
            assert ops.get("/ui/jobs").status_code == 200
            assert [ops.get("/v1/audio/voices").status_code for _ in range(2)] == [200, 429]
    finally:
        front.stop()
