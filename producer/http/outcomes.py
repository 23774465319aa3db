"""A job's end as the HTTP front reports it: the result, or the error response that fits.

Past the wait: 504, the job id in the body and a `Location` to poll (`GET /v1/jobs/{id}`).
A failed job: see errors.failed_job.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from producer.http.context import FrontContext
from producer.http.errors import SERVER_ERROR, ApiError, failed_job
from shared.errors import ResultTimeoutError
from shared.results import JobFailure, SynthesisResult


def job_location(job_id: str) -> str:
    return f"/v1/jobs/{job_id}"


def failure_error(job_id: str, failure: JobFailure) -> ApiError:
    return failed_job(job_id, failure.kind, failure.message)


async def wait_done(context: FrontContext, job_id: str, timeout: float) -> None:
    """Wait until the job ended; a 504 pointing at the job's URL when it takes longer."""
    try:
        await context.wait_until_done(job_id, timeout)
    except ResultTimeoutError as e:
        raise ApiError(
            504,
            f"{e}; poll {job_location(job_id)}",
            type_=SERVER_ERROR,
            code="timeout",
            headers={"Location": job_location(job_id)},
            extra={"job_id": job_id},
        ) from e


async def finished_result(context: FrontContext, job_id: str, timeout: float) -> SynthesisResult:
    """Wait for the job; its result, or the ApiError for its timeout or failure."""
    await wait_done(context, job_id, timeout)
    outcome = await run_in_threadpool(context.client.tracker.outcome, job_id)
    if isinstance(outcome, JobFailure):
        raise failure_error(job_id, outcome)
    return outcome
