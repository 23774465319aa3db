"""A worker facing a job of a later release (fronts upgraded first, or a worker left behind):
a request field, a contract version, a job argument or a job function it does not know fails
the job for good, with a reason the producer reads, its webhook told; never a job run without
what it asked for, nor one dropped in silence."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from producer import CosyqClient
from shared import keys
from shared.errors import JobFailedError
from shared.settings import Settings, load_settings
from tests.doubles import wire
from tests.doubles.rq_workers import run_cosyq_burst
from tests.integration.upgrade.conftest import TENANT, WEBHOOK_URL, deployment_env

REQUEST = {"text": "seconds:0.05 From a later release.", "webhook": {"url": WEBHOOK_URL}}


@pytest.fixture
def settings(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name, value in deployment_env(redis_url, tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COSYQ_MAX_RETRIES", "2")  # a permanent failure is not retried anyway
    return load_settings(env_file=None)


@pytest.fixture
def connection(redis_url: str) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(redis_url)
    yield made
    made.close()


def later(request: dict[str, Any], kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return keys.SYNTHESIZE_FUNCTION, {**kwargs, "request": request}


CASES = {
    "unknown request field": (lambda r, k: later({**r, "volume": 0.5}, k), "volume"),
    "later contract version": (lambda r, k: later({**r, "schema_version": 2}, k), "schema_version"),
    "new job argument": (lambda r, k: later(r, {**k, "options": {"volume": 0.5}}), "options"),
    "unknown job function": (
        lambda r, k: ("workers.tasks.synthesize_v2", {**k, "request": r}),
        "synthesize_v2",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_job_a_later_release_queued_fails_loudly(
    case: str, settings: Settings, connection: redis.Redis
) -> None:
    """Its tenant reads the failure and why (a job that lost its tenant tag is nobody's: the
    front answered 404 job_not_found), and its webhook is told (a synthesize call)."""
    change, named = CASES[case]
    with CosyqClient(settings).for_tenant(TENANT) as client:
        job_id = client.submit(REQUEST)
        _, _, kwargs = wire.read_call(connection, job_id)
        request = kwargs.pop("request")
        wire.write_call(connection, job_id, *change(request, kwargs))
        run_cosyq_burst(settings, queues=())
        with pytest.raises(JobFailedError) as failed:
            client.result(job_id, timeout=0)
        status = client.status(job_id)
    assert (status.state, status.tenant) == ("failed", TENANT)
    assert named in str(failed.value)
    assert connection.llen(f"rq:queue:{keys.QUEUE_DEFAULT}.{TENANT}") == 0
    told = [f for _, f in connection.xrange(keys.WEBHOOK_OUTBOX) if f[b"event"] == b"job.failed"]
    if case != "unknown job function":  # a function it does not know: a webhook it cannot read
        assert [f[b"job_id"] for f in told] == [job_id.encode()]


def test_a_document_segment_a_later_release_queued_fails_its_document_loudly(
    settings: Settings, connection: redis.Redis
) -> None:
    document = {"text": "seconds:0.05 One paragraph.", "webhook": {"url": WEBHOOK_URL}}
    with CosyqClient(settings) as client:
        document_id = client.submit_document(document)
        segment = connection.hget(f"cosyq:document:{document_id}:jobs", "0")
        assert segment is not None
        function, _, kwargs = wire.read_call(connection, segment.decode())
        wire.write_call(connection, segment.decode(), function, {**kwargs, "options": {}})
        run_cosyq_burst(settings, queues=())
        status = client.document_status(document_id)
    assert status.state == "failed" and "options" in status.message
    events = [f[b"event"] for _, f in connection.xrange(keys.WEBHOOK_OUTBOX)]
    assert events == [b"document.failed"]
