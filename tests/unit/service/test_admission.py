"""Job screening: only cosyq's job functions, keyword arguments that fit, no hooks, JSON only."""

from __future__ import annotations

import pickle
import zlib
from typing import Any

import pytest
import redis
from rq import Callback
from rq.job import Job
from rq.serializers import JSONSerializer

from workers.service.admission import CosyqJob, RefusedJobError, resolve_job_function, screen

OFFLINE = redis.Redis(host="127.0.0.1", port=1)  # never contacted: jobs are built in memory


def job(func: str = "workers.tasks.synthesize", *args: Any, **kwargs: Any) -> CosyqJob:
    options = {k: kwargs.pop(k) for k in ("on_failure",) if k in kwargs}
    built = CosyqJob.create(
        func, args=args, kwargs=kwargs, connection=OFFLINE, serializer=JSONSerializer, **options
    )
    assert isinstance(built, CosyqJob)
    return built


def raw(data: bytes) -> CosyqJob:
    built = CosyqJob(connection=OFFLINE, serializer=JSONSerializer)
    built.data = data
    return built


def test_cosyq_job_is_admitted() -> None:
    assert screen(job(request={"text": "hello"})) is None


@pytest.mark.parametrize(
    ("candidate", "reason"),
    [
        (lambda: job("os.system", "id"), "'os.system' is not allowed"),
        (lambda: job("workers.tasks.synthesize", {"text": "hi"}), "keyword arguments only"),
        (lambda: job(req={"text": "hi"}), "do not fit workers.tasks.synthesize"),
        (lambda: job(request={}, on_failure=Callback("os.system")), "a failure callback"),
        (lambda: raw(zlib.compress(pickle.dumps(("os.system", None, ["id"], {})))), "pickled"),
        (lambda: raw(b"\x80\x05 not json"), "not RQ JSON job data"),
        (lambda: raw(b'["workers.tasks.synthesize", null, [], ["list"]]'), "JSON object"),
        (lambda: raw(b'["workers.tasks.synthesize", "obj", [], {}]'), "bound to an instance"),
    ],
)
def test_everything_else_is_refused_with_a_reason(candidate: Any, reason: str) -> None:
    refusal = screen(candidate())
    assert refusal is not None and reason in refusal.message
    assert refusal.kind == "invalid_request"


def test_add_voice_is_admitted_with_its_own_arguments_only() -> None:
    ok = job("workers.tasks.add_voice", name="x", prompt_audio="file:///a", transcript="t")
    assert screen(ok) is None
    odd = job("workers.tasks.add_voice", name="x", prompt_audio="file:///a", shell="rm -rf /")
    refusal = screen(odd)
    assert refusal is not None and refusal.kind == "invalid_request"


def test_the_job_class_never_resolves_foreign_functions_or_callbacks() -> None:
    foreign = job("os.system", "id")
    with pytest.raises(RefusedJobError):
        _ = foreign.func
    hooked = job(request={}, on_failure=Callback("os.system"))
    assert hooked.failure_callback is None and hooked.success_callback is None
    with pytest.raises(RefusedJobError):
        resolve_job_function("subprocess.run")


def test_json_serializer_never_falls_back_to_pickle() -> None:
    payload = pickle.dumps({"x": 1})
    with pytest.raises(Exception):  # noqa: B017 - any decode error, as long as it is not pickle
        JSONSerializer.loads(payload)
    plain = Job(connection=OFFLINE, serializer=JSONSerializer)
    plain.data = payload
    assert screen(plain) is not None


@pytest.mark.parametrize(
    ("candidate", "told"),
    [
        # a later release's call, its tenant's own: its submitter is told (README "Upgrading")
        (lambda: job(request={"text": "hi"}, options={}), True),
        (lambda: job("workers.tasks.synthesize_v2", request={"text": "hi"}), True),
        # no cosyq producer's job: told to nobody
        (lambda: job("os.system", "id"), False),
        (lambda: job("workers.tasks.synthesize_v2", "positional"), False),
        (lambda: job("workers.tasks.x", on_failure=Callback("os.system")), False),
        (lambda: job(request={}, on_failure=Callback("os.system")), False),
    ],
)
def test_a_call_of_another_release_is_told_and_a_foreign_job_is_not(
    candidate: Any, told: bool
) -> None:
    refusal = screen(candidate())
    assert refusal is not None and refusal.told is told


def test_a_job_of_an_unknown_tenant_is_told_to_nobody() -> None:
    foreign = job("workers.tasks.synthesize_v2", request={})
    foreign.meta = {"cosyq_tenant": "mallory"}
    refusal = screen(foreign)
    assert refusal is not None and not refusal.told
