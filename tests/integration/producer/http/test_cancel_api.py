"""`DELETE /v1/jobs/{id}`: a queued job canceled (its audio 409 for good), twice says so, a
finished job is left as it was (409), an unknown id 404; and `cosyq cancel` / `cosyq result`."""

from __future__ import annotations

import pytest
import redis

from producer import CosyqClient
from producer.cli import main
from shared import keys
from shared.settings import load_settings
from tests.integration.producer.http.conftest import Front
from tests.integration.producer.http.test_jobs_api import wait_finished

pytestmark = pytest.mark.slow


def test_delete_cancels_a_queued_job_and_its_audio_is_409(stalled: Front) -> None:
    with stalled.http() as http:
        job_id = http.post("/v1/jobs", json={"text": "never spoken"}).json()["id"]
        canceled = http.delete(f"/v1/jobs/{job_id}")
        assert canceled.status_code == 200, canceled.text
        assert canceled.json() | {"message": ""} == {
            "id": job_id,
            "result": "canceled",
            "state": "queued",
            "message": "",
        }
        assert http.get(f"/v1/jobs/{job_id}").json()["state"] == "canceled"
        audio = http.get(f"/v1/jobs/{job_id}/audio")
        assert audio.status_code == 409 and audio.json()["error"]["code"] == "canceled"
        again = http.delete(f"/v1/jobs/{job_id}")
        assert again.status_code == 200 and again.json()["result"] == "already_canceled"
        assert http.delete("/v1/jobs/no-such-job").status_code == 404
        assert http.delete("/v1/jobs/..%2Fx").status_code == 404


def test_delete_leaves_a_finished_job_as_it_was(live: Front) -> None:
    with live.http() as http:
        job_id = http.post("/v1/jobs", json={"text": "Hello."}).json()["id"]
        assert wait_finished(http, job_id)["state"] == "finished"
        refused = http.delete(f"/v1/jobs/{job_id}")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "already_ended"
        assert http.get(f"/v1/jobs/{job_id}").json()["state"] == "finished"
        assert http.get(f"/v1/jobs/{job_id}/audio").status_code == 200


def test_cosyq_cancel_and_result_exit_codes(
    stalled: Front, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with stalled.http() as http:
        job_id = http.post("/v1/jobs", json={"text": "never spoken either"}).json()["id"]
    monkeypatch.setenv("COSYQ_REDIS_URL", stalled.redis_url)
    settings = load_settings(env_file=None)
    assert main(["cancel", job_id, "no-such-job"], client_factory=CosyqClient) == 4
    captured = capsys.readouterr()
    assert f"job {job_id} canceled" in captured.out and "no job no-such-job" in captured.err
    assert main(["cancel", job_id], client_factory=CosyqClient) == 0
    assert "already canceled" in capsys.readouterr().out
    assert main(["result", job_id], client_factory=CosyqClient) == 6
    assert main(["cancel", "../x"], client_factory=CosyqClient) == 2
    connection = redis.Redis.from_url(settings.redis_url)
    try:
        assert connection.exists(keys.cancel_key(job_id)) == 1  # kept for a worker that popped it
        assert connection.ttl(keys.cancel_key(job_id)) > 0
    finally:
        connection.close()


def test_delete_with_an_idempotency_key_answers_its_retries_alike(
    stalled: Front, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same key from `cosyq cancel --idempotency-key` (the same tenant) is the same cancel."""
    mine = {"Idempotency-Key": "cancel-order-9"}
    with stalled.http() as http:
        job_id = http.post("/v1/jobs", json={"text": "never spoken, keyed"}).json()["id"]
        bad = http.delete(f"/v1/jobs/{job_id}", headers={"Idempotency-Key": "x" * 256})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "idempotency_key"
        first = http.delete(f"/v1/jobs/{job_id}", headers=mine)
        assert first.status_code == 200 and first.json()["result"] == "canceled", first.text
        assert http.delete(f"/v1/jobs/{job_id}", headers=mine).json() == first.json()
    monkeypatch.setenv("COSYQ_REDIS_URL", stalled.redis_url)
    keyed = ["cancel", "--idempotency-key", "cancel-order-9", job_id]
    assert main(keyed, client_factory=CosyqClient) == 0
    assert capsys.readouterr().out.strip() == first.json()["message"]
    assert main(["cancel", job_id], client_factory=CosyqClient) == 0
    assert "already canceled" in capsys.readouterr().out
