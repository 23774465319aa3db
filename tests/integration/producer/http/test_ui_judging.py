"""Judging a suspect result (producer/http/ui/judging.py) against a real Redis: regenerate
submits in the job's own tenant, and a job of nobody's (no tenant tag) is never regenerated
as the tenant "default"'s, whose key would then read its text."""

from __future__ import annotations

import dataclasses

import pytest

from producer import CosyqClient
from producer.http.ui.judging import JobView, judge
from shared.errors import InvalidRequestError
from shared.keys import QUEUE_LOW, SYNTHESIZE_FUNCTION
from shared.results import ModelInfo, QualityReport, StageTimings, SynthesisResult
from shared.settings import load_settings
from shared.tenants import TENANT_META_KEY
from tests.doubles.harness import json_queue


def _suspect(job_id: str) -> SynthesisResult:
    return SynthesisResult(
        job_id=job_id,
        uri=f"file:///tmp/{job_id}.wav",
        bytes=100,
        sha256="0" * 64,
        format="wav",
        sample_rate=24000,
        duration_s=2.0,
        timings=StageTimings(total_s=1.0),
        rtf=0.5,
        model=ModelInfo(name="cosyq-tiny", checkpoint_hash="abc"),
        backend="torch",
        device="cpu",
        worker_name="w1",
        worker_pid=123,
        attempt=1,
        quality=QualityReport(verdict="suspect"),
    )


@pytest.mark.parametrize("tenant", [None, "alpha"])
def test_regenerate_submits_in_the_jobs_own_tenant_and_never_for_nobody(
    redis_url: str, tenant: str | None
) -> None:
    settings = load_settings(None, redis_url=redis_url, tenants="alpha")
    with CosyqClient(settings) as client:
        meta = {} if tenant is None else {TENANT_META_KEY: tenant}
        queue = json_queue(client.connection, QUEUE_LOW)
        job = queue.enqueue(SYNTHESIZE_FUNCTION, request={"text": "Words."}, meta=meta)
        status = dataclasses.replace(client.status(job.id), result=_suspect(job.id))
        view = JobView(status, "Words.", "", None, None, None)
        if tenant is None:
            with pytest.raises(InvalidRequestError, match="no tenant"):
                judge(client, job, view, "regenerated", "operator")
            assert sum(client.queue_depths().values()) == 1  # only the job itself
            return
        record = judge(client, job, view, "regenerated", "operator")
        assert client.status(record["new_job"]).tenant == tenant
