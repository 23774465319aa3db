"""Erasure in the retention audit's rig (test_retention_audit.py: a front with its webhook
dispatcher, a worker pool, two tenants; retention at its default, a day): alpha erases a
finished streamed job with an idempotency key, a job with a webhook, a job canceled with an
idempotency key and a document; right after (nothing left to expire meanwhile) no key in Redis
(SCAN, every value read) and no stored file (every name and every byte) holds their text,
metadata or audio, and their ids only in what README "Erase" keeps (the operator page's
indexes, the submitted set, the webhook outbox's delivered event). Beta's own jobs and document
are as they were, and beta's erasure of alpha's ids answers 404 byte for byte as an unknown id
does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.doubles.harness import wait_for
from tests.integration.producer.http.conftest import submitted_id
from tests.integration.producer.http.test_retention_audit import (
    ALPHA,
    BETA,
    Rig,
    _ended,
    started_rig,
    stored_files,
)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """The retention audit's rig, retention at its default (a day): nothing expires here."""
    with started_rig(tmp_path, None) as made:
        yield made


# Keys that may still name an erased id, never its text or metadata (README: Erase).
ID_ONLY = ("cosyq:index:", "cosyq:submitted", "cosyq:webhooks:")


def _values(connection: redis.Redis, raw: bytes) -> str:
    kind = connection.type(raw).decode()
    if kind == "hash":
        return str(connection.hgetall(raw))
    if kind == "zset":
        return str(connection.zrange(raw, 0, -1))
    if kind == "set":
        return str(connection.smembers(raw))
    if kind == "list":
        return str(connection.lrange(raw, 0, -1))
    if kind == "stream":
        return str(connection.xrange(raw))
    return str(connection.get(raw))


def traces(connection: redis.Redis, ids: list[str], marks: list[str]) -> list[str]:
    """Keys whose name or value holds one of `marks` (text, metadata) anywhere, or one of
    `ids` outside the id-only keys."""
    found = []
    for raw in connection.scan_iter(count=1000):
        key = raw.decode(errors="replace")
        held = key + _values(connection, raw)
        found += [f"{key} holds {m!r}" for m in marks if m in held]
        if not key.startswith(ID_ONLY):
            found += [f"{key} names {i}" for i in ids if i in held]
    return found


def stored_traces(root: Path, ids: list[str], marks: list[str]) -> list[str]:
    found = []
    for name in stored_files(root):
        data = (root / name).read_bytes()
        found += [f"{name} names {i}" for i in ids if i in name or i.encode() in data]
        found += [f"{name} holds {m!r}" for m in marks if m.encode() in data]
    return found


def _webhooks_spent(connection: redis.Redis, events: int) -> bool:
    """The `events` kept bodies have given way to their `sent` markers (a body still waiting
    for its delivery is the job's status: its metadata, until sent)."""
    kept = [connection.get(k) for k in connection.scan_iter("cosyq:webhooks:body:*")]
    sent = [v for v in kept if json.loads(v or b"{}").get("sent") is True]
    return len(sent) == len(kept) == events


def _beta_view(http: httpx.Client, root: Path, jobs: list[str], document: str) -> dict:
    view: dict = {f"/v1/jobs/{j}": http.get(f"/v1/jobs/{j}").json() for j in jobs}
    for job_id in jobs:
        view[f"/v1/jobs/{job_id}/audio"] = http.get(f"/v1/jobs/{job_id}/audio").content
    view[f"/v1/documents/{document}"] = http.get(f"/v1/documents/{document}").json()
    beta = [n for n in stored_files(root) if n.startswith("tenants/beta/")]
    view["files"] = {name: (root / name).read_bytes() for name in beta}
    return view


def test_an_erasure_leaves_nothing_of_alphas_items_and_beta_as_it_was(rig: Rig) -> None:
    root, hook = rig.front.storage, {"url": rig.receiver.url + "/hook"}
    marks = ["Erasable", "alpha-secret"]
    with rig.http(ALPHA) as alpha, rig.http(BETA) as beta:

        def job(text: str, **extra: object) -> str:
            request = {"text": f"{text} Erasable words.", "metadata": {"m": "alpha-secret"}}
            return submitted_id(alpha.post("/v1/jobs", json={**request, **extra}))

        finished = job("Finished.", stream=True, idempotency_key="alpha-erase-1")
        hooked = job("Hooked.", webhook=hook)
        document = alpha.post(
            "/v1/documents",
            json={"text": "Erasable document. " * 20, "metadata": {"m": "alpha-secret"}},
        )
        document_id = submitted_id(document)
        theirs = [
            submitted_id(beta.post("/v1/jobs", json={"text": "Beta keeps these.", **extra}))
            for extra in ({}, {"webhook": hook})
        ]
        beta_document = submitted_id(beta.post("/v1/documents", json={"text": "Beta. " * 40}))
        for http, path in [
            *((alpha, f"/v1/jobs/{i}") for i in (finished, hooked)),
            (alpha, f"/v1/documents/{document_id}"),
            *((beta, f"/v1/jobs/{i}") for i in theirs),
            (beta, f"/v1/documents/{beta_document}"),
        ]:
            _ended(http, path)
        canceled = job("sleep:30 Canceled.")  # canceled queued or running: it ends canceled
        stop = alpha.delete(f"/v1/jobs/{canceled}", headers={"Idempotency-Key": "alpha-stop"})
        assert stop.status_code == 200 and stop.json()["result"] in ("canceled", "stopping")
        assert _ended(alpha, f"/v1/jobs/{canceled}")["state"] == "canceled"
        # job.finished of alpha's hooked job and of beta's
        wait_for(lambda: _webhooks_spent(rig.connection, 2), 30, "the webhooks delivered")
        # the assembler deletes a document's segments after it publishes the result
        segments = [f"/{d}/segments/" for d in (document_id, beta_document)]
        wait_for(
            lambda: not any(p in n for p in segments for n in stored_files(root)),
            30,
            "the documents' segments deleted",
        )
        ids = [finished, hooked, canceled, document_id]
        assert stored_traces(root, ids, marks), "alpha's files are there before the erasure"
        before = _beta_view(beta, root, theirs, beta_document)

        for kind, item in [("jobs", i) for i in ids[:3]] + [("documents", document_id)]:
            unknown = "f" * len(item)
            mine = beta.delete(f"/v1/{kind}/{item}", params={"erase": "true"})
            nobody = beta.delete(f"/v1/{kind}/{unknown}", params={"erase": "true"})
            assert mine.status_code == nobody.status_code == 404
            assert mine.content == nobody.content.replace(unknown.encode(), item.encode())
            erased = alpha.delete(f"/v1/{kind}/{item}", params={"erase": "true"})
            assert erased.status_code == 200, erased.text
            assert erased.json()["kept"] == []

        assert traces(rig.connection, ids, marks) == []
        assert stored_traces(root, ids, marks) == []
        assert not any(n.startswith("tenants/alpha/") for n in stored_files(root))
        assert _beta_view(beta, root, theirs, beta_document) == before
        retried = alpha.delete(f"/v1/jobs/{canceled}", headers={"Idempotency-Key": "alpha-stop"})
        assert retried.status_code == 404  # no verdict of an erased job's cancel replayed
