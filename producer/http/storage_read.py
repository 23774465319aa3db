"""GET /v1/jobs/{id}/audio: a stored result relayed in chunks, from a folder or from S3.

Only URIs under the configured storage (COSYQ_STORAGE_URL) are read: a result names where its
worker wrote, and the front never reads anywhere else, whatever a Redis entry says. Nor does
it read, for a job or document, a file outside what the job's or document's tenant owns
(`check_owned`, judged on the key as it will be opened: a file URI's path percent-decoded), so
a result rewritten in Redis cannot hand one tenant another's audio. Either way the route
answers as it does for an id that never existed, and the front logs why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import structlog
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from producer.http.context import FrontContext
from producer.http.errors import ApiError
from shared.audio import CONTENT_TYPES
from shared.audio_notes import holds_audio
from shared.document_state import not_found
from shared.errors import JobNotFoundError, ObjectNotFoundError, StorageError
from shared.output_keys import owns_key
from shared.results import SynthesisResult
from shared.settings_env import redact_url
from shared.storage import JOB_ID_METADATA, stored_key

log = structlog.get_logger("cosyq.http")

CHUNK_BYTES = 64 * 1024


def check_owned(context: FrontContext, uri: str, owner: str | None, missing: Exception) -> None:
    """`uri`, read as `_open` reads it, is a key under the storage (`stored_key`) that `owner`
    owns (shared/output_keys.py `owns_key`). Otherwise the record naming it was rewritten in
    Redis, or written by a worker on another storage: a warning for the operator
    (`stored_uri_outside_storage` or `stored_uri_not_owned`), and `missing` (the route's own
    error for an unknown id, so the answer tells the caller nothing more) is raised."""
    base = context.storage.base_uri
    key = stored_key(base, uri)
    if key is None:
        log.warning(
            "stored_uri_outside_storage",
            owner=owner,
            uri=redact_url(uri),
            storage=redact_url(base),
            hint="a result rewritten in Redis, or a worker on another COSYQ_STORAGE_URL",
        )
        raise missing
    if not owns_key(owner, key):
        log.warning("stored_uri_not_owned", owner=owner, uri=redact_url(uri))
        raise missing


def _open(
    context: FrontContext, uri: str, job: SynthesisResult | None = None
) -> tuple[Iterator[bytes], int]:
    """The object's chunks and size. With `job`, the object must still be that job's audio
    (`_replaced`): a later job given the same `output_key` overwrites it, and the front never
    hands one job's bytes out as another's. A file says so by its note, else by its hash
    (shared/audio_notes.py); an S3 object by its metadata."""
    parts = urlsplit(uri)
    if parts.scheme == "file":
        path = Path(unquote(parts.path))
        try:
            file = path.open("rb")
        except FileNotFoundError as e:
            raise ObjectNotFoundError(f"{uri}: no such file") from e
        except OSError as e:
            raise StorageError(f"cannot read {uri}: {e.strerror or e}") from e
        size = os.fstat(file.fileno()).st_size
        # the open file's own: a write meanwhile renames a new file over the path
        if job is not None and not holds_audio(path, file, job.sha256):
            file.close()
            raise _replaced(job)

        def chunks() -> Iterator[bytes]:
            with file:
                while block := file.read(CHUNK_BYTES):
                    yield block

        return chunks(), size
    body, size, metadata = context.s3.open(parts.netloc, parts.path.lstrip("/"), uri)
    writer = metadata.get(JOB_ID_METADATA)  # absent: an object from before the metadata
    if job is not None and writer is not None and writer != job.job_id:
        body.close()
        raise _replaced(job)

    def s3_chunks() -> Iterator[bytes]:
        try:
            yield from body.iter_chunks(CHUNK_BYTES)
        finally:
            body.close()

    return s3_chunks(), size


def _replaced(job: SynthesisResult) -> ObjectNotFoundError:
    log.warning("stored_audio_replaced", job_id=job.job_id, uri=redact_url(job.uri))
    return ObjectNotFoundError(
        f"{job.uri} now holds another job's audio: a later job wrote the same output_key"
    )


async def audio_response(
    context: FrontContext, result: SynthesisResult, owner: str | None
) -> StreamingResponse:
    """A job's audio; `owner` is the job's tenant (its meta's, not the result's own field)."""
    check_owned(context, result.uri, owner, job_not_found(result.job_id))
    try:
        chunks, size = await run_in_threadpool(_open, context, result.uri, result)
    except ObjectNotFoundError as e:
        raise ApiError(
            404,
            f"job {result.job_id}: its audio is gone from storage ({e})",
            code="audio_not_found",
        ) from e
    headers = {"Content-Length": str(size), "X-Cosyq-Job-Id": result.job_id}
    return StreamingResponse(chunks, media_type=CONTENT_TYPES[result.format], headers=headers)


async def stored_response(
    context: FrontContext,
    uri: str,
    media_type: str,
    headers: dict[str, str],
    what: str,
    *,
    owner: str | None,
) -> StreamingResponse:
    """A document's audio or captions, in chunks; `owner` is the document's (its plan's)
    tenant, `what` its id."""
    check_owned(context, uri, owner, document_not_found(what))
    try:
        chunks, size = await run_in_threadpool(_open, context, uri)
    except ObjectNotFoundError as e:
        raise ApiError(404, f"{what}: gone from storage ({e})", code="audio_not_found") from e
    return StreamingResponse(
        chunks, media_type=media_type, headers={"Content-Length": str(size), **headers}
    )


def job_not_found(job_id: str) -> JobNotFoundError:
    """What an unknown job answers (producer/http/jobs.py check_owner says the same)."""
    return JobNotFoundError(f"no job {job_id} (never submitted, or expired)")


def document_not_found(document_id: str) -> ApiError:
    """What an unknown document answers (producer/http/documents.py check_document_owner)."""
    return ApiError(404, str(not_found(document_id)), code="document_not_found")
