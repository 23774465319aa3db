"""Two jobs of one tenant given the same `output_key`: the later write wins the object, and the
front never relays it as the other job's audio (on a folder and on S3, moto's server mode):
each job's audio answers 200 only with bytes whose sha256 is that job's own result's, else 404
`audio_not_found`. Two tenants' same key are two objects (each tenant's prefix)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import boto3
import httpx
import pytest

from shared.audio_notes import note_path
from tests.doubles.harness import Cluster
from tests.integration.conftest import S3Endpoint
from tests.integration.producer.http.conftest import start_front

pytestmark = pytest.mark.slow

BUCKET = "reused-keys"
TEXTS = ("The first job's words.", "A second job, saying something rather longer than that.")


def s3_storage(endpoint: S3Endpoint) -> dict[str, str]:
    boto3.client(
        "s3",
        endpoint_url=endpoint.url,
        region_name=endpoint.region,
        aws_access_key_id=endpoint.access_key_id,
        aws_secret_access_key=endpoint.secret_access_key,
    ).create_bucket(Bucket=BUCKET)
    return {
        "COSYQ_STORAGE_URL": f"s3://{BUCKET}/tts",
        "COSYQ_S3_ENDPOINT_URL": endpoint.url,
        "COSYQ_S3_REGION": endpoint.region,
        "COSYQ_S3_ACCESS_KEY_ID": endpoint.access_key_id,
        "COSYQ_S3_SECRET_ACCESS_KEY": endpoint.secret_access_key,
        "COSYQ_S3_ADDRESSING_STYLE": "path",
    }


def finished(http: httpx.Client, job_id: str) -> dict:
    deadline = time.monotonic() + 10
    while (status := http.get(f"/v1/jobs/{job_id}").json())["state"] != "finished":
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    return status["result"]


@pytest.mark.parametrize("where", ["folder", "s3"])
def test_a_reused_output_key_never_serves_one_jobs_audio_as_anothers(
    redis_url: str, request: pytest.FixtureRequest, tmp_path: Path, where: str
) -> None:
    storage = {}
    if where == "s3":
        storage = s3_storage(request.getfixturevalue("s3_endpoint"))
    front = start_front(tmp_path / "front", redis_url, **storage)
    storage.setdefault("COSYQ_STORAGE_URL", front.storage.as_uri())
    engine = {"COSYQ_ENGINE": "tests.doubles.engines:per_char"}  # audio as long as the text
    cluster = Cluster(redis_url=redis_url, root=tmp_path, overrides=storage | engine)
    try:
        with front.http(key=None) as http:
            job_ids = [
                http.post(
                    "/v1/jobs", json={"text": text, "format": "wav", "output_key": "same.wav"}
                ).json()["id"]
                for text in TEXTS
            ]
            worker = cluster.start("run", "--burst", log_name="worker.log")
            assert worker.wait(timeout=60) == 0, (tmp_path / "worker.log").read_text()[-2000:]
            results = [finished(http, job_id) for job_id in job_ids]
            audios = [http.get(f"/v1/jobs/{job_id}/audio") for job_id in job_ids]
    finally:
        front.stop()
        cluster.stop_all()
    assert results[0]["uri"] == results[1]["uri"]  # one object, two results naming it
    assert results[0]["sha256"] != results[1]["sha256"]
    served = []
    for result, audio in zip(results, audios, strict=True):
        if audio.status_code == 200:
            assert hashlib.sha256(audio.content).hexdigest() == result["sha256"]
            assert audio.headers["x-cosyq-job-id"] == result["job_id"]
            served.append(result["job_id"])
        else:
            assert audio.status_code == 404, audio.text
            error = audio.json()["error"]
            assert error["code"] == "audio_not_found" and "output_key" in error["message"]
    assert len(served) == 1  # the object holds exactly one job's audio


def test_a_folders_audio_is_checked_by_its_note_not_its_hash(
    redis_url: str, tmp_path: Path
) -> None:
    """On a folder the front believes the note beside the audio (shared/audio_notes.py) while it
    describes the file: shown by a file changed in place, its size and mtime put back (no
    writer of ours does that), still relayed. Without a note (a worker from before notes) the
    file is hashed: the changed bytes are refused, the job's own served."""
    front = start_front(tmp_path / "front", redis_url)
    storage = {"COSYQ_STORAGE_URL": front.storage.as_uri()}
    cluster = Cluster(redis_url=redis_url, root=tmp_path, overrides=storage)
    try:
        with front.http(key=None) as http:
            job_id = http.post("/v1/jobs", json={"text": "noted", "format": "wav"}).json()["id"]
            worker = cluster.start("run", "--burst", log_name="worker.log")
            assert worker.wait(timeout=60) == 0, (tmp_path / "worker.log").read_text()[-2000:]
            path = Path(unquote(urlsplit(finished(http, job_id)["uri"]).path))
            audio, before = path.read_bytes(), path.stat()
            changed = bytes([audio[0] ^ 1]) + audio[1:]
            with path.open("r+b") as file:
                file.write(changed[:1])
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
            believed = http.get(f"/v1/jobs/{job_id}/audio")
            note_path(path).unlink()
            hashed = http.get(f"/v1/jobs/{job_id}/audio")
            path.write_bytes(audio)
            restored = http.get(f"/v1/jobs/{job_id}/audio")
    finally:
        front.stop()
        cluster.stop_all()
    assert believed.status_code == 200 and believed.content == changed
    assert hashed.status_code == 404 and hashed.json()["error"]["code"] == "audio_not_found"
    assert restored.status_code == 200 and restored.content == audio
