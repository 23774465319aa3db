"""A document acts in its own tenant whoever asks (issue 44, item 4): the plan records the
tenant, `retry` re-runs segments in that tenant's queue and the assembly job waits there too,
though the client asking (the CLI's) is tenant "default". Real Redis, no worker needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from producer import CosyqClient
from producer.documents import ensure_assembly
from shared import keys
from shared.document_state import document_key, job_ids, load_plan
from shared.errors import InvalidRequestError
from shared.job_index import owned
from shared.settings import Settings, load_settings
from shared.tenants import DEFAULT_TENANT, TENANT_META_KEY

TEXT = "First paragraph, a sentence or two long.\n\nSecond paragraph, a little longer again."


@pytest.fixture
def settings(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "audio").as_uri())
    monkeypatch.setenv("COSYQ_TENANTS", "alpha")
    monkeypatch.setenv("COSYQ_DOCUMENT_SEGMENT_CHARS", "60")
    monkeypatch.chdir(tmp_path)  # no stray .env
    return load_settings(env_file=None)


def _job(client: CosyqClient, job_id: str) -> Job:
    return Job.fetch(job_id, connection=client.connection, serializer=JSONSerializer)


def test_retry_and_assembly_run_in_the_documents_tenant_not_the_callers(
    settings: Settings,
) -> None:
    with CosyqClient(settings, tenant="alpha") as alpha, CosyqClient(settings) as cli:
        document_id = alpha.submit_document({"text": TEXT})
        first = job_ids(alpha.connection, document_id)[0]
        alpha.connection.delete(Job.key_for(first))  # lost: `retry` makes it again
        assert cli.retry_document(document_id) == [0]
        again = _job(cli, job_ids(cli.connection, document_id)[0])
        assert again.id != first and again.origin == "cosyq-default.alpha"
        assert again.meta[TENANT_META_KEY] == "alpha"
        plan = load_plan(cli.connection, document_id)
        assert ensure_assembly(cli, plan)
        assembly = cli.connection.get(f"cosyq:document:{document_id}:assembly")
        assert assembly is not None
        job = _job(cli, assembly.decode())
        assert job.origin == "cosyq-default.alpha" and job.meta[TENANT_META_KEY] == "alpha"
        assert plan.tenant == "alpha"


def test_a_document_of_nobodys_is_not_retried_as_the_default_tenants(settings: Settings) -> None:
    """A plan with no tenant (from before tenants) is refused: its segments redone as "default"'s
    jobs would be that tenant's key's to read (text and audio), on /v1/jobs and in /ui."""
    with CosyqClient(settings, tenant="alpha") as alpha, CosyqClient(settings) as cli:
        document_id = alpha.submit_document({"text": TEXT})
        connection = cli.connection
        raw = json.loads(connection.get(document_key(document_id)) or b"{}")
        raw.pop("tenant")  # planned before tenants: nobody's
        connection.set(document_key(document_id), json.dumps(raw), keepttl=True)
        first = job_ids(connection, document_id)[0]
        connection.delete(Job.key_for(first))  # lost: a retry would make it again
        default_index = owned(keys.JOB_INDEX, DEFAULT_TENANT)
        with pytest.raises(InvalidRequestError, match="no tenant"):
            cli.retry_document(document_id)
        assert job_ids(connection, document_id)[0] == first  # nothing redone
        assert connection.zcard(default_index) == 0
