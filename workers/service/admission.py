"""Which jobs a worker will run: anyone who can write to Redis must not get code execution.

An RQ job names its function by dotted path and RQ imports and calls whatever it names; it can
also name success/failure/stopped callbacks (imported and called too) and webhooks (HTTP requests
sent by the worker). A cosyq worker runs only cosyq's own job functions, with keyword arguments
that bind to their signatures, no callbacks and no webhooks; anything else is refused before any
import. Payloads are read with RQ's JSON serializer only: pickle bytes are not JSON, so a
pickled job fails to decode and is refused, never unpickled.
"""

from __future__ import annotations

import importlib
import inspect
import json
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, cast

from redis import Redis
from rq.exceptions import DeserializationError
from rq.job import Job
from rq.job_lifecycle import record_job_failure
from rq.queue import Queue
from rq.registry import FailedJobRegistry
from rq.utils import current_timestamp, now, utcformat

from shared import keys
from shared.document_state import ASSEMBLE_DOCUMENT_FUNCTION
from shared.tenants import DEFAULT_TENANT, TENANT_META_KEY, tenant_of_queue

# Dotted path -> (module, attribute). The only callables a job may name.
JOB_FUNCTIONS: dict[str, tuple[str, str]] = {
    keys.SYNTHESIZE_FUNCTION: ("workers.tasks", "synthesize"),
    keys.ADD_VOICE_FUNCTION: ("workers.tasks", "add_voice"),
    ASSEMBLE_DOCUMENT_FUNCTION: ("workers.documents.job", "assemble_document"),
}
# What a refused call of ours most likely is: a later release's producer, this worker not
# upgraded yet (README "Upgrading": workers first)
LATER_RELEASE = "; a job of a later release? upgrade this worker"


class RefusedJobError(Exception):
    """Raised if anything tries to run a job function outside the allow-list."""


@dataclass(frozen=True)
class Refusal:
    """Why a job was refused; `message` is short and safe to show to the submitter."""

    message: str
    kind: str = "invalid_request"
    # The job is its tenant's (checked) and only its call is not this worker's: a function or
    # an argument of another release (a front upgraded before its workers). It keeps its tags
    # and its webhook or document is told, as for any failed job; every other refusal (a job
    # no cosyq producer made) is told to nobody.
    told: bool = False


def resolve_job_function(func_name: str | None) -> Callable[..., Any]:
    """Import one of cosyq's job functions by its dotted path; refuse every other name."""
    target = JOB_FUNCTIONS.get(func_name or "")
    if target is None:
        raise RefusedJobError(f"job function {func_name!r} is not one of cosyq's job functions")
    module_name, attribute = target
    function = getattr(importlib.import_module(module_name), attribute, None)
    if function is None:
        raise RefusedJobError(f"job function {func_name} is not available in this worker version")
    return cast(Callable[..., Any], function)


class CosyqJob(Job):
    """An RQ job that can only call cosyq's job functions and never imports a callback."""

    @property
    def func(self) -> Callable[..., Any]:
        if self.instance is not None:
            raise RefusedJobError("jobs bound to an instance are not accepted")
        return resolve_job_function(self.func_name)

    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None


def screen(job: Job, tenants: Collection[str] = (DEFAULT_TENANT,)) -> Refusal | None:
    """None when the job may run; otherwise why not. Imports nothing the job names.

    `tenants` are the tenants this worker knows (Settings.tenant_names())."""
    try:
        func_name, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    except DeserializationError:
        return Refusal(
            "job payload is not RQ JSON job data ([func, null, args, kwargs], optionally "
            "zlib-compressed); pickled or malformed payloads are refused unread"
        )
    if func_name not in JOB_FUNCTIONS:
        allowed = ", ".join(sorted(JOB_FUNCTIONS))
        later = LATER_RELEASE if (func_name or "").startswith("workers.") else ""
        message = f"job function {func_name!r} is not allowed (allowed: {allowed}){later}"
        return Refusal(message, told=_tenants_own(job, tenants))
    if instance is not None:
        return Refusal("job must not be bound to an instance")
    if args:
        return Refusal("job must pass keyword arguments only, got positional arguments")
    if not isinstance(kwargs, dict):
        return Refusal(f"job kwargs must be a JSON object, got {type(kwargs).__name__}")
    if not _is_json(job.meta):
        return Refusal("job meta is not a JSON object")
    hooks = _hooks_named(job)
    if hooks:
        return Refusal(f"job must not carry {', '.join(hooks)}: cosyq jobs use none")
    return _check_tenant(job, tenants) or _check_signature(func_name, kwargs)


def _tenants_own(job: Job, tenants: Collection[str]) -> bool:
    """A call of cosyq's shape (keyword arguments only, a readable meta, no hooks) in its
    tenant's queue: a job of its tenant, of another release (told)."""
    shaped = job.instance is None and not job.args and isinstance(job.kwargs, dict)
    return (
        shaped and _is_json(job.meta) and not _hooks_named(job) and not _check_tenant(job, tenants)
    )


def _check_tenant(job: Job, known: Collection[str]) -> Refusal | None:
    """The job's tenant (job.meta, "default" when absent) must be known and own its queue."""
    tenant = job.meta.get(TENANT_META_KEY, DEFAULT_TENANT)
    if not isinstance(tenant, str) or tenant not in known:
        listed = ", ".join(sorted(known))
        return Refusal(f"unknown tenant {tenant!r}: this worker knows {listed} (COSYQ_TENANTS)")
    if job.origin and tenant_of_queue(job.origin) != tenant:
        return Refusal(
            f"unknown tenant {tenant!r} for queue {job.origin}: a job waits in its "
            "own tenant's queue"
        )
    return None


def _hooks_named(job: Job) -> list[str]:
    named = [
        label
        for label, value in (
            ("a success callback", job._success_callback_name),
            ("a failure callback", job._failure_callback_name),
            ("a stopped callback", job._stopped_callback_name),
        )
        if value
    ]
    if job.webhooks:
        named.append("webhooks")
    return named


def _is_json(value: object) -> bool:
    if not isinstance(value, dict):
        return False
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _check_signature(func_name: str, kwargs: dict[str, Any]) -> Refusal | None:
    """The arguments bind to the function (the job is its tenant's: told)."""
    try:
        function = resolve_job_function(func_name)
    except RefusedJobError as e:
        return Refusal(str(e))
    try:
        inspect.signature(function).bind(**kwargs)
    except TypeError as e:
        return Refusal(f"job arguments do not fit {func_name}: {e}{LATER_RELEASE}", told=True)
    return None


def refuse_unreadable(
    connection: Redis, queue_name: str, job_id: str, reason: str, *, failure_ttl_s: int
) -> None:
    """Fail a job whose Redis hash RQ cannot even load (bad status, dates, JSON fields).

    The hash is replaced by a minimal, readable failed job (the payload bytes kept for
    inspection) so `cosyq failed` can show the reason; nothing in it is executed.
    """
    job_key = Job.key_for(job_id)
    payload = connection.hget(job_key, "data") or b""
    message = f"unreadable job hash: {reason}"
    stamp = utcformat(now())
    fields: dict[str, str | bytes | int] = {
        "data": payload,
        "origin": queue_name,
        "status": "failed",
        "created_at": stamp,
        "ended_at": stamp,
        "description": "unreadable job (refused by cosyq)",
        "exc_info": zlib.compress(message.encode("utf-8")),
        "meta": json.dumps({keys.ERROR_META_KEY: {"kind": "invalid_request", "message": message}}),
        "failure_ttl": failure_ttl_s,
    }
    queue = Queue(queue_name, connection=connection)
    with connection.pipeline() as pipe:
        pipe.delete(job_key)
        pipe.hset(job_key, mapping=fields)  # type: ignore[arg-type]
        pipe.expire(job_key, failure_ttl_s)
        failed_key = FailedJobRegistry(queue_name, connection).key
        pipe.zadd(failed_key, {job_id: current_timestamp() + failure_ttl_s})
        pipe.lrem(queue.intermediate_queue_key, 1, job_id)
        pipe.execute()


def record_refusal(job: Job, message: str, pipe: Any) -> None:
    """Queue the writes that fail a refused job: status, failed registry, result, meta."""
    record_job_failure(job, message, pipe)
    pipe.hset(job.key, "meta", json.dumps(job.meta))
