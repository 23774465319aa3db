"""GET /v1/jobs/{id}/audio relays a result stored on S3 (moto's server mode, over real HTTP):
the front and a worker both on `s3://`, the bytes equal to the object the worker wrote; with
the endpoint gone, a 503 that names none of its credentials."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import boto3
import pytest

from tests.conftest import RedisServer
from tests.doubles.harness import Cluster
from tests.doubles.s3_servers import RestartableS3
from tests.integration.conftest import S3Endpoint
from tests.integration.producer.http.conftest import fresh_db, start_front

pytestmark = pytest.mark.slow

BUCKET = "http-audio"


def test_audio_of_an_s3_result_is_relayed_from_the_bucket(
    redis_server: RedisServer, s3_endpoint: S3Endpoint, tmp_path: Path
) -> None:
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_endpoint.url,
        region_name=s3_endpoint.region,
        aws_access_key_id=s3_endpoint.access_key_id,
        aws_secret_access_key=s3_endpoint.secret_access_key,
    )
    s3.create_bucket(Bucket=BUCKET)
    storage = {
        "COSYQ_STORAGE_URL": f"s3://{BUCKET}/tts",
        "COSYQ_S3_ENDPOINT_URL": s3_endpoint.url,
        "COSYQ_S3_REGION": s3_endpoint.region,
        "COSYQ_S3_ACCESS_KEY_ID": s3_endpoint.access_key_id,
        "COSYQ_S3_SECRET_ACCESS_KEY": s3_endpoint.secret_access_key,
        "COSYQ_S3_ADDRESSING_STYLE": "path",
    }
    url = fresh_db(redis_server, "s3")
    front = start_front(tmp_path / "front", url, **storage)
    cluster = Cluster(redis_url=url, root=tmp_path, overrides=storage)
    try:
        with front.http(key=None) as http:
            job_id = http.post("/v1/jobs", json={"text": "Stored on S3.", "format": "flac"}).json()[
                "id"
            ]
            worker = cluster.start("run", "--burst", log_name="worker.log")
            assert worker.wait(timeout=60) == 0, (tmp_path / "worker.log").read_text()[-2000:]
            deadline = time.monotonic() + 10
            while (status := http.get(f"/v1/jobs/{job_id}").json())["state"] != "finished":
                assert time.monotonic() < deadline, status
                time.sleep(0.1)
            result = status["result"]
            assert result["uri"].startswith(f"s3://{BUCKET}/tts/")
            audio = http.get(f"/v1/jobs/{job_id}/audio")
    finally:
        front.stop()
        cluster.stop_all()
    assert audio.status_code == 200 and audio.headers["content-type"] == "audio/flac"
    key = result["uri"].removeprefix(f"s3://{BUCKET}/")
    stored = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    assert audio.content == stored
    assert hashlib.sha256(audio.content).hexdigest() == result["sha256"]


def test_an_unreachable_endpoint_is_a_503_naming_no_credentials_of_it(
    redis_server: RedisServer, restartable_s3: RestartableS3, tmp_path: Path
) -> None:
    """botocore quotes the endpoint URL it could not reach; the tenant's answer shows neither
    its password nor its user name (the operator's log keeps the user name)."""
    boto3.client(
        "s3",
        endpoint_url=restartable_s3.url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=BUCKET)
    storage = {
        "COSYQ_STORAGE_URL": f"s3://{BUCKET}/tts",
        "COSYQ_S3_ENDPOINT_URL": restartable_s3.url.replace("//", "//ops-user:ops-pass-7Hq@"),
        "COSYQ_S3_REGION": "us-east-1",
        "COSYQ_S3_ACCESS_KEY_ID": "testing",
        "COSYQ_S3_SECRET_ACCESS_KEY": "testing",
        "COSYQ_S3_ADDRESSING_STYLE": "path",
        "COSYQ_S3_MAX_ATTEMPTS": "1",
    }
    url = fresh_db(redis_server, "s3")
    front = start_front(tmp_path / "front", url, **storage)
    cluster = Cluster(redis_url=url, root=tmp_path, overrides=storage)
    try:
        with front.http(key=None) as http:
            job_id = http.post("/v1/jobs", json={"text": "Stored, then out of reach."}).json()["id"]
            worker = cluster.start("run", "--burst", log_name="worker.log")
            assert worker.wait(timeout=60) == 0, (tmp_path / "worker.log").read_text()[-2000:]
            assert http.get(f"/v1/jobs/{job_id}").json()["state"] == "finished"
            restartable_s3.stop()
            audio = http.get(f"/v1/jobs/{job_id}/audio")
    finally:
        front.stop()
        cluster.stop_all()
    assert audio.status_code == 503, audio.text
    message = audio.json()["error"]["message"]
    assert "cannot read" in message and "//***@127.0.0.1" in message
    assert "ops-user" not in audio.text and "ops-pass-7Hq" not in audio.text
