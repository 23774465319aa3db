"""Every error the HTTP front returns, as OpenAI's error JSON, never a traceback or HTML.

`{"error": {"message", "type", "param", "code"}}`: OpenAI's SDKs parse this shape into their
exception classes (`BadRequestError`, `AuthenticationError`, ...). Our own exceptions map to
statuses here, in one table, so a route raises what the producer raises and never builds a
response by hand: InvalidRequestError 400 (UnknownVoiceError 404; VoiceQuotaError 400 with the
code max_voices), JobNotFoundError 404,
QueueFullError 429 with Retry-After, TenantQuotaError 429 with Retry-After and the quota as
its code, TransientError or a Redis error 503, and a failed job by
its failure kind (FAILED_JOB_STATUS).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from producer.erasure import Erasure
from shared.errors import (
    CosyqError,
    InvalidRequestError,
    JobFailedError,
    JobNotFoundError,
    QueueFullError,
    StillRunningError,
    StorageError,
    TenantQuotaError,
    TransientError,
    UnknownVoiceError,
    VoiceQuotaError,
)
from shared.settings_env import redact_urls
from shared.validation_messages import describe_errors

log = structlog.get_logger("cosyq.http")

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
# A failed job's status per failure kind (shared.results.FailureKind); any other kind is 500.
FAILED_JOB_STATUS: dict[str, int] = {
    "invalid_request": 400,  # the request can never succeed as written
    "canceled": 409,  # canceled (DELETE /v1/jobs/{id}): it has no audio and never will
    "transient": 502,  # storage or Redis behind the worker kept failing past the retries
    "storage": 500,  # storage refused for good (no such bucket, permissions): the deployment
    "worker_died": 500,
    "internal": 500,
    "quality": 422,  # on_suspect fail: the audio was made and judged suspect
}
_SOURCES = ("body", "query", "path", "header")
# Never repeated in a message: the contract's texts and their OpenAI and upload names.
_NEVER_ECHOED = frozenset(
    {"text", "prompt_text", "instruction", "input", "instructions", "transcript"}
)
_PARAM_RE = re.compile(r"(?:requests\[\d+\]: )?([A-Za-z_][A-Za-z0-9_.]*): ")


class ApiError(Exception):
    """An error response: status, OpenAI's fields, and extra headers or top-level body keys."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def response(self) -> JSONResponse:
        body: dict[str, Any] = {
            "error": {
                "message": redact_urls(self.message, keep_user=False),  # a storage error's URL
                "type": self.type,
                "param": self.param,
                "code": self.code,
            },
            **self.extra,
        }
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def param_of(message: str) -> str | None:
    """The field an InvalidRequestError names ("text: 2,314 characters" -> "text")."""
    found = _PARAM_RE.match(message)
    return found.group(1) if found else None


def failed_job(job_id: str, kind: str, reason: str) -> ApiError:
    """A job that failed for good, as the status of its failure kind (FAILED_JOB_STATUS, else
    500), `code` the kind; the message is the worker's (never the text). Never 503: that
    says "retry, the front is unavailable", and asking again cannot revive a failed job."""
    message = f"job {job_id} failed ({kind}): {reason}"
    extra = {"job_id": job_id}
    status = FAILED_JOB_STATUS.get(kind, 500)
    if status < 500:
        return ApiError(status, message, param=param_of(reason), code=kind, extra=extra)
    return ApiError(status, message, type_=SERVER_ERROR, code=kind, extra=extra)


def quota_exceeded(error: TenantQuotaError) -> ApiError:
    """429 naming the tenant's quota (`code`: max_queued_jobs or requests_per_minute)."""
    extra = {"submitted": list(error.submitted)} if error.submitted else None
    return ApiError(
        429,
        f"quota exceeded: {error}",
        type_="rate_limit_error",
        param="tenant",
        code=error.quota,
        headers={"Retry-After": str(error.retry_after_s)},
        extra=extra,
    )


def auth_locked_out(per_minute: int, wait_s: int) -> ApiError:
    """429 for a client address past its wrong keys (producer/quotas.py AuthFailures): the
    same for a right key and a wrong one, so it says nothing about the key sent."""
    return ApiError(
        429,
        f"too many wrong API keys from this address ({per_minute:,} a minute, "
        f"COSYQ_HTTP_AUTH_FAILURES_PER_MINUTE); retry in {wait_s} s",
        type_="rate_limit_error",
        code="auth_failures_per_minute",
        headers={"Retry-After": str(wait_s)},
    )


def from_exception(error: Exception, *, retry_after_s: int = 5) -> ApiError:
    """Our exception (or Redis's) as the API error a caller sees."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, UnknownVoiceError):
        return ApiError(404, str(error), param="voice", code="voice_not_found")
    if isinstance(error, VoiceQuotaError):
        return ApiError(400, str(error), param="name", code="max_voices")
    if isinstance(error, InvalidRequestError):
        return ApiError(400, str(error), param=param_of(str(error)), code="invalid_value")
    if isinstance(error, JobNotFoundError):
        return ApiError(404, str(error), code="job_not_found")
    if isinstance(error, JobFailedError):
        return failed_job(error.job_id, error.kind, error.reason)
    if isinstance(error, QueueFullError):
        return ApiError(
            429,
            f"queue full: {error}",
            type_="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": str(retry_after_s)},
        )
    if isinstance(error, TenantQuotaError):
        return quota_exceeded(error)
    if isinstance(error, redis.RedisError):
        return ApiError(
            503, f"Redis is unreachable: {error}", type_=SERVER_ERROR, code="unavailable"
        )
    if isinstance(error, TransientError):  # Redis or the storage, named in the message
        return ApiError(
            503, f"temporarily unavailable: {error}", type_=SERVER_ERROR, code="unavailable"
        )
    if isinstance(error, CosyqError):  # our messages name no secret and carry no text
        return ApiError(500, str(error), type_=SERVER_ERROR, code="internal")
    return ApiError(500, "internal server error", type_=SERVER_ERROR, code="internal")


def validation_failed(errors: Sequence[Any]) -> ApiError:
    """Pydantic's errors (a body model's or FastAPI's own, for query and path parameters) as a
    400 phrased like the producer's ("field: rule"), the first field as `param`. The one
    mapping from validation to OpenAI's error; the request's texts are never repeated."""
    located = [{**error, "loc": _without_source(error.get("loc", ()))} for error in errors]
    first = located[0]["loc"] if located else ()
    return ApiError(
        400,
        describe_errors(located, _NEVER_ECHOED) if located else "request: invalid",
        param=".".join(str(part) for part in first) or None,
        code="invalid_value",
    )


def _without_source(loc: Sequence[Any]) -> tuple[Any, ...]:
    """("body", "speed") -> ("speed",): the field as the caller named it."""
    return tuple(loc[1:]) if loc and loc[0] in _SOURCES else tuple(loc)


def _judged(request: Request) -> bool:
    """Whether the caller is someone: its key or session was judged (the key check, or /ui's,
    set its tenant), or the front has no keys (loopback only: everyone is "default")."""
    key_check = getattr(request.app.state, "key_check", None)
    enabled = getattr(key_check, "enabled", True)
    return not enabled or getattr(request.state, "tenant", None) is not None


def _unjudged(request: Request, mapped: ApiError) -> ApiError:
    """A server error for a caller who is nobody yet (no key, a wrong one, a stale cookie on a
    route that failed before judging it): where Redis or the storage is, and why it failed,
    go to the log (`http_unjudged_error`), the answer keeps only its status and code."""
    log.warning("http_unjudged_error", path=request.url.path, error=redact_urls(mapped.message))
    return ApiError(
        mapped.status,
        "temporarily unavailable; retry" if mapped.status == 503 else "internal server error",
        type_=SERVER_ERROR,
        code=mapped.code,
        headers=mapped.headers,
    )


def install_error_handlers(app: FastAPI, retry_after_s: int) -> None:
    """Route every exception to an OpenAI-shaped JSON response."""

    async def api_error(request: Request, error: Exception) -> JSONResponse:
        mapped = from_exception(error, retry_after_s=retry_after_s)
        expected = isinstance(error, ApiError | TransientError | redis.RedisError)
        if mapped.status >= 500 and not expected:
            log.error("http_internal_error", error_type=type(error).__name__)
        if mapped.status >= 500 and mapped is not error and not _judged(request):
            return _unjudged(request, mapped).response()
        return mapped.response()

    async def http_error(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        headers = dict(error.headers or {})
        return ApiError(error.status_code, str(error.detail), headers=headers).response()

    async def validation_error(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return validation_failed(error.errors()).response()

    for kind in (
        ApiError,
        InvalidRequestError,
        JobNotFoundError,
        JobFailedError,
        TransientError,
        redis.RedisError,
        Exception,
    ):
        app.add_exception_handler(kind, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)


async def erased(erase: Callable[[], Erasure]) -> Erasure:
    """Run an erasure off the event loop; its StillRunningError as 409 `still_running` with
    Retry-After (erase again once it has stopped: nothing was erased). A storage that refuses
    a delete for good (its credentials may not delete) is 503 naming the object: the erasure
    stopped there, before Redis, so the caller erases again once the operator lets it delete
    (a StorageError reached no handler of its own and the caller's connection was reset)."""
    try:
        return await run_in_threadpool(erase)
    except StillRunningError as e:
        raise ApiError(409, str(e), code="still_running", headers={"Retry-After": "1"}) from e
    except StorageError as e:
        raise ApiError(
            503,
            f"the storage refused the erasure, nothing of it in Redis erased (erase it again "
            f"once this front may delete there): {e}",
            type_=SERVER_ERROR,
            code="storage_refused",
            headers={"Retry-After": "60"},
        ) from e
