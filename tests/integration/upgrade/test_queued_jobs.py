"""Workers upgraded while jobs wait: every job an earlier release's producer queued (speech with
an idempotency key and a webhook, a streamed job, a document's segment, a voice upload, a named
tenant's job) is run by the current worker, and the current client reads each outcome."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from producer import CosyqClient
from shared import keys
from shared.tenants import DEFAULT_TENANT
from tests.doubles import wire
from tests.doubles.rq_workers import run_cosyq_burst
from tests.integration.upgrade.conftest import SPEECH_KEY, TENANT, VOICE, Upgraded

pytestmark = pytest.mark.parametrize("release", wire.RELEASES)


def path_of(uri: str) -> Path:
    return Path(unquote(urlsplit(uri).path))


def test_every_job_an_earlier_release_queued_runs_on_the_current_worker(
    release: str, upgrade: Callable[..., Upgraded]
) -> None:
    old = upgrade(release, "queued")
    ids = old.fixture.ids
    run_cosyq_burst(old.settings, queues=())  # the worker's own choice: every tenant's queues
    with CosyqClient(old.settings) as client:
        speech = client.result(ids["speech"], timeout=0)
        streamed = client.result(ids["streamed"], timeout=0)
        chunks = list(client.stream(ids["streamed"], timeout=30))
        document = client.document_result(ids["document"], timeout=0)
        voice = client.wait_for_voice(ids["voice"], timeout=0)
        voices = [v.name for v in client.list_voices()]
        tenant = client.for_tenant(TENANT).result(ids["tenant_speech"], timeout=0)
    assert speech.idempotency_key == SPEECH_KEY and speech.metadata == {"order": 1234}
    audio = path_of(speech.uri).read_bytes()
    assert hashlib.sha256(audio).hexdigest() == speech.sha256 and speech.duration_s > 0
    assert path_of(speech.uri) == old.storage / "upgrade" / "speech.wav"
    assert streamed.stream == keys.audio_stream_key(ids["streamed"]) and chunks
    assert document.segments == 1 and path_of(document.uri).is_file()
    assert voice.name == VOICE and VOICE in voices
    assert tenant.tenant == TENANT and path_of(tenant.uri).is_file()
    # the speech job's webhook: its event is in the outbox for the dispatchers
    events = old.connection.xrange(keys.WEBHOOK_OUTBOX)
    assert any(ids["speech"].encode() in b"".join(f.values()) for _, f in events)


def test_an_idempotency_key_an_earlier_release_claimed_still_dedupes(
    release: str, upgrade: Callable[..., Upgraded]
) -> None:
    old = upgrade(release, "queued")
    ids = old.fixture.ids
    speech = old.fixture.call(ids["speech"])[2]["request"]
    tenant_request = old.fixture.call(ids["tenant_speech"])[2]["request"]
    with CosyqClient(old.settings) as client:
        assert client.submit(speech) == ids["speech"]
        assert client.for_tenant(TENANT).submit(tenant_request) == ids["tenant_speech"]
        document = {"text": "anything", "idempotency_key": "upgrade-document"}
        assert client.submit_document(document) == ids["document"]


def test_a_key_an_earlier_front_claimed_before_its_job_is_held_for_the_grace_only(
    release: str, upgrade: Callable[..., Upgraded], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An earlier release claimed a key (`<job id> <claimed at>`) before enqueueing its job,
    then marked it enqueued: a key caught between the two, its job not in Redis, may be a
    submit still on its way (COSYQ_IDEMPOTENCY_CLAIM_GRACE_S), and is free once older."""
    monkeypatch.setenv("COSYQ_IDEMPOTENCY_CLAIM_GRACE_S", "3600")  # a slow test stays in it
    old = upgrade(release, "queued")
    speech_id = old.fixture.ids["speech"]
    request = old.fixture.call(speech_id)[2]["request"]
    key = keys.idempotency_key(SPEECH_KEY, DEFAULT_TENANT)
    claimed = old.connection.get(key)
    assert claimed is not None and claimed.split()[0] == speech_id.encode()
    old.connection.delete(f"rq:job:{speech_id}")  # its enqueue not there yet
    queue = f"rq:queue:{keys.QUEUE_DEFAULT}"
    old.connection.lrem(queue, 0, speech_id)
    depth = old.connection.llen(queue)
    now = int(old.connection.time()[0])
    grace = int(old.settings.idempotency_claim_grace_s)
    with CosyqClient(old.settings) as client:
        old.connection.set(key, f"{speech_id} {now}", keepttl=True)
        assert client.submit(request) == speech_id  # in flight: held for it
        assert old.connection.llen(queue) == depth  # no second job
        old.connection.set(key, f"{speech_id} {now - grace - 1}", keepttl=True)
        fresh = client.submit(request)  # older than the grace: its job is gone for good
    assert fresh != speech_id
    assert old.connection.get(key).split()[0] == fresh.encode()  # type: ignore[union-attr]
