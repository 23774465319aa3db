"""Cancel a whole document (issue 24): every segment not done is canceled as a job is, the
document then reads `canceled`, a wait on it ends with the reason, and `retry` runs the
segments after all. No worker runs here, so every segment is still queued when it is canceled:
the outcome does not depend on timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis

from producer import CosyqClient
from shared.document_state import DocumentFailedError, job_ids
from shared.settings import load_settings
from tests.doubles.harness import REPO_ROOT
from tests.integration.producer.http.conftest import API_KEY, front_env, start_front

TEXT = "\n\n".join(
    f"Paragraph {n} says one plain thing. Then it says a second thing, and stops." for n in range(6)
)


def test_a_canceled_document_never_runs_reads_canceled_and_retry_requeues_it(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = front_env(redis_url, tmp_path, COSYQ_DOCUMENT_SEGMENT_CHARS="80")
    for name, value in env.items():
        if name.startswith("COSYQ_"):
            monkeypatch.setenv(name, value)
    connection = redis.Redis.from_url(redis_url)
    with CosyqClient(load_settings(env_file=None)) as client:
        document_id = client.submit_document({"text": TEXT, "seed": 3})
        segments = job_ids(connection, document_id)
        assert len(segments) >= 3
        outcomes = client.cancel_document(document_id)
        assert sorted(outcomes) == sorted(segments)
        assert {o.verdict for o in outcomes.values()} == {"canceled"}
        assert connection.llen("rq:queue:cosyq-default") == 0  # none left to run
        status = client.document_status(document_id)
        assert status.state == "canceled" and status.failed == len(segments)
        assert "canceled" in status.message
        with pytest.raises(DocumentFailedError, match="canceled"):
            client.document_result(document_id, timeout=5)
        again = client.cancel_document(document_id)  # a second cancel changes nothing
        assert not any(o.changed for o in again.values())
        keyed = client.cancel_document(document_id, idempotency_key="doc-stop")
        assert {o.verdict for o in keyed.values()} == {"already_canceled"}  # not its own
        assert client.retry_document(document_id) == sorted(segments)
        assert client.document_status(document_id).state == "running"
        assert connection.llen("rq:queue:cosyq-default") == len(segments)
    cli = subprocess.run(
        [sys.executable, "-m", "producer.cli", "document", "cancel", document_id],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert "segments canceled: " + ", ".join(str(i) for i in sorted(segments)) in cli.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "producer.cli", "document", "cancel", "0" * 32],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert missing.returncode == 4 and "not found" in missing.stderr
    assert "Traceback" not in missing.stderr
    connection.close()


def cosyq(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command line, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "producer.cli", *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cosyq_document_cancel_with_an_idempotency_key_answers_its_retry_alike(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry of `cosyq document cancel --idempotency-key` (its first answer lost) names the
    segments the first try canceled; without the key it is another cancel and names none."""
    env = front_env(redis_url, tmp_path, COSYQ_DOCUMENT_SEGMENT_CHARS="80")
    for name, value in env.items():
        if name.startswith("COSYQ_"):
            monkeypatch.setenv(name, value)
    with CosyqClient(load_settings(env_file=None)) as client:
        document_id = client.submit_document({"text": TEXT, "seed": 4})
        segments = sorted(job_ids(client.connection, document_id))
    assert len(segments) >= 3
    too_long = ("document", "cancel", "--idempotency-key", "k" * 256, document_id)
    refused = cosyq(env, tmp_path, *too_long)
    assert refused.returncode == 1, refused.stderr  # an invalid request, as `cosyq cancel`'s
    assert "idempotency_key: 256 characters" in refused.stderr and not refused.stdout
    keyed = ("document", "cancel", "--idempotency-key", "stop-doc-7", document_id)
    first = cosyq(env, tmp_path, *keyed)
    assert first.returncode == 0, first.stderr
    named = "segments canceled: " + ", ".join(str(i) for i in segments)
    assert first.stdout.strip() == named
    retry = cosyq(env, tmp_path, *keyed)
    assert (retry.returncode, retry.stdout) == (0, first.stdout)
    other = cosyq(env, tmp_path, "document", "cancel", document_id)
    assert other.stdout.strip() == "segments canceled: none (every segment had ended)"


def test_delete_on_a_document_cancels_its_segments(redis_url: str, tmp_path: Path) -> None:
    front = start_front(
        tmp_path / "front",
        redis_url,
        COSYQ_API_KEYS=API_KEY,
        COSYQ_DOCUMENT_SEGMENT_CHARS="80",
    )
    try:
        with front.http() as http:
            accepted = http.post("/v1/documents", json={"text": TEXT})
            assert accepted.status_code == 202, accepted.text
            document_id = accepted.json()["id"]
            bad = http.delete(f"/v1/documents/{document_id}", headers={"Idempotency-Key": ""})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "idempotency_key"
            mine = {"Idempotency-Key": "stop-doc-1"}
            canceled = http.delete(f"/v1/documents/{document_id}", headers=mine)
            assert canceled.status_code == 200, canceled.text
            body = canceled.json()
            assert body["state"] == "canceled" and body["failed"] == body["segments"] >= 3
            again = http.delete(f"/v1/documents/{document_id}", headers=mine)
            assert again.json() == body
            audio = http.get(f"/v1/documents/{document_id}/audio")
            assert audio.status_code == 422 and "canceled" in audio.json()["error"]["message"]
            assert http.delete("/v1/documents/" + "0" * 32).status_code == 404
    finally:
        front.stop()
