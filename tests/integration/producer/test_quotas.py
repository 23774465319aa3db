"""A tenant's max_queued_jobs taken atomically (issue 44, item 6): producers submitting at once
never pass it together, and a document over it goes in whole or not at all. Real Redis, real
threads each with its own client and connection, and `cosyq serve` for the HTTP answer."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import redis
from rq import Queue

from producer import CosyqClient
from shared.errors import InvalidRequestError, SettingsError, TenantQuotaError
from shared.settings import Settings, load_settings
from tests.integration.producer.http.conftest import start_front

QUOTA = 10
PRODUCERS, EACH = 4, 10
BETA_QUEUES = ("cosyq-high.beta", "cosyq-default.beta", "cosyq-low.beta")
QUOTAS = json.dumps({"beta": {"max_queued_jobs": QUOTA}})
BETA_KEY = "beta-key-" + "2" * 20
# Five paragraphs of one sentence each: five segments.
DOCUMENT = "\n\n".join(f"Paragraph {n} says one thing and then it stops." for n in range(5))


def _settings(redis_url: str, **extra: object) -> Settings:
    return load_settings(
        None,
        redis_url=redis_url,
        tenants="alpha,beta",
        tenant_quotas=json.loads(QUOTAS),
        backpressure="raise",
        **extra,
    )


def _queued(connection: redis.Redis) -> list[str]:
    ids: list[str] = []
    for name in BETA_QUEUES:
        ids += Queue(name, connection=connection).get_job_ids()
    return ids


def _submit_at_once(settings: Settings) -> list[str]:
    """PRODUCERS threads, each its own client, released together; every id any of them was
    told it submitted (returned, or carried by the quota error)."""
    barrier = threading.Barrier(PRODUCERS)
    told: list[list[str]] = [[] for _ in range(PRODUCERS)]

    def produce(slot: int) -> None:
        with CosyqClient(settings, tenant="beta") as client:
            requests = [{"text": f"producer {slot} job {n}"} for n in range(EACH)]
            barrier.wait()
            try:
                told[slot] = client.submit_many(requests)
            except TenantQuotaError as e:
                told[slot] = list(e.submitted)

    threads = [threading.Thread(target=produce, args=(slot,)) for slot in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return [job_id for ids in told for job_id in ids]


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_producers_at_once_never_pass_a_tenants_max_queued_jobs(redis_url: str, chunk: int) -> None:
    settings = _settings(redis_url, submit_chunk_size=chunk)
    connection = redis.Redis.from_url(redis_url, decode_responses=True)
    for _ in range(3):  # a few rounds: each one a fresh race for the same room
        for name in BETA_QUEUES:
            Queue(name, connection=connection).empty()
        told = _submit_at_once(settings)
        queued = _queued(connection)
        assert len(queued) == QUOTA  # full, never over: 4 x 10 tried
        assert sorted(told) == sorted(queued)  # each producer was told the truth
    connection.close()


def _redis_state(connection: redis.Redis) -> tuple[list[str], list[str]]:
    documents = sorted(connection.scan_iter("cosyq:document*"))
    jobs = sorted(connection.scan_iter("rq:job:*"))
    return documents, jobs


def test_a_document_over_the_quota_leaves_nothing_and_frees_its_key(redis_url: str) -> None:
    settings = _settings(redis_url, submit_chunk_size=2, document_segment_chars=60)
    connection = redis.Redis.from_url(redis_url, decode_responses=True)
    document = {"text": DOCUMENT, "idempotency_key": "report-7"}
    with CosyqClient(settings, tenant="beta") as client:
        client.submit_many([{"text": f"waiting {n}"} for n in range(QUOTA - 3)])
        before = _redis_state(connection)
        with pytest.raises(TenantQuotaError) as refused:
            client.submit_document(document)  # 5 segments, room for 3
        error = refused.value
        assert error.submitted == () and "none was submitted" in str(error)
        assert "3 submitted" not in str(error) and error.quota == "max_queued_jobs"
        assert _redis_state(connection) == before  # no plan, no jobs, no idempotency claim
        assert len(_queued(connection)) == QUOTA - 3
        blocking = settings.model_copy(update={"backpressure": "block"})
        with (
            CosyqClient(blocking, tenant="beta") as patient,  # waiting cannot help: 15 > 10
            pytest.raises(TenantQuotaError, match="none was submitted"),
        ):
            patient.submit_document({"text": "\n\n".join([DOCUMENT] * 3)})
        assert _redis_state(connection) == before
        for name in BETA_QUEUES:
            Queue(name, connection=connection).empty()
        document_id = client.submit_document(document)  # the key is free: a new document
        status = client.document_status(document_id)
        assert status.segments == status.queued == len(_queued(connection)) == 5
        assert client.submit_document(document) == document_id
    connection.close()


def test_submitters_racing_for_one_document_key_make_one_document(redis_url: str) -> None:
    """The key is read under WATCH and claimed in the plan's transaction: of submitters at
    once, one writes the document, the others' transactions are refused and name it."""
    settings = _settings(redis_url, document_segment_chars=60)
    connection = redis.Redis.from_url(redis_url, decode_responses=True)
    document = {"text": DOCUMENT, "idempotency_key": "report-9"}
    answers: list[str] = []
    go = threading.Barrier(6)

    def submit() -> None:
        with CosyqClient(settings, tenant="beta") as client:
            go.wait(timeout=60)
            answers.append(client.submit_document(document))

    threads = [threading.Thread(target=submit) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(answers) == 6 and len(set(answers)) == 1
    assert [key for key in connection.scan_iter("cosyq:document:*") if key.count(":") == 2] == [
        f"cosyq:document:{answers[0]}"
    ]
    assert len(_queued(connection)) == 5  # one document's segments, once
    connection.close()


def test_a_document_over_the_quota_answers_429_over_http(redis_url: str, tmp_path: Path) -> None:
    front = start_front(
        tmp_path,
        redis_url,
        COSYQ_API_KEYS=f"beta:{BETA_KEY}",
        COSYQ_TENANT_QUOTAS=QUOTAS,
        COSYQ_DOCUMENT_SEGMENT_CHARS="60",
        COSYQ_SUBMIT_CHUNK_SIZE="2",
    )
    connection = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        with front.http(key=BETA_KEY) as http:
            batch = {"requests": [{"text": f"waiting {n}"} for n in range(QUOTA - 3)]}
            assert http.post("/v1/jobs:batch", json=batch).status_code == 202
            before = _redis_state(connection)
            document = {"text": DOCUMENT, "idempotency_key": "report-8"}
            answer = http.post("/v1/documents", json=document)
            assert answer.status_code == 429, answer.text
            body = answer.json()
            assert body["error"]["code"] == "max_queued_jobs" and "submitted" not in body
            assert _redis_state(connection) == before
    finally:
        front.stop()
        connection.close()


def test_a_tenant_held_to_default_priority_queues_no_high_job(redis_url: str) -> None:
    """Workers serve every tenant's `high` queue before any tenant's `default`, so a tenant
    whose max_priority is `default` is refused `high` (one error naming the field, nothing
    queued, a document's segments neither); its `default` and `low` jobs are taken, and a tenant
    not held keeps `high`. `low` is no cap: it would refuse a request naming no priority."""
    quotas = {"beta": {"max_priority": "default"}}
    settings = load_settings(None, redis_url=redis_url, tenants="alpha,beta", tenant_quotas=quotas)
    connection = redis.Redis.from_url(redis_url, decode_responses=True)
    high = "priority: high is above tenant beta's highest, default"
    with CosyqClient(settings, tenant="beta") as beta, CosyqClient(settings, tenant="alpha") as a:
        with pytest.raises(InvalidRequestError, match=high):
            beta.submit({"text": "Now.", "priority": "high"})
        with pytest.raises(InvalidRequestError, match=rf"requests\[1\]: {high}"):
            beta.submit_many([{"text": "One."}, {"text": "Two.", "priority": "high"}])
        with pytest.raises(InvalidRequestError, match=high):
            beta.submit_document({"text": DOCUMENT, "priority": "high"})
        assert _queued(connection) == [] and _redis_state(connection) == ([], [])
        taken = [beta.submit({"text": "One."}), beta.submit({"text": "Two.", "priority": "low"})]
        assert sorted(_queued(connection)) == sorted(taken)
        assert a.status(a.submit({"text": "Now.", "priority": "high"})).queue == "cosyq-high.alpha"
    with pytest.raises(SettingsError, match="COSYQ_TENANT_MAX_PRIORITY"):
        load_settings(None, redis_url=redis_url, tenant_max_priority="low")
    connection.close()
