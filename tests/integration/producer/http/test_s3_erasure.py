"""Erasure on S3 end to end: a real `cosyq serve` and worker pool storing on a moto server (its
own process, keys checked) over real HTTP. Once `DELETE ...?erase=true` answers 200, a job's
object and a document's (audio, manifest, captions) are gone from the bucket, a caller's
`output_key` object stays unless `output_key=true`. A front the bucket denies deletes
(a bucket policy: the moto server checks those, not a user's own policy) answers 503 naming the
object it could not delete and no credential; the job is as it was (status, audio, object) and
erasing it once deletes are allowed again erases it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.doubles.harness import Cluster, wait_for
from tests.doubles.s3_servers import AuthS3, s3_client
from tests.integration.producer.http.conftest import Front, start_front, submitted_id

pytestmark = pytest.mark.slow

BUCKET = "checked"  # made by the auth_s3 fixture
DONE_TIMEOUT_S = 60.0
DENY_DELETES = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:DeleteObject",
            "Resource": f"arn:aws:s3:::{BUCKET}/*",
        }
    ],
}


@pytest.fixture
def s3_front(auth_s3: AuthS3, redis_url: str, tmp_path: Path) -> Iterator[Front]:
    storage = {
        "COSYQ_STORAGE_URL": f"s3://{BUCKET}/tts",
        "COSYQ_S3_ENDPOINT_URL": auth_s3.url,
        "COSYQ_S3_REGION": "us-east-1",
        "COSYQ_S3_ACCESS_KEY_ID": auth_s3.key_id,
        "COSYQ_S3_SECRET_ACCESS_KEY": auth_s3.secret,
        "COSYQ_S3_ADDRESSING_STYLE": "path",
        "COSYQ_DOCUMENT_SEGMENT_CHARS": "200",
    }
    front = start_front(tmp_path / "front", redis_url, **storage)
    cluster = Cluster(redis_url=redis_url, root=tmp_path, overrides=storage)
    cluster.start("pool", "-n", "1", log_name="pool.log")
    try:
        yield front
    finally:
        front.stop()
        cluster.stop_all()


def _ended(http: httpx.Client, path: str) -> dict:
    def done() -> dict | None:
        status = http.get(path).json()
        return status if status.get("state") in ("finished", "assembled") else None

    return wait_for(done, DONE_TIMEOUT_S, path)


def _objects(auth_s3: AuthS3) -> set[str]:
    s3 = s3_client(auth_s3.url, auth_s3.key_id, auth_s3.secret)
    listed = s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    return {f"s3://{BUCKET}/{o['Key']}" for o in listed}


def test_an_erasure_deletes_its_objects_on_s3(s3_front: Front, auth_s3: AuthS3) -> None:
    with s3_front.http(key=None) as http:
        plain = submitted_id(http.post("/v1/jobs", json={"text": "Erasable on S3."}))
        named = {"text": "Erasable named.", "output_key": "named/take"}
        kept_id = submitted_id(http.post("/v1/jobs", json=named))
        asked = {"text": "Erasable asked.", "output_key": "named/asked"}
        asked_id = submitted_id(http.post("/v1/jobs", json=asked))
        document = http.post("/v1/documents", json={"text": "Erasable document. " * 20})
        document_id = submitted_id(document)
        uris = {i: _ended(http, f"/v1/jobs/{i}")["result"]["uri"] for i in (plain, kept_id)}
        uris[asked_id] = _ended(http, f"/v1/jobs/{asked_id}")["result"]["uri"]
        result = _ended(http, f"/v1/documents/{document_id}")["result"]
        files = {result[name] for name in ("uri", "manifest_uri", "srt_uri", "vtt_uri")}
        before = _objects(auth_s3)
        assert set(uris.values()) | files <= before

        erased = {
            plain: http.delete(f"/v1/jobs/{plain}", params={"erase": "true"}),
            kept_id: http.delete(f"/v1/jobs/{kept_id}", params={"erase": "true"}),
            asked_id: http.delete(
                f"/v1/jobs/{asked_id}", params={"erase": "true", "output_key": "true"}
            ),
            document_id: http.delete(f"/v1/documents/{document_id}", params={"erase": "true"}),
        }
        assert all(r.status_code == 200 for r in erased.values()), [r.text for r in erased.values()]
        assert erased[plain].json()["deleted"] == [uris[plain]]
        assert erased[kept_id].json()["kept"] == [uris[kept_id]]
        assert erased[asked_id].json()["deleted"] == [uris[asked_id]]
        assert files <= set(erased[document_id].json()["deleted"])
        left = _objects(auth_s3)
        assert left == {uris[kept_id]}  # the caller's output_key, not asked for: nothing else
        assert uris[kept_id].endswith("/named/take.wav")


def test_a_front_the_bucket_denies_deletes_answers_503_and_erases_nothing(
    s3_front: Front, auth_s3: AuthS3
) -> None:
    s3 = s3_client(auth_s3.url, auth_s3.key_id, auth_s3.secret)
    with s3_front.http(key=None) as http:
        job_id = submitted_id(http.post("/v1/jobs", json={"text": "Erasable, not yet."}))
        status = _ended(http, f"/v1/jobs/{job_id}")
        audio = http.get(f"/v1/jobs/{job_id}/audio").content
        document_id = submitted_id(http.post("/v1/documents", json={"text": "Kept. " * 40}))
        document = _ended(http, f"/v1/documents/{document_id}")
        before = _objects(auth_s3)
        s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(DENY_DELETES))
        try:
            refused = http.delete(f"/v1/jobs/{job_id}", params={"erase": "true"})
            refused_document = http.delete(f"/v1/documents/{document_id}", params={"erase": "true"})
        finally:
            s3.delete_bucket_policy(Bucket=BUCKET)
        for answer in (refused, refused_document):
            assert answer.status_code == 503, answer.text
            message = answer.json()["error"]["message"]
            assert f"cannot delete s3://{BUCKET}/tts/" in message and "access denied" in message
            assert auth_s3.key_id not in answer.text and auth_s3.secret not in answer.text
        # nothing half-erased: every object, the status and the audio as they were
        assert _objects(auth_s3) == before
        assert http.get(f"/v1/jobs/{job_id}").json() == status
        assert http.get(f"/v1/jobs/{job_id}/audio").content == audio
        assert http.get(f"/v1/documents/{document_id}").json() == document
        again = http.delete(f"/v1/jobs/{job_id}", params={"erase": "true"})
        assert again.status_code == 200 and again.json()["deleted"] == [status["result"]["uri"]]
        assert http.delete(f"/v1/documents/{document_id}", params={"erase": "true"}).is_success
        assert _objects(auth_s3) == set()
