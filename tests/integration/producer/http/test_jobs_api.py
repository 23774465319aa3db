"""The native jobs API over plain HTTP (httpx) with a tiny-model worker: submit, batch, status,
audio from storage, voice upload and use; the one access-log line per request."""

from __future__ import annotations

import hashlib
import io
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.doubles.harness import wait_for
from tests.integration.producer.http.conftest import API_KEY, Front

pytestmark = pytest.mark.slow

SECRET_TEXT = "Purple elephants dance at midnight."


def wait_finished(http: httpx.Client, job_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = http.get(f"/v1/jobs/{job_id}")
        assert status.status_code == 200, status.text
        doc = status.json()
        if doc["state"] in ("finished", "failed"):
            return doc
        assert time.monotonic() < deadline, f"job {job_id} still {doc['state']}"
        time.sleep(0.1)


def tone_wav(seconds: float = 1.5, rate: int = 24000, amplitude: float = 0.3) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    sf.write(
        buffer, (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV"
    )
    return buffer.getvalue()


def test_submit_status_and_audio_from_storage(live: Front) -> None:
    with live.http() as http:
        submitted = http.post(
            "/v1/jobs",
            json={"text": SECRET_TEXT, "format": "flac", "seed": 3, "metadata": {"order": 7}},
        )
        assert submitted.status_code == 202
        job_id = submitted.json()["id"]
        assert submitted.headers["location"] == f"/v1/jobs/{job_id}"
        doc = wait_finished(http, job_id)
        assert doc["state"] == "finished", doc
        result = doc["result"]
        assert result["metadata"] == {"order": 7} and result["format"] == "flac"
        audio = http.get(f"/v1/jobs/{job_id}/audio")
        pages = [
            f"/ui/jobs/{job_id}",
            f"/ui/jobs/{job_id}/audio",
            f"/ui/jobs/{job_id}/waveform.png",
        ]
        assert [http.get(page).status_code for page in pages] == [200, 200, 200]
    assert audio.status_code == 200
    assert audio.headers["content-type"] == "audio/flac"
    assert hashlib.sha256(audio.content).hexdigest() == result["sha256"]
    assert len(audio.content) == result["bytes"]
    # One log line per request, with the job id (the /ui job pages' too); the text never
    # reaches the log.
    wanted = {("POST", "/v1/jobs", 202), ("GET", f"/v1/jobs/{job_id}/audio", 200)}
    wanted |= {("GET", page, 200) for page in pages}

    def logged() -> list[dict]:
        lines = [e for e in live.events() if e.get("event") == "http_request"]
        mine = [e for e in lines if e.get("job_id") == job_id]
        return mine if {(e["method"], e["path"], e["status"]) for e in mine} >= wanted else []

    mine = wait_for(logged, 10, "the access-log lines of the job's requests")  # written after
    assert all(isinstance(e["duration_ms"], float) for e in mine)
    log_text = live.log.read_text()
    assert "Purple elephants" not in log_text and API_KEY not in log_text


def test_batch_is_all_or_nothing_then_all_done(live: Front) -> None:
    requests = [{"text": f"Sentence number {n}.", "format": "wav"} for n in range(3)]
    with live.http() as http:
        bad = http.post(
            "/v1/jobs:batch", json={"requests": [requests[0], {"text": "", "format": "wav"}]}
        )
        assert bad.status_code == 400
        assert "requests[1]: text: must not be empty" in bad.json()["error"]["message"]
        submitted = http.post("/v1/jobs:batch", json={"requests": requests})
        assert submitted.status_code == 202
        ids = submitted.json()["ids"]
        assert len(set(ids)) == 3
        assert all(wait_finished(http, job_id)["state"] == "finished" for job_id in ids)


def test_voice_upload_then_speech_with_it(live: Front) -> None:
    with live.http() as http:
        listed = http.get("/v1/audio/voices").json()["voices"]
        assert [v["name"] for v in listed if v["builtin"]] == ["default"]
        added = http.post(
            "/v1/audio/voices",
            data={"name": "alice", "transcript": "A short prompt."},
            files={"file": ("alice.wav", tone_wav(), "audio/wav")},
        )
        assert added.status_code == 201, added.text
        assert added.json()["voice"]["name"] == "alice"
        assert "alice" in [v["name"] for v in http.get("/v1/audio/voices").json()["voices"]]
        speech = http.post(
            "/v1/audio/speech",
            json={
                "model": "cosyvoice2",
                "input": "Hi.",
                "voice": "alice",
                "response_format": "wav",
            },
        )
        assert speech.status_code == 200, speech.text
        assert sf.info(io.BytesIO(speech.content)).samplerate == 24000
        silent = http.post(
            "/v1/audio/voices",
            data={"name": "quiet", "transcript": "Nothing."},
            files={"file": ("quiet.wav", tone_wav(amplitude=0.0), "audio/wav")},
        )
    assert silent.status_code == 400
    assert "silent" in silent.json()["error"]["message"]
