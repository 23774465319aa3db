"""Fronts upgraded after an earlier release's workers ran: its results, documents, voices,
idempotency keys and webhook events are read by the current client, front, worker and
dispatcher as if the current release had written them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from producer import CosyqClient
from tests.doubles import wire
from tests.doubles.harness import wait_for
from tests.doubles.rq_workers import run_cosyq_burst
from tests.doubles.webhook_receiver import webhook_receiver
from tests.integration.producer.http.conftest import API_KEY, start_front
from tests.integration.producer.webhook_rig import SECRET, dispatching
from tests.integration.upgrade.conftest import (
    TENANT,
    VOICE,
    WEBHOOK_URL,
    Upgraded,
    deployment_env,
)

pytestmark = pytest.mark.parametrize("release", wire.RELEASES)
ACME_KEY = "acme-key-" + "5" * 24
OPERATOR_KEY = "operator-key-" + "3" * 24


def test_results_documents_and_voices_read_back_and_keys_still_dedupe(
    release: str, upgrade: Callable[..., Upgraded]
) -> None:
    old = upgrade(release, "finished")
    ids = old.fixture.ids
    speech_request = old.fixture.call(ids["speech"])[2]["request"]
    with CosyqClient(old.settings) as client:
        assert client.status(ids["speech"]).state == "finished"
        speech = client.result(ids["speech"], timeout=0)
        assert client.document_status(ids["document"]).state == "assembled"
        document = client.document_result(ids["document"], timeout=0)
        assert VOICE in [v.name for v in client.list_voices()]
        tenant = client.for_tenant(TENANT).result(ids["tenant_speech"], timeout=0)
        assert client.submit(speech_request) == ids["speech"]
        assert (
            client.submit_document({"text": "x", "idempotency_key": "upgrade-document"})
            == (ids["document"])
        )
        # the voice the earlier worker registered speaks for the current one
        in_voice = client.submit({"text": "seconds:0.05 In the old voice.", "voice": VOICE})
        run_cosyq_burst(old.settings, queues=())
        assert client.result(in_voice, timeout=0).duration_s > 0
    stored = old.storage / "upgrade" / "speech.wav"
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == speech.sha256
    assert document.segments == 1 and tenant.tenant == TENANT


def test_the_front_serves_what_an_earlier_release_wrote(
    release: str, upgrade: Callable[..., Upgraded], redis_url: str, tmp_path: Path
) -> None:
    old = upgrade(release, "finished")
    ids = old.fixture.ids
    env = deployment_env(redis_url, tmp_path)
    env["COSYQ_API_KEYS"] = f"{API_KEY},{TENANT}:{ACME_KEY}"
    env["COSYQ_OPERATOR_KEYS"] = OPERATOR_KEY
    front = start_front(tmp_path / "front", redis_url, **env)
    try:
        with front.http() as http, front.http(ACME_KEY) as acme:
            job = http.get(f"/v1/jobs/{ids['speech']}")
            audio = http.get(f"/v1/jobs/{ids['speech']}/audio")
            document = http.get(f"/v1/documents/{ids['document']}")
            document_audio = http.get(f"/v1/documents/{ids['document']}/audio")
            voices = http.get("/v1/audio/voices")
            tenant_job = acme.get(f"/v1/jobs/{ids['tenant_speech']}/audio")
            not_acme = acme.get(f"/v1/jobs/{ids['speech']}")
        with front.http(OPERATOR_KEY) as operator:  # the operator's page over its index
            pages = [
                operator.get(page)
                for page in ("/ui/jobs", f"/ui/jobs/{ids['speech']}", "/ui/documents")
            ]
    finally:
        front.stop()
    assert job.status_code == 200 and job.json()["state"] == "finished", (
        job.text,
        front.log.read_text()[-3000:],
    )
    assert audio.status_code == 200, [e for e in front.events() if e.get("level") == "warning"]
    assert audio.content == (old.storage / "upgrade" / "speech.wav").read_bytes()
    assert document.status_code == 200 and document.json()["state"] == "assembled"
    assert document_audio.status_code == 200 and document_audio.content[:4] == b"RIFF"
    assert voices.status_code == 200 and VOICE in json.dumps(voices.json())
    assert tenant_job.status_code == 200 and tenant_job.content[:4] == b"RIFF"
    assert not_acme.status_code == 404  # the tenant tag an earlier release wrote still holds
    assert [page.status_code for page in pages] == [200, 200, 200]
    assert ids["speech"] in pages[0].text and ids["document"] in pages[2].text


def test_a_webhook_event_an_earlier_worker_recorded_is_delivered(
    release: str, upgrade: Callable[..., Upgraded], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COSYQ_WEBHOOK_SECRET", SECRET)
    with webhook_receiver() as receiver:
        old = upgrade(release, "finished", {WEBHOOK_URL: receiver.url})
        with dispatching(old.connection, old.settings, None):
            wait_for(lambda: receiver.calls, 30, "the old event's delivery")
    delivered = json.loads(receiver.calls[0].body)
    assert (delivered["job_id"], delivered["state"]) == (old.fixture.ids["speech"], "finished")
    assert delivered["tenant"] == "default"
