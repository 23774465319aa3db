"""Fronts upgraded before workers, or side by side with fronts of an earlier release (a rolling
upgrade, a rollback): what the current front writes, an earlier release's worker and front
read. The golden fixtures say what each release knows: the request fields its worker accepts
(`contract`) and the form of the idempotency keys its front wrote, and so reads."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from producer import CosyqClient
from shared import keys
from shared.document_state import DOCUMENT_IDEMPOTENCY_PREFIX
from shared.document_state import idempotency_key as document_idempotency_key
from tests.doubles import wire
from tests.integration.upgrade.conftest import TENANT, Upgraded

pytestmark = pytest.mark.parametrize("release", wire.RELEASES)
DOCUMENT = {"text": "seconds:0.05 A paragraph.\n\nseconds:0.05 Another one.", "seed": 5}


def test_a_job_the_current_front_queues_asks_an_earlier_worker_only_what_it_knows(
    release: str, upgrade: Callable[..., Upgraded]
) -> None:
    """The release's own requests, submitted again through the current client: the jobs carry
    only fields its worker knows (it refuses any other: `markup`, added after 5e9718f, failed
    every job a later front queued, asked for or not)."""
    old = upgrade(release, "queued")
    known = set(old.fixture.contract["request_fields"])
    requests = {
        role: {
            k: v
            for k, v in old.fixture.call(old.fixture.ids[role])[2]["request"].items()
            if k != "idempotency_key"
        }
        for role in ("speech", "streamed", "tenant_speech")
    }
    with CosyqClient(old.settings) as client:
        ids = [client.submit(requests["speech"]), client.submit(requests["streamed"])]
        ids.append(client.for_tenant(TENANT).submit(requests["tenant_speech"]))
        document_id = client.submit_document(DOCUMENT)
    segments = old.connection.hvals(f"cosyq:document:{document_id}:jobs")
    ids += [segment.decode() for segment in segments]
    for job_id in ids:
        sent = wire.read_call(old.connection, job_id)[2]["request"]
        assert set(sent) <= known, f"{release} does not know {sorted(set(sent) - known)}"


def test_the_current_fronts_idempotency_keys_read_right_by_an_earlier_front(
    release: str, upgrade: Callable[..., Upgraded]
) -> None:
    """A release whose document key held the document's id alone reads the whole value as the
    id: a later front's `<id> <claimed at> <enqueued at>` was answered to a resubmit as the
    document's id (202, then 404). Every release reads a job's key's first word."""
    old = upgrade(release, "queued")
    written = {e["key"]: e["value"] for e in old.fixture.keys if "idem:" in e["key"]}
    (old_document_key,) = [
        v for k, v in written.items() if k.startswith(DOCUMENT_IDEMPOTENCY_PREFIX)
    ]
    whole = len(old_document_key.split()) == 1  # this release reads the value as the id
    with CosyqClient(old.settings) as client:
        job_id = client.submit({"text": "seconds:0.05 Fresh.", "idempotency_key": "fresh"})
        document_id = client.submit_document({**DOCUMENT, "idempotency_key": "fresh"})
    job_key = old.connection.get(keys.idempotency_key("fresh", "default"))
    document_key = old.connection.get(document_idempotency_key("fresh", "default"))
    assert job_key is not None and job_key.split()[0] == job_id.encode()
    assert document_key is not None
    if whole:
        assert document_key == document_id.encode()
    else:
        assert document_key.split()[0] == document_id.encode()
