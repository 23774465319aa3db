"""The operator page's document index (shared/job_index.py) keeps a document as long as the
document lives: one kept alive past its submit time + TTL (its jobs still wait in a deep queue)
stays in its tenant's /ui list and the operators', while an expired one is trimmed. Real Redis,
no worker (the segments' jobs wait)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from producer import CosyqClient
from producer.http.ui.listing import document_page
from shared import keys
from shared.document_state import LIVE_DOCUMENTS, document_key
from shared.job_index import owned
from shared.settings import Settings, load_settings
from workers.documents.keepalive import DocumentKeepalive

TEXT = "First paragraph, a sentence or two long.\n\nSecond paragraph, a little longer again."


@pytest.fixture
def settings(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "audio").as_uri())
    monkeypatch.setenv("COSYQ_TENANTS", "alpha")
    monkeypatch.chdir(tmp_path)  # no stray .env
    return load_settings(env_file=None)


def _listed(client: CosyqClient, tenant: str | None) -> list[str]:
    page = document_page(client.connection, tenant, offset=0, size=50)
    return [row.document_id for row in page.rows]


def test_a_document_kept_alive_past_its_ttl_stays_listed_and_an_expired_one_goes(
    settings: Settings,
) -> None:
    with CosyqClient(settings, tenant="alpha") as alpha:
        connection = alpha.connection
        kept, expired = (alpha.submit_document({"text": TEXT}) for _ in range(2))
        submitted_long_ago = time.time() - 2 * settings.result_ttl_s
        for index in (keys.DOCUMENT_INDEX, owned(keys.DOCUMENT_INDEX, "alpha")):
            connection.zadd(index, dict.fromkeys((kept, expired), submitted_long_ago))
        connection.zadd(LIVE_DOCUMENTS, {kept: submitted_long_ago})  # due for renewal
        connection.delete(document_key(expired))  # its TTL ran out
        assert DocumentKeepalive(connection, settings, holder="w").tick() == [kept]

        newest = alpha.submit_document({"text": TEXT})  # trims the index as it adds
        for tenant in ("alpha", None):  # the tenant's list and the operators'
            assert _listed(alpha, tenant) == [newest, kept]
            assert connection.zscore(owned(keys.DOCUMENT_INDEX, tenant), expired) is None
