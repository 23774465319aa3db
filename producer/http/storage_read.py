"""GET /v1/jobs/{id}/audio: a stored result relayed in chunks, from a folder or from S3.

Only URIs under the configured storage (COSYQ_STORAGE_URL) are read: a result names where its
worker wrote, and the front never reads anywhere else, whatever a Redis entry says.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from producer.http.context import FrontContext
from producer.http.errors import SERVER_ERROR, ApiError
from shared.audio import CONTENT_TYPES
from shared.errors import ObjectNotFoundError, StorageError
from shared.results import SynthesisResult

CHUNK_BYTES = 64 * 1024


def check_under_storage(context: FrontContext, uri: str) -> None:
    base = context.storage.base_uri.rstrip("/") + "/"
    if not uri.startswith(base) or "/../" in uri or "/./" in uri:
        raise ApiError(
            500,
            "the result's audio is not under COSYQ_STORAGE_URL (a different storage?)",
            type_=SERVER_ERROR,
            code="storage_mismatch",
        )


def _open(context: FrontContext, uri: str) -> tuple[Iterator[bytes], int]:
    parts = urlsplit(uri)
    if parts.scheme == "file":
        path = Path(unquote(parts.path))
        try:
            file = path.open("rb")
        except FileNotFoundError as e:
            raise ObjectNotFoundError(f"{uri}: no such file") from e
        except OSError as e:
            raise StorageError(f"cannot read {uri}: {e.strerror or e}") from e
        size = path.stat().st_size

        def chunks() -> Iterator[bytes]:
            with file:
                while block := file.read(CHUNK_BYTES):
                    yield block

        return chunks(), size
    body, size = context.s3.open(parts.netloc, parts.path.lstrip("/"), uri)

    def s3_chunks() -> Iterator[bytes]:
        try:
            yield from body.iter_chunks(CHUNK_BYTES)
        finally:
            body.close()

    return s3_chunks(), size


async def audio_response(context: FrontContext, result: SynthesisResult) -> StreamingResponse:
    check_under_storage(context, result.uri)
    try:
        chunks, size = await run_in_threadpool(_open, context, result.uri)
    except ObjectNotFoundError as e:
        raise ApiError(
            404,
            f"job {result.job_id}: its audio is gone from storage ({e})",
            code="audio_not_found",
        ) from e
    headers = {"Content-Length": str(size), "X-Cosyq-Job-Id": result.job_id}
    return StreamingResponse(chunks, media_type=CONTENT_TYPES[result.format], headers=headers)


async def stored_response(
    context: FrontContext, uri: str, media_type: str, headers: dict[str, str], what: str
) -> StreamingResponse:
    """Any stored object under the storage (a document's audio or captions), in chunks."""
    check_under_storage(context, uri)
    try:
        chunks, size = await run_in_threadpool(_open, context, uri)
    except ObjectNotFoundError as e:
        raise ApiError(404, f"{what}: gone from storage ({e})", code="audio_not_found") from e
    return StreamingResponse(
        chunks, media_type=media_type, headers={"Content-Length": str(size), **headers}
    )
