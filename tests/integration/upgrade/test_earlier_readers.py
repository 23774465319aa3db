"""Fronts upgraded before workers, or side by side with fronts of an earlier release (a rolling
upgrade, a rollback): what the current front writes, an earlier release's worker and front
read. The golden fixtures say what each release knows: the request fields its worker accepts
(`contract`) and the form of the idempotency keys its front wrote, and so reads."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from producer import CosyqClient
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
